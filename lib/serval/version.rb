# frozen_string_literal: true

module Serval
  VERSION = "0.1.0"
end
