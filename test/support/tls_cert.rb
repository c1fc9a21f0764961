# frozen_string_literal: true

require "openssl"

module Serval
  # A self-signed certificate for localhost / 127.0.0.1 (also a CA, so a
  # client can verify against it), written as cert.pem and key.pem in dir.
  module TLSCert
    module_function

    # Returns [cert_path, key_path].
    def write(dir)
      key = OpenSSL::PKey::RSA.new(2048)
      cert = OpenSSL::X509::Certificate.new
      cert.version = 2
      cert.serial = 1
      cert.subject = cert.issuer = OpenSSL::X509::Name.parse("/CN=localhost")
      cert.public_key = key.public_key
      cert.not_before = Time.now - 60
      cert.not_after = Time.now + 3600
      ext = OpenSSL::X509::ExtensionFactory.new(cert, cert)
      cert.add_extension(ext.create_extension("subjectAltName", "DNS:localhost,IP:127.0.0.1"))
      cert.add_extension(ext.create_extension("basicConstraints", "CA:TRUE", true))
      cert.sign(key, OpenSSL::Digest.new("SHA256"))
      File.write(File.join(dir, "cert.pem"), cert.to_pem)
      File.write(File.join(dir, "key.pem"), key.to_pem)
      [File.join(dir, "cert.pem"), File.join(dir, "key.pem")]
    end
  end
end
