"""Decodes a PNG written by redco::io::write_png with the standard library
alone (struct, zlib: chunk CRCs checked, filter 0 rows) and, when Pillow is
installed, with Pillow too; prints "<width> <height> <channels> <sum of bytes>
<bytes as hex>" for tests/test_png.cpp to compare with what it wrote.

    python tests/python/read_png.py FILE.png
"""

import struct
import sys
import zlib


def decode(path):
    data = open(path, "rb").read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "bad signature"
    pos, idat, header = 8, b"", None
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos:pos + 4])
        kind = data[pos + 4:pos + 8]
        body = data[pos + 8:pos + 8 + length]
        (crc,) = struct.unpack(">I", data[pos + 8 + length:pos + 12 + length])
        assert zlib.crc32(kind + body) & 0xFFFFFFFF == crc, f"bad CRC in {kind}"
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    width, height, depth, color, _, _, interlace = header
    assert depth == 8 and color in (0, 2) and interlace == 0, header
    channels = 1 if color == 0 else 3
    raw = zlib.decompress(idat)
    row = width * channels
    pixels = b""
    for y in range(height):
        assert raw[y * (row + 1)] == 0, "unexpected filter"
        pixels += raw[y * (row + 1) + 1:(y + 1) * (row + 1)]
    return width, height, channels, pixels


def main():
    width, height, channels, pixels = decode(sys.argv[1])
    try:
        from PIL import Image
    except ImportError:
        Image = None
    if Image is not None:
        img = Image.open(sys.argv[1])
        assert img.size == (width, height) and img.mode == ("L" if channels == 1 else "RGB")
        assert img.tobytes() == pixels, "Pillow decodes other pixels"
    print(width, height, channels, sum(pixels), pixels.hex())


if __name__ == "__main__":
    main()
