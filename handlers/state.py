"""The state the decision core reads and writes, and the working copy of one batch.

Every record carries a ``version``: a store commits a write only if the stored record
is still exactly the one that was read (``version - 1`` of the written record and, for
buckets and event records, the same ``expires_at``), so a decision made on stale state
is never committed. Version 0 means "never stored".
"""

from __future__ import annotations

from dataclasses import dataclass, field

import msgspec

from schemas.events import EventType

# Records are msgspec structs, not dataclasses: built in C (the core makes several per
# event), and with gc=False never tracked by the cycle collector, whose passes over
# millions of records cost more than deciding them. They hold only scalars, bytes and
# tuples of them, so no cycle can go through one.


class Bucket(msgspec.Struct, gc=False):
    """Count and amount of one (rule, scope values, period) counter."""

    count: int = 0
    amount: int = 0
    """Minor units of the rule's currency."""
    version: int = 0
    period_end: int | None = None
    """Upper bound of the period's end (epoch s), None for lifetime: the base of expiry."""
    expires_at: int | None = None
    """Epoch s after which the store treats the record as absent. Until a commit sets the
    new one, the stored record's as read, even if past: the commit is conditioned on it."""
    born: int = 0
    """Which life of the bucket this is: the writer's clock (epoch s) at the commit that
    created it, or created it again once the last one had expired. 0 until that commit,
    and for a bucket stored before limitflow kept it. A reversal releases a payment only
    from the life of the bucket that the payment was added to."""

    def copy(self) -> Bucket:
        """An independent copy (cheaper than ``dataclasses.replace``)."""
        return Bucket(
            self.count, self.amount, self.version, self.period_end, self.expires_at, self.born
        )


class Account(msgspec.Struct, gc=False):
    """Per-account verdict sequence. Never expires, so ``seq`` never repeats."""

    seq: int = 0
    version: int = 0

    def copy(self) -> Account:
        """An independent copy."""
        return Account(self.seq, self.version)


class EventRecord(msgspec.Struct, gc=False):
    """The idempotency record of an event that got a verdict, with that verdict."""

    fingerprint: str
    account_id: str
    type: EventType
    accepted: bool
    seq: int
    verdict: bytes
    """The verdict exactly as published; a duplicate gets these bytes again."""
    amount: int = 0
    """Minor units added to ``buckets`` (accepted payments only)."""
    currency: str | None = None
    reversed: int = 0
    """Minor units released by accepted reversals so far."""
    buckets: tuple[str, ...] = ()
    """Keys of the buckets an accepted payment was added to (an accepted reversal: that
    it released from). The record expires no earlier than they do."""
    occurred: int = 0
    """Event time, epoch s: the base of expiry."""
    version: int = 0
    expires_at: int | None = None
    """As for ``Bucket.expires_at``."""
    born: tuple[int, ...] | None = ()
    """``Bucket.born`` of each of ``buckets`` when the payment was added to it (0 or
    missing: not known, for a record stored before limitflow kept it). None until the
    commit that stores the record fills it in."""

    def copy(self) -> EventRecord:
        """An independent copy (``buckets`` is a tuple, so sharing it is safe)."""
        return EventRecord(
            self.fingerprint,
            self.account_id,
            self.type,
            self.accepted,
            self.seq,
            self.verdict,
            self.amount,
            self.currency,
            self.reversed,
            self.buckets,
            self.occurred,
            self.version,
            self.expires_at,
            self.born,
        )


@dataclass(slots=True)
class Keys:
    """What one batch needs to read."""

    buckets: set[str] = field(default_factory=set)
    accounts: set[str] = field(default_factory=set)
    events: set[str] = field(default_factory=set)

    def __bool__(self) -> bool:
        return bool(self.buckets or self.accounts or self.events)


@dataclass(slots=True)
class Snapshot:
    """Records read from a store. An event id absent from ``events`` was never stored or
    has expired; an expired bucket reads as empty, with the ``version`` and ``expires_at``
    of the stored record.

    ``expired_events`` holds the expired event records, so that a new record for the same
    id replaces exactly the expired one: its commit is conditioned on that record's
    version and expiry, which a record created again after TTL deletion never matches.
    """

    buckets: dict[str, Bucket] = field(default_factory=dict)
    accounts: dict[str, Account] = field(default_factory=dict)
    events: dict[str, EventRecord] = field(default_factory=dict)
    expired_events: dict[str, EventRecord] = field(default_factory=dict)

    def merge(self, other: Snapshot) -> None:
        """Add the records of a later read."""
        self.buckets.update(other.buckets)
        self.accounts.update(other.accounts)
        self.events.update(other.events)
        self.expired_events.update(other.expired_events)


