"""The state store interface every backend implements.

A template-method base: ``Store`` owns expiry (on write and on read, because TTL
deletion runs late) and round-trip accounting; a backend implements four primitives:
``_read``, ``_write``, ``_create`` and ``_verify``.

Contract of ``_write``: every record in ``Writes`` is stored with its new ``version``
only if the stored version is ``version - 1`` (absent counts as 0), all records or none,
else ``ConflictError``. That makes a batch all-or-nothing across every bucket, the
account sequence and the idempotency record, and keeps zombie writers from overwriting
newer state.
"""

from __future__ import annotations

import abc
import time
from collections.abc import Callable
from dataclasses import dataclass

from handlers.state import Keys, Snapshot, Writes

DAY = 86_400


@dataclass(frozen=True, slots=True)
class Retention:
    """How long records live after their period (buckets) or event time (records)."""

    bucket_seconds: int = 35 * DAY
    """Kept this long past the end of the bucket's period (lifetime buckets never expire)."""
    event_seconds: int = 400 * DAY
    """Idempotency records (and so reversibility) last this long past the event time."""


class Store(abc.ABC):
    """Versioned records for buckets, account sequences and idempotency records."""

    max_records_per_commit: int | None = None
    """Largest ``Writes`` one atomic commit accepts; None for no limit."""

    def __init__(self, retention: Retention | None = None, clock: Callable[[], float] = time.time):
        self.retention = retention or Retention()
        self._clock = clock
        self.round_trips = 0
        """Requests sent to the server (reads and commits), for metrics and benchmarks."""

    async def load(self, keys: Keys) -> Snapshot:
        """Read the records of ``keys``; expired ones read as empty (versions kept)."""
        snapshot = await self._read(keys)
        now = int(self._clock())
        for key, bucket in snapshot.buckets.items():
            if bucket.expires_at is not None and bucket.expires_at <= now:
                snapshot.buckets[key] = type(bucket)(version=bucket.version)
        expired = [
            key
            for key, record in snapshot.events.items()
            if record.expires_at is not None and record.expires_at <= now
        ]
        for key in expired:
            snapshot.event_versions[key] = snapshot.events.pop(key).version
        return snapshot

    async def commit(self, writes: Writes) -> None:
        """Store every record of ``writes`` atomically, or raise ``ConflictError``."""
        if not writes:
            return
        now = int(self._clock())
        for bucket in writes.buckets.values():
            bucket.expires_at = (
                None
                if bucket.period_end is None
                else max(bucket.period_end, now) + self.retention.bucket_seconds
            )
        for record in writes.events.values():
            record.expires_at = max(record.occurred, now) + self.retention.event_seconds
        await self._write(writes)

    async def init(self) -> None:
        """Create tables, collections and indexes; safe to run again."""
        await self._create()

    async def check(self) -> None:
        """Raise ``StoreNotInitialized`` unless ``init`` has been run on this store."""
        await self._verify()

    async def close(self) -> None:  # noqa: B027 - optional hook, most backends need it
        """Release connections."""

    @abc.abstractmethod
    async def _read(self, keys: Keys) -> Snapshot:
        """Fetch the stored records of ``keys`` (absent keys left out), as fresh copies."""

    @abc.abstractmethod
    async def _write(self, writes: Writes) -> None:
        """Conditional all-or-nothing write; see the module docstring."""

    @abc.abstractmethod
    async def _create(self) -> None:
        """Create whatever the backend needs; idempotent."""

    @abc.abstractmethod
    async def _verify(self) -> None:
        """Raise ``StoreNotInitialized`` when ``_create`` has not been run."""
