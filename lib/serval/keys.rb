# frozen_string_literal: true

module Serval
  # Hashes that arrive as JSON (a saved window, a worker's answer) have
  # String keys; the code reads Symbols.
  module Keys
    module_function

    # obj with every Hash key, at any depth, a Symbol.
    def symbolize(obj)
      case obj
      when Hash then obj.to_h { |k, v| [k.to_sym, symbolize(v)] }
      when Array then obj.map { |v| symbolize(v) }
      else obj
      end
    end
  end
end
