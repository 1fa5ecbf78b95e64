"""In-process store: the reference backend, and the fastest for a one-off replay."""

from __future__ import annotations

import time
from collections.abc import Callable

from handlers.state import Account, Bucket, EventRecord, Keys, Snapshot, Writes
from limitflow.errors import ConflictError
from stores.base import Expected, Retention, Store


class MemoryStore(Store):
    """Dicts of records. Lost when the process ends."""

    def __init__(
        self, retention: Retention | None = None, clock: Callable[[], float] = time.time
    ) -> None:
        super().__init__(retention, clock)
        self.buckets: dict[str, Bucket] = {}
        self.accounts: dict[str, Account] = {}
        self.events: dict[str, EventRecord] = {}

    async def _read(self, keys: Keys) -> Snapshot:
        self.round_trips += 1
        snapshot = Snapshot()
        for key in keys.buckets:
            if (bucket := self.buckets.get(key)) is not None:
                snapshot.buckets[key] = bucket.copy()
        for key in keys.accounts:
            if (account := self.accounts.get(key)) is not None:
                snapshot.accounts[key] = account.copy()
        for key in keys.events:
            if (record := self.events.get(key)) is not None:
                snapshot.events[key] = record.copy()
        return snapshot

    async def _write(self, writes: Writes, expected: Expected) -> None:
        self.round_trips += 1
        # check everything before changing anything: all or nothing
        for key, account in writes.accounts.items():
            _check(key, self.accounts.get(key), account.version)
        for key, bucket in writes.buckets.items():
            _check(key, self.buckets.get(key), bucket.version, expected.buckets[key])
        for key, record in writes.events.items():
            _check(key, self.events.get(key), record.version, expected.events[key])
        # copies: the caller keeps changing its records after the commit
        for key, bucket in writes.buckets.items():
            self.buckets[key] = bucket.copy()
        for key, account in writes.accounts.items():
            self.accounts[key] = account.copy()
        for key, record in writes.events.items():
            self.events[key] = record.copy()

    async def _create(self) -> None:
        return None

    async def _verify(self) -> None:
        return None


def _check(
    key: str,
    stored: Bucket | Account | EventRecord | None,
    version: int,
    expires_at: int | None = None,
) -> None:
    """Raise ``ConflictError`` unless ``stored`` is the record a write of ``version``
    replaces: none for version 1, else version - 1 with the expiry read."""
    if stored is None:
        if version == 1:
            return
    elif stored.version == version - 1 and (
        isinstance(stored, Account) or stored.expires_at == expires_at
    ):
        return
    raise ConflictError(f"{key!r} changed since it was read")
