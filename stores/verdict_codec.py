"""How the stores that persist verdicts keep them: zstd-compressed, ~38% of the JSON.

A verdict explains every applicable rule, so its field names and rule ids repeat; it
is most of an idempotency record. Compressed, a record of the sample rules fits in one
DynamoDB write unit (1 KB) instead of two, and a sqlite file grows 0.9 KB per event
instead of 1.6 KB. Records written before compression hold the JSON itself, which
starts with ``{``, never with zstd's magic number, so both read back.
"""

from __future__ import annotations

from typing import Final

import zstandard

_compress: Final = zstandard.ZstdCompressor(level=1, write_checksum=False).compress
_decompress: Final = zstandard.ZstdDecompressor().decompress
_ZSTD_MAGIC: Final = b"\x28\xb5\x2f\xfd"


def pack_verdict(verdict: bytes) -> bytes:
    """The verdict as stored (the frame records its size, for ``unpack_verdict``)."""
    return _compress(verdict)


def unpack_verdict(stored: bytes) -> bytes:
    """The published verdict bytes of a stored one, compressed or not."""
    data = bytes(stored)
    return _decompress(data) if data[:4] == _ZSTD_MAGIC else data
