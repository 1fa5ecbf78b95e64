"""Types of the sqlite store's compiled row building (``_fastsqlite.pyx``), for mypy."""

from collections.abc import Callable, Iterable
from typing import Any

from handlers.state import Account, Bucket, EventRecord

def slot_fields() -> dict[str, bool]: ...
def rows(
    buckets: dict[str, Bucket],
    accounts: dict[str, Account],
    events: dict[str, EventRecord],
    expected_buckets: dict[str, int | None],
    expected_events: dict[str, int | None],
    pack: Callable[[bytes], bytes],
    json_text: Callable[[tuple[str, ...] | tuple[int, ...]], str],
) -> Any: ...
def buckets_into(found: Iterable[tuple[Any, ...]], out: dict[str, Bucket]) -> None: ...
def event_row_ok(row: tuple[Any, ...]) -> bool: ...
