# frozen_string_literal: true

require "zlib"

# A minimal PNG reader for screenshot checks: 8-bit RGB or RGBA, not
# interlaced (what headless Chromium writes). Returns width, height and a
# pixel lookup.
class PNGImage
  SIGNATURE = "\x89PNG\r\n\x1a\n".b

  attr_reader :width, :height

  def initialize(bytes)
    bytes = bytes.b
    raise ArgumentError, "not a PNG" unless bytes.start_with?(SIGNATURE)

    idat = +"".b
    pos = 8
    while pos < bytes.bytesize
      len, type = bytes.byteslice(pos, 8).unpack("Na4")
      data = bytes.byteslice(pos + 8, len)
      case type
      when "IHDR"
        @width, @height, depth, @color, _c, _f, interlace = data.unpack("NNCCCCC")
        raise ArgumentError, "only 8-bit RGB/RGBA, not interlaced" unless depth == 8 && [2, 6].include?(@color) && interlace.zero?
      when "IDAT" then idat << data
      when "IEND" then break
      end
      pos += 12 + len
    end
    @bpp = @color == 6 ? 4 : 3
    @rows = unfilter(Zlib::Inflate.inflate(idat))
  end

  # [r, g, b] at (x, y).
  def rgb(x, y)
    @rows[y].byteslice(x * @bpp, 3).bytes
  end

  # How many pixels in the rectangle have each colour (packed 0xRRGGBB).
  def histogram(x0, y0, x1, y1)
    counts = Hash.new(0)
    (y0...[y1, @height].min).each do |y|
      row = @rows[y]
      (x0...[x1, @width].min).each do |x|
        r, g, b = row.getbyte(x * @bpp), row.getbyte((x * @bpp) + 1), row.getbyte((x * @bpp) + 2)
        counts[(r << 16) | (g << 8) | b] += 1
      end
    end
    counts
  end

  private

  def unfilter(raw)
    stride = @width * @bpp
    prev = "\0".b * stride
    Array.new(@height) do |y|
      filter = raw.getbyte(y * (stride + 1))
      line = raw.byteslice((y * (stride + 1)) + 1, stride).bytes
      up = prev.bytes
      line.each_index do |i|
        a = i >= @bpp ? line[i - @bpp] : 0
        b = up[i]
        c = i >= @bpp ? up[i - @bpp] : 0
        line[i] = (line[i] + case filter
                             when 0 then 0
                             when 1 then a
                             when 2 then b
                             when 3 then (a + b) / 2
                             when 4 then paeth(a, b, c)
                             else raise ArgumentError, "bad PNG filter #{filter}"
                             end) & 0xff
      end
      prev = line.pack("C*")
    end
  end

  def paeth(a, b, c)
    p = a + b - c
    pa = (p - a).abs
    pb = (p - b).abs
    pc = (p - c).abs
    if pa <= pb && pa <= pc then a
    elsif pb <= pc then b
    else c
    end
  end
end
