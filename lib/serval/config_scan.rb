# frozen_string_literal: true

require "ripper"

module Serval
  # Reads what servalctl needs from a config file WITHOUT running it: the
  # file is parsed (Ripper), never evaluated, and only the literal string
  # arguments of these calls are taken:
  #
  #   activate_control_app "unix://tmp/ctl.sock", auth_token: "s3cret"
  #   control_url "tcp://127.0.0.1:9293"
  #   control_auth_token "s3cret"
  #   state_path "tmp/pids/serval.state"
  #
  # A config file may load the whole app (`require_relative "environment"`),
  # so running it to find the server would boot the app. A value that is not
  # a plain literal ("#{...}", ENV.fetch(...), a variable), a call made under
  # a condition, in a block or in a method cannot be known without running
  # the file: it is reported in #unreadable instead. Calls are taken in the
  # file's order, a later one replacing an earlier one's value, as when the
  # file runs. Calls with a receiver (`self.control_url ...`) are not seen.
  #
  #   scan = Serval::ConfigScan.new("config/puma.rb")
  #   scan.values     # => {control_url: "unix://tmp/ctl.sock", control_auth_token: "s3cret"}
  #   scan.unreadable # => {state_path: "line 7: `state_path` is not given a literal string"}
  class ConfigScan
    KEYS = %i[control_url control_auth_token state_path].freeze
    # Nodes whose body may or may not run, or runs later or elsewhere.
    CONDITIONAL = %i[if unless if_mod unless_mod elsif else case in when ifop while until while_mod until_mod
                     for rescue rescue_mod ensure def defs brace_block do_block lambda].freeze
    SHORT_CIRCUIT = %i[&& || and or].freeze

    attr_reader :path, :values, :unreadable

    # Raises SystemCallError when the file cannot be read.
    def initialize(path)
      @path = path
      @values = {}
      @unreadable = {}
      sexp = Ripper.sexp(File.read(path))
      return unreadable!(KEYS, "the file does not parse as Ruby") unless sexp

      walk(sexp, false)
    end

    private

    # replace: an unconditional call (the file's value is this one's) rather
    # than a conditional one (the first reason found is kept).
    def unreadable!(keys, why, replace: false)
      Array(keys).each do |key|
        @values.delete(key)
        replace ? @unreadable[key] = why : @unreadable[key] ||= why
      end
      nil
    end

    def walk(node, conditional)
      return unless node.is_a?(Array)

      call = call_of(node)
      return record(*call, conditional) if call

      conditional ||= CONDITIONAL.include?(node[0]) || (node[0] == :binary && SHORT_CIRCUIT.include?(node[2]))
      node.each { |child| walk(child, conditional) }
    end

    # [name, args, line] for a receiver-less call of one of ours, else nil.
    def call_of(node)
      ident, args =
        case node[0]
        when :command then [node[1], node[2]]                                    # name "x"
        when :method_add_arg then node[1][0] == :fcall ? [node[1][1], node[2]] : nil # name("x")
        when :vcall then [node[1], nil]                                          # name
        end
      return nil unless ident.is_a?(Array) && ident[0] == :@ident
      return nil unless %w[activate_control_app control_url control_auth_token state_path].include?(ident[1])

      [ident[1], arg_list(args), ident[2][0]]
    end

    def arg_list(args)
      args = args[1] if args.is_a?(Array) && args[0] == :arg_paren
      args = args[1] if args.is_a?(Array) && args[0] == :args_add_block
      args.is_a?(Array) ? args : []
    end

    def record(name, args, line, conditional)
      keys = name == "activate_control_app" ? %i[control_url control_auth_token] : [name.to_sym]
      return unreadable!(keys, "line #{line}: `#{name}` is called under a condition or in a block") if conditional

      if name == "activate_control_app"
        hash = args.find { |a| a.is_a?(Array) && %i[bare_assoc_hash hash].include?(a[0]) }
        pairs = hash && (hash[0] == :hash ? Array(hash.dig(1, 1)) : hash[1])
        token = pairs&.find { |pair| pair[0] == :assoc_new && label(pair[1]) == "auth_token" }
        set(:control_url, args.first == hash ? :missing : args.first, line, name)
        set(:control_auth_token, token[2], line, "activate_control_app auth_token:") if token
        unreadable!(:control_auth_token, "line #{line}: activate_control_app's options are not literal") if
          hash.nil? && args.size > 1
      else
        set(keys.first, args.size == 1 ? args.first : :missing, line, name)
      end
    end

    def label(node)
      case node[0]
      when :@label then node[1].delete_suffix(":")
      when :symbol_literal then node.dig(1, 1, 1)
      end
    end

    # As the file would run: a later call replaces an earlier one's value.
    def set(key, node, line, what)
      value = literal(node)
      return unreadable!(key, "line #{line}: `#{what}` is not given a literal string", replace: true) unless value

      @unreadable.delete(key)
      @values[key] = value
    end

    # The String of a string literal without interpolation, else nil.
    def literal(node)
      return nil unless node.is_a?(Array) && node[0] == :string_literal && node[1].is_a?(Array)

      parts = node[1][1..]
      return nil unless parts.all? { |p| p.is_a?(Array) && p[0] == :@tstring_content && !p[1].include?("\\") }

      parts.map { |p| p[1] }.join
    end
  end
end