@dataclass(slots=True)
class Writes:
    """New versions of records, to be committed all together or not at all.

    Each record's ``version`` is the new one; the store requires the stored version to be
    ``version - 1`` (0: the key must not exist) and, for buckets and event records, the
    stored ``expires_at`` to be the record's as read (``Store.commit`` then sets the new
    one). Versions restart at 1 when a record is created again after TTL deletion, so
    the version alone could match a different record than the one read; its expiry
    cannot (see ``stores.base``).
    """

    buckets: dict[str, Bucket] = field(default_factory=dict)
    accounts: dict[str, Account] = field(default_factory=dict)
    events: dict[str, EventRecord] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.buckets) + len(self.accounts) + len(self.events)


class WorkingState:
    """A batch's view of the store: the snapshot plus the changes not committed yet."""

    __slots__ = ("dirty_accounts", "dirty_buckets", "dirty_events", "snapshot")

    def __init__(self, snapshot: Snapshot) -> None:
        self.snapshot = snapshot
        self.dirty_buckets: dict[str, Bucket] = {}
        """Buckets changed since the last ``take_writes``, by key: the snapshot's own
        objects (the core adds to it). Kept with their keys, so that ``take_writes``
        hands them over without looking each up again in the snapshot."""
        self.dirty_accounts: dict[str, Account] = {}
        """Likewise for account sequences."""
        self.dirty_events: dict[str, EventRecord] = {}
        """Likewise for idempotency records."""

    def bucket(self, key: str) -> Bucket | None:
        """The bucket, or None when it holds nothing yet."""
        return self.snapshot.buckets.get(key)

    def bucket_for_update(self, key: str, period_end: int | None) -> Bucket:
        """The bucket, created if needed, marked to be written."""
        buckets = self.snapshot.buckets
        found = buckets.get(key)
        if found is None:
            found = buckets[key] = Bucket(period_end=period_end)
        elif period_end is not None:
            held = found.period_end  # (an expired bucket reads with none)
            if held is None or held < period_end:
                found.period_end = period_end
        self.dirty_buckets[key] = found
        return found

    def account_for_update(self, account_id: str) -> Account:
        """The account's sequence record, created if needed, marked to be written."""
        accounts = self.snapshot.accounts
        found = accounts.get(account_id)
        if found is None:
            found = accounts[account_id] = Account()
        self.dirty_accounts[account_id] = found
        return found

    def event(self, event_id: str) -> EventRecord | None:
        """The idempotency record of an event, or None if it never got a verdict."""
        return self.snapshot.events.get(event_id)

    def put_event(self, event_id: str, record: EventRecord) -> None:
        """Store a new idempotency record; it replaces the expired one, if one was read."""
        expired = self.snapshot.expired_events.get(event_id)
        if expired is None:
            record.version, record.expires_at = 0, None
        else:
            record.version, record.expires_at = expired.version, expired.expires_at
        self.snapshot.events[event_id] = record
        self.dirty_events[event_id] = record

    def touch_event(self, event_id: str) -> None:
        """Mark an existing record (e.g. a reversed payment) to be written."""
        self.dirty_events[event_id] = self.snapshot.events[event_id]

    @property
    def pending(self) -> int:
        """Number of records changed since the last ``take_writes``."""
        return len(self.dirty_buckets) + len(self.dirty_accounts) + len(self.dirty_events)

    def take_writes(self) -> Writes:
        """Every changed record with its version advanced by one.

        The records are this state's own objects, not copies: a store must serialise or
        copy them during ``commit`` and keep no reference (later units change them).
        """
        if _compiled_take_writes is not None:
            return _compiled_take_writes(self)
        return self._take_writes()

    def _take_writes(self) -> Writes:
        """``take_writes`` in Python: the reference, and what runs without a C compiler
        (``handlers._fastcore.take_writes`` is its compiled twin). The changed records
        are handed over in their dicts, which start again empty."""
        for bucket in self.dirty_buckets.values():
            bucket.version += 1
        for account in self.dirty_accounts.values():
            account.version += 1
        for record in self.dirty_events.values():
            record.version += 1
        writes = Writes(self.dirty_buckets, self.dirty_accounts, self.dirty_events)
        self.dirty_buckets, self.dirty_accounts, self.dirty_events = {}, {}, {}
        return writes


# Last, once every class above exists (the compiled module imports them): the compiled
# twin of ``WorkingState._take_writes``, when built.
try:
    from handlers._fastcore import take_writes as _compiled_take_writes
except ImportError:  # built without a C compiler
    _compiled_take_writes = None  # type: ignore[assignment]
