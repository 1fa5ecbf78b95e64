"""Types of the memory store's compiled read and write (``_fastmemory.pyx``), for mypy."""

from collections.abc import Callable
from typing import Any

from handlers.state import Bucket, EventRecord, Keys, Snapshot, Writes
from stores.base import Expected

def slot_fields() -> dict[str, bool]: ...
def pack_bucket(b: Bucket) -> bytes: ...
def unpack_bucket(packed: bytes) -> Bucket: ...
def write(
    buckets: dict[str, bytes],
    accounts: dict[str, Any],
    events: dict[str, bytes],
    writes: Writes,
    expected: Expected,
    encode: Callable[[Any], bytes],
    codec_for: Callable[[], Any],
) -> None: ...
def read(
    buckets: dict[str, bytes],
    accounts: dict[str, Any],
    events: dict[str, bytes],
    keys: Keys,
    unpack: Callable[[bytes], EventRecord] | None,
) -> Snapshot: ...
