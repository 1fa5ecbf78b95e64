"""A store that decides against another's records and writes nothing to it, for
``limitflow replay --dry-run``: the verdicts events would get now, on a production
store, with its counters, sequences and idempotency records left as they are.

Reads come from the store underneath. What a commit writes is kept here, in this
process's memory, on top of it: later batches of the same dry run see what the earlier
ones decided, as a real replay's would. Nothing reaches the store underneath: not a
counter, not an idempotency record, not a rule's meaning.
"""

from __future__ import annotations

from handlers.state import Keys, Snapshot, Writes
from stores.base import Expected, Store


class DryRunStore(Store):
    """``store``'s records, with this run's commits on top, in memory only."""

    def __init__(self, store: Store) -> None:
        super().__init__(store.retention, store._clock)
        self.store = store
        self.max_records_per_commit = store.max_records_per_commit
        self.replay_batch_size = store.replay_batch_size
        self.kept = Snapshot()
        """What this dry run committed (copies), by key."""

    async def _read(self, keys: Keys) -> Snapshot:
        # each of the batch's keys looked up in what is kept, not what is kept gone
        # through: ``set - dict.keys()`` iterates the whole dict, so every batch's read
        # took time in proportion to all the run had committed before it (a dry run of
        # N events took time in N squared: 100 ms a batch at 2,000,000 records kept)
        kept = self.kept
        buckets = [k for k in keys.buckets if k in kept.buckets]
        accounts = [k for k in keys.accounts if k in kept.accounts]
        events = [k for k in keys.events if k in kept.events]
        below = Keys(
            keys.buckets.difference(buckets),
            keys.accounts.difference(accounts),
            keys.events.difference(events),
        )
        snapshot = await self.store._read(below) if below else Snapshot()
        self.round_trips = self.store.round_trips
        for key in buckets:
            snapshot.buckets[key] = kept.buckets[key].copy()
        for key in accounts:
            snapshot.accounts[key] = kept.accounts[key].copy()
        for key in events:
            snapshot.events[key] = kept.events[key].copy()
        return snapshot

    async def _write(self, writes: Writes, expected: Expected) -> None:
        # this process is the only writer of what it keeps: nothing to check
        kept = self.kept
        kept.buckets.update((key, b.copy()) for key, b in writes.buckets.items())
        kept.accounts.update((key, a.copy()) for key, a in writes.accounts.items())
        kept.events.update((key, r.copy()) for key, r in writes.events.items())

    async def _create(self) -> None:
        raise AssertionError("a dry run creates nothing")

    async def _verify(self) -> None:
        await self.store.check()

    async def _read_meanings(self, keys: list[str]) -> dict[str, str]:
        return await self.store._read_meanings(keys)

    async def _add_meanings(self, meanings: dict[str, str]) -> None:
        raise AssertionError("a dry run keeps no rule's meaning")

    async def _forget_meanings(self, keys: list[str]) -> int:
        raise AssertionError("a dry run forgets no rule's meaning")

    async def _has_live_counters(self, prefix: str, now: int) -> bool:
        return await self.store._has_live_counters(prefix, now)

    async def close(self) -> None:
        await self.store.close()
