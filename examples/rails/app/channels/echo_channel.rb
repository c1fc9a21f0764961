# Action Cable round trip: a client's "speak" is broadcast back to the
# channel's stream (the async adapter: within one process).
class EchoChannel < ApplicationCable::Channel
  def subscribed
    stream_from "echo"
  end

  def speak(data)
    ActionCable.server.broadcast("echo", { "text" => data["text"], "pid" => Process.pid })
  end
end
