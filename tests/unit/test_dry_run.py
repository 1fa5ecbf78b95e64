"""``replay --dry-run``'s store: a batch's read costs in proportion to its own keys."""

from __future__ import annotations

from typing import Any, NoReturn

from handlers.state import Account, Bucket, Keys, Snapshot
from stores.dry_run import DryRunStore
from stores.memory import MemoryStore


class _NotGoneThrough(dict[str, Any]):
    """What a dry run kept: it may be looked up by key, never gone through whole."""

    def _whole(self, *_: object) -> NoReturn:
        raise AssertionError("went through every record the dry run kept")

    keys = values = items = __iter__ = _whole


async def test_a_read_looks_up_its_own_keys_not_every_record_kept() -> None:
    # ``keys - kept.keys()`` went through all that the run had committed, at every
    # batch: a dry run of N events took time in N squared (a batch's read took 13 ms
    # with 250,000 records kept, 100 ms with 2,000,000)
    store = DryRunStore(MemoryStore())
    kept = Snapshot(
        _NotGoneThrough({f"r|2026|a{n}": Bucket(n, n, 1) for n in range(1_000)}),
        _NotGoneThrough({f"a{n}": Account(n, 1) for n in range(1_000)}),
        _NotGoneThrough(),
    )
    store.kept = kept
    keys = Keys({"r|2026|a7", "r|2026|b1"}, {"a3", "b2"}, {"e1"})
    snapshot = await store.load(keys)
    assert snapshot.buckets == {"r|2026|a7": Bucket(7, 7, 1)}
    assert snapshot.buckets["r|2026|a7"] is not kept.buckets["r|2026|a7"]  # a copy
    assert snapshot.accounts == {"a3": Account(3, 1)}
    assert snapshot.events == {}
