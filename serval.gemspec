# frozen_string_literal: true

require_relative "lib/serval/version"

Gem::Specification.new do |spec|
  spec.name = "serval"
  spec.version = Serval::VERSION
  spec.authors = ["Serval developers"]
  spec.summary = "A Rack application server with a native I/O core that measures its concurrency and advises on it"
  spec.description = "Serval serves Rack apps over HTTP/1.1 with processes x threads like Puma, " \
                     "but does accept/read/parse/write in a C event loop that never holds the GVL."
  spec.license = "MIT"
  spec.required_ruby_version = ">= 3.1", "< 3.5"

  spec.files = Dir["lib/**/*.rb", "ext/**/*.{c,h,rb}", "exe/*", "README.md", "LICENSE", "docs/*.md", "CHANGELOG.md"]
  spec.bindir = "exe"
  spec.executables = ["serval", "servalctl"]
  spec.require_paths = ["lib"]
  spec.extensions = ["ext/serval/extconf.rb"]

  spec.add_dependency "rack", ">= 2.2", "< 4"
end
