# frozen_string_literal: true

module Serval
  module Auto
    # A window's samples (and route samples) for the model child, packed
    # by column: Marshal writes a Float as text (about 0.4 us each), so a
    # window at its cap (Timing::Window::CAP samples of 8 figures and a
    # shape) took 10 ms or more to dump on the supervising loop; packed
    # binary doubles take a fraction of that. ModelProcess#submit packs,
    # the child (model_child.rb) unpacks: the same Hashes, keys in the order
    # first seen, missing keys still missing.
    module SampleTable
      KEYS = %i[samples route_samples].freeze

      # A column: :float (doubles, 0.0 where missing), :floats (an Array of
      # Floats per row: lengths and the doubles), :strings (the distinct
      # ones, and each row's index in `lengths`) or :any (the values).
      Column = Struct.new(:key, :kind, :data, :lengths, :present)
      Table = Struct.new(:size, :columns)

      module_function

      # The window with its sample lists packed (a new Hash; the window is
      # not changed). Lists that are not Arrays of Hashes stay as they are.
      def pack(window)
        return window unless window.is_a?(Hash)

        packed = nil
        KEYS.each do |key|
          rows = window[key]
          next unless rows.is_a?(Array) && !rows.empty? && rows.all?(Hash)

          (packed ||= window.dup)[key] = table(rows)
        end
        packed || window
      end

      # The window as it was before #pack.
      def unpack(window)
        return window unless window.is_a?(Hash) && KEYS.any? { |k| window[k].is_a?(Table) }

        window.to_h { |k, v| [k, v.is_a?(Table) ? rows(v) : v] }
      end

      def table(rows)
        first = rows.first.keys
        # every row has the same keys in the same order: the usual case, read
        # column by column without an Array per row (a window's 3,072 rows
        # are read in a serving process, whose heap pays for each object)
        if rows.all? { |r| same_keys?(r, first) }
          return Table.new(rows.size, first.map { |k| column(k, rows.map { |r| r[k] }, nil) })
        end
        lists = rows.map(&:keys).uniq
        Table.new(rows.size, lists.flatten.uniq.map do |k|
          flags = rows.all? { |r| r.key?(k) } ? nil : rows.map { |r| r.key?(k) }
          column(k, rows.map { |r| r[k] }, flags)
        end)
      end

      def same_keys?(row, keys)
        return false unless row.size == keys.size

        i = -1
        row.each_key { |k| return false unless keys[i += 1].equal?(k) }
        true
      end

      # A column of values (flags: which rows have the key; nil: all).
      def column(key, values, flags)
        kept = flags ? values.select.with_index { |_, i| flags[i] } : values
        present = flags&.map { |f| f ? 1 : 0 }&.pack("C*")
        if kept.all?(Float)
          Column.new(key, :float, (flags ? values.map { |v| v || 0.0 } : values).pack("E*"), nil, present)
        elsif kept.all?(Array) && (flat = kept.flatten(1)).all?(Float)
          lengths = flags ? values.map { |v| v ? v.size : 0 } : values.map(&:size)
          Column.new(key, :floats, flat.pack("E*"), lengths.pack("N*"), present)
        elsif kept.all?(String) && (names = kept.uniq).size <= 0xffff
          index = names.each_with_index.to_h
          Column.new(key, :strings, names, values.map { |v| v ? index.fetch(v) : 0 }.pack("n*"), present)
        else
          Column.new(key, :any, values, nil, present)
        end
      end

      def rows(table)
        rows = Array.new(table.size) { {} }
        table.columns.each do |c|
          values = case c.kind
                   when :float then c.data.unpack("E*")
                   when :floats
                     flat = c.data.unpack("E*")
                     at = 0
                     c.lengths.unpack("N*").map { |n| flat[at, n].tap { at += n } }
                   when :strings then c.lengths.unpack("n*").map { |i| c.data[i] }
                   else c.data
                   end
          present = c.present&.unpack("C*")
          rows.each_with_index { |r, i| r[c.key] = values[i] if present.nil? || present[i] == 1 }
        end
        rows
      end
    end
  end
end
