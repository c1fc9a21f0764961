# frozen_string_literal: true

module Serval
  # Every error Serval raises is a Serval::Error.
  class Error < StandardError; end

  # A configuration value is wrong; raised at boot, the message names the option.
  class ConfigError < Error; end

  # The peer went away or stopped reading: the response cannot be completed.
  # Raised by the native core from Request#write / #finish; never a 5xx, the
  # connection is simply closed.
  class ConnectionError < Error; end

  # The client did not read its response within write_timeout.
  class WriteTimeout < ConnectionError; end

  # The application returned something the HTTP/1.1 wire cannot carry
  # (an invalid status, a header name that is not a token, CR/LF in a value).
  # Answered with a 500 when nothing was sent yet.
  class BadResponse < Error; end

  # The `threads :auto` model's child process failed (did not start, died,
  # answered nothing in time); the tuner runs the model in-process instead.
  class ModelProcessError < Error; end

  # The child gave no answer in time: at its idle priority the CPU was busy
  # throughout. Running the model in the serving process then would take the
  # GVL from requests exactly when they need it: callers skip the run.
  class ModelProcessTimeout < ModelProcessError; end
end
