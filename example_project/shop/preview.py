"""A dependency-free stand-in for an imaging library: draws a small PNG preview.

A real shop would resize the photo with Pillow. To keep the example free of compiled
dependencies, the preview is an identicon drawn from the file's SHA-256: the same
upload always gives the same picture.
"""

from __future__ import annotations

import struct
import zlib

GRID = 5


def identicon_png(digest: bytes, *, size: int = 64) -> bytes:
    """Return a ``size`` x ``size`` PNG: a symmetric 5x5 pattern coloured by ``digest``."""
    if len(digest) < 16:
        raise ValueError("digest must have at least 16 bytes")
    colour = bytes((digest[0] // 2 + 64, digest[1] // 2 + 64, digest[2] // 2 + 64))
    background = b"\xf4\xf4\xf4"
    cells = [[False] * GRID for _ in range(GRID)]
    for row in range(GRID):
        for column in range((GRID + 1) // 2):
            on = bool(digest[3 + row * 3 + column] & 1)
            cells[row][column] = cells[row][GRID - 1 - column] = on
    cell = size // (GRID + 1)
    margin = (size - cell * GRID) // 2
    rows = []
    for y in range(size):
        pixels = bytearray()
        for x in range(size):
            inside = margin <= x < margin + cell * GRID and margin <= y < margin + cell * GRID
            on = inside and cells[(y - margin) // cell][(x - margin) // cell]
            pixels += colour if on else background
        rows.append(bytes(pixels))
    return _png(size, size, rows)


def _png(width: int, height: int, rows: list[bytes]) -> bytes:
    def chunk(tag: bytes, data: bytes) -> bytes:
        checksum = zlib.crc32(tag + data) & 0xFFFFFFFF
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", checksum)

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)  # 8-bit RGB
    scanlines = b"".join(b"\x00" + row for row in rows)  # filter type 0 on every line
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(scanlines, 9))
        + chunk(b"IEND", b"")
    )


def sample_ppm(width: int = 32, height: int = 24, *, seed: int = 0) -> bytes:
    """Return a small colour-gradient PPM image, used as a demo upload."""
    body = bytearray()
    for y in range(height):
        for x in range(width):
            body += bytes(((x * 8 + seed) % 256, (y * 10) % 256, (seed * 37) % 256))
    return f"P6 {width} {height} 255\n".encode() + bytes(body)
