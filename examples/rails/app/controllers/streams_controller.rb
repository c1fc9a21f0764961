# ActionController::Live: writes `count` chunks `interval` seconds apart; each
# should reach the client when written, not when the action ends.
class StreamsController < ApplicationController
  include ActionController::Live

  def show
    count = params.fetch(:count, 4).to_i.clamp(1, 50)
    interval = params.fetch(:interval, 0.3).to_f.clamp(0.0, 5.0)
    response.headers["Content-Type"] = "text/plain; charset=utf-8"
    count.times do |i|
      sleep interval if i.positive?
      response.stream.write("chunk #{i} at #{Time.now.utc.iso8601(3)}\n")
    end
  ensure
    response.stream.close
  end
end
