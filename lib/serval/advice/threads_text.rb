# frozen_string_literal: true

module Serval
  module Advice
    # "3 threads (2-4)", or "3 threads" when the range is the answer
    # (Recommender#threads_range); advice with Symbol keys.
    def self.threads_text(advice)
      lo, hi = advice[:threads_range]
      text = "#{advice[:threads]} threads"
      lo && hi && lo != hi ? "#{text} (#{lo}-#{hi})" : text
    end
  end
end
