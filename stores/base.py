"""The state store interface every backend implements.

A template-method base: ``Store`` owns expiry (on write and on read, because TTL
deletion runs late) and round-trip accounting; a backend implements four primitives:
``_read``, ``_write``, ``_create`` and ``_verify``.

Contract of ``_write``: every record in ``Writes`` is stored with its new ``version``
only if the stored record is exactly the one that was read, all records or none, else
``ConflictError``. For version 1 that means the key must be absent; for a later version
the stored version must be ``version - 1`` and, for buckets and event records, the
stored ``expires_at`` the one in ``Expected`` (None: the stored record has none). That
makes a batch all-or-nothing across every bucket, the account sequence and the
idempotency record, and keeps zombie writers from overwriting newer state.

Why ``expires_at`` too: TTL deletion (MongoDB's monitor, DynamoDB's TTL, or a manual
purge) removes an expired record at any moment, and a record created again after that
starts over at version 1. A writer that read the old record (expired, or just about to
expire) expects its version, which the new incarnation reaches again: on the version
alone, its write would replace the new record, losing the increments stored there or
deciding an event a second time. Every write sets ``expires_at`` to at least its
writer's clock plus the retention, and TTL deletes a record only once past its
``expires_at``: a record created again after a deletion expires later than the deleted
one, and so later than any record of that key read before the deletion (expiries only
move forward while a record lives). A write conditioned on the version and expiry read
therefore never matches a later incarnation, provided writers' clocks differ from each
other and from the TTL's by less than the retention, and the retention is not
shortened meanwhile.

For the same reason a bucket's life is recorded: ``commit`` stamps a bucket written for
the first time, or again after it expired, with its writer's clock (``Bucket.born``),
and a new payment's record with the stamp of each bucket it was added to. A reversal
releases the payment only from a bucket still in that life: one that expired and began
again with late payments of its period never held it. A new life's stamp is later than
the last one's by at least the retention, under the same condition on the clocks.
"""

from __future__ import annotations

import abc
import asyncio
import random
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final
from urllib.parse import urlsplit

import msgspec
import zstandard

from handlers.state import Keys, Snapshot, Writes
from limitflow.errors import (
    ConflictError,
    LimitflowError,
    StoreRejected,
    StoreUnavailable,
)
from schemas.rules import RuleChanged, RuleSet, Window, check_kept_meanings, counter_meaning


class CountersLive(LimitflowError):
    """A rule's meaning cannot be forgotten: some of its counters have not expired."""


class DamagedRecord(ValueError):
    """A stored record that does not have limitflow's format, said without its stored
    values or the scope values of its key (``key_hint``): its text is shown, where any
    other error's (``int()``'s "invalid literal … '4111…'") is named by its type alone."""


def key_hint(key: str) -> str:
    """A stored record's ``key`` for messages and logs: a bucket's rule id and period,
    without the scope values (a careless upstream's card number in a card rule's key,
    which PCI DSS keeps out of logs); nothing of an account's or event's id."""
    bare = key[2:] if key[1:2] == "#" else key  # DynamoDB's b#, a#, e#
    rule, is_bucket, rest = bare.partition("|")
    if not is_bucket:
        return "a record"
    return f"bucket {rule}|{rest.partition('|')[0]}|…"


_MALFORMED = (
    struct.error,  # a packed memory record of the wrong size
    KeyError,
    TypeError,
    ValueError,
    AttributeError,
    msgspec.DecodeError,
    zstandard.ZstdError,
)
"""What decoding a record that does not have limitflow's format raises, on any store."""

DAY = 86_400

MAX_TRANSACT_ITEMS: Final = 100
"""DynamoDB's limit of actions in one ``TransactWriteItems``: the DynamoDB store's
``max_records_per_commit``, here so that ``rules check`` can name it without importing
the AWS SDK (half a second)."""

KEEP_ATTEMPTS: Final = 8
"""Tries at keeping new rule meanings beyond one per meaning, for write conflicts with
other starts (``Store.keep_rules``)."""

RETENTION_PARAMS = frozenset({"bucket_retention_days", "event_retention_days"})
"""Query parameters of every store URL that are limitflow's (``stores._retention``), never
a driver's."""


@dataclass(frozen=True, slots=True)
class Retention:
    """How long records live after their period (buckets) or event time (records)."""

    bucket_seconds: int = 35 * DAY
    """Kept this long past the end of the bucket's period (lifetime buckets never expire)."""
    event_seconds: int = 400 * DAY
    """Idempotency records (and so reversibility) last this long past the event time."""


LATEST_EXPIRY = 253_402_214_400
"""9999-12-31T00:00:00Z: no record expires later. Events may be dated up to 9999-12-30,
and a date past year 9999 is beyond what MongoDB's driver (Python's datetime) holds."""


def stamp(
    writes: Writes, now: int, bucket_seconds: int, event_seconds: int, latest: int
) -> tuple[dict[str, int | None], dict[str, int | None]]:
    """The ``expires_at`` of each bucket and event record of ``writes`` as read (for
    ``Expected``), then each one's new expiry (``latest`` at most) set, and the life
    stamps of new buckets (``now``) and of new payments' records (their buckets').

    An idempotency record expires no earlier than the bucket retention after the buckets
    of this commit that it counted in (or, a reversal, released from), and never if one
    of them never does (a lifetime bucket) or if it never did, and never earlier than it
    was stored to (a reversal of a payment whose buckets expired writes none of them):
    else a resend after the record went would be counted again in a bucket still
    holding it, or decided again before the time its record was kept for. The margin is the
    clock difference tolerated (above): a record deleted on a clock ahead of a member's
    is one whose buckets that member reads expired too.

    The reference, and what runs without a C compiler; ``handlers._fastcore.stamp`` is
    its compiled twin (on a replay, these loops took ~5% of the time)."""
    held_buckets = {key: bucket.expires_at for key, bucket in writes.buckets.items()}
    held_events = {key: record.expires_at for key, record in writes.events.items()}
    # per record, on every commit: plain comparisons cost less than min() and max()
    buckets = writes.buckets
    for bucket in buckets.values():
        period_end = bucket.period_end
        if period_end is None:
            bucket.expires_at = None
        else:
            expires_at = (period_end if period_end > now else now) + bucket_seconds
            bucket.expires_at = expires_at if expires_at < latest else latest
        if not bucket.born:  # a new life: new, expired when read, or stored before
            bucket.born = now
    for event_id, record in writes.events.items():
        occurred = record.occurred
        own = (occurred if occurred > now else now) + event_seconds
        until: int | None = own if own < latest else latest
        if record.version > 1 and held_events[event_id] is None:
            until = None  # stored before to never expire: it stays so
        else:
            # kept the bucket retention past each bucket it counted in or released
            # from, as this commit writes it: a resend after the record went would
            # count (or release) again, and a deleter's clock may run ahead of that of
            # a member still reading the bucket live
            for bucket_key in record.buckets:
                counted = buckets.get(bucket_key)
                if counted is None or until is None:
                    continue
                if counted.expires_at is None:  # a lifetime bucket: kept for good
                    until = None
                else:
                    kept = counted.expires_at + bucket_seconds
                    if kept > latest:
                        kept = latest
                    if kept > until:
                        until = kept
            # never earlier than stored: a reversal that releases from none of its
            # original's buckets (they expired) would else cut the original's record
            # to its own retention, short of the bucket retention past the buckets its
            # payment's commit left, and a resend then was decided again
            held = held_events[event_id]
            if held is not None and until is not None and held > until:
                until = held if held < latest else latest
        record.expires_at = until
        if record.born is None:  # a new payment: its buckets are in this commit
            record.born = tuple(
                [0 if (b := buckets.get(key)) is None else b.born for key in record.buckets]
            )
    return held_buckets, held_events


def expire(snapshot: Snapshot, now: int) -> None:
    """Turn what has expired by ``now`` into what a store holds then: an expired bucket
    reads as empty, with the stored ``version`` and ``expires_at``; an expired event
    record moves to ``expired_events``.

    The reference, and what runs without a C compiler; ``handlers._fastcore.expire`` is
    its compiled twin."""
    for key, bucket in snapshot.buckets.items():
        if bucket.expires_at is not None and bucket.expires_at <= now:
            snapshot.buckets[key] = type(bucket)(
                version=bucket.version, expires_at=bucket.expires_at
            )
    expired = [
        key
        for key, record in snapshot.events.items()
        if record.expires_at is not None and record.expires_at <= now
    ]
    for key in expired:
        snapshot.expired_events[key] = snapshot.events.pop(key)


try:
    from handlers._fastcore import expire as _expire
    from handlers._fastcore import stamp as _stamp
except ImportError:  # built without a C compiler
    _expire, _stamp = expire, stamp


@dataclass(frozen=True, slots=True)
class Expected:
    """The ``expires_at`` of each bucket and event record of a commit, as it was read.

    ``_write`` conditions every write of version > 1 on it, as well as on the version.
    """

    buckets: dict[str, int | None]
    events: dict[str, int | None]
    written_at: int = 0
    """The writer's clock (epoch s) when ``commit`` set the new expiries: none of them is
    earlier than this plus the retention (0: not known)."""


class Store(abc.ABC):
    """Versioned records for buckets, account sequences and idempotency records."""

    max_records_per_commit: int | None = None
    """Largest ``Writes`` one atomic commit accepts; None for no limit."""
    replay_batch_size: int = 2_000
    """Records ``limitflow replay`` decides per batch unless told: a round trip to a
    server or a commit to a file is worth sharing among many."""
    stopping: Callable[[], bool] | None = None
    """While the store is opened for a command: whether a stop was asked for, which ends a
    wait for another process's lock (``StoppedOpening``) before the rules' meanings are
    kept. SQLite waits in the program's own thread, where a signal is noted but the
    event loop, and so the command's wait for the stop, does not run."""

    def __init__(self, retention: Retention | None = None, clock: Callable[[], float] = time.time):
        self.retention = retention or Retention()
        self._clock = clock
        self.round_trips = 0
        """Requests sent to the server (reads and commits), for metrics and benchmarks."""
        self.expired_deleted = 0
        """Expired records this store's commits deleted (sqlite's sweep; the servers' TTL
        deletions happen on the server and are not counted here)."""

    async def load(self, keys: Keys) -> Snapshot:
        """Read the records of ``keys``; expired ones read as empty.

        An expired record keeps its ``version`` and ``expires_at``: whatever replaces it
        is written on condition that it is still stored, unchanged.
        """
        try:
            snapshot = await self._read(keys)
        except _MALFORMED as exc:
            # a record written by hand, by another program, or damaged: no retry mends it.
            # Only limitflow's own words: another error's may quote a stored value
            why = str(exc) if isinstance(exc, DamagedRecord) else type(exc).__name__
            raise StoreRejected(
                f"a stored record cannot be read ({why}); it was not written by this"
                " version of limitflow, or it is damaged"
            ) from (exc if isinstance(exc, DamagedRecord) else None)
        _expire(snapshot, int(self._clock()))
        return snapshot

    async def commit(self, writes: Writes) -> None:
        """Store every record of ``writes`` atomically, or raise ``ConflictError``.

        Each record must be the one read (or a record of ``load``'s snapshot changed in
        place), with its ``version`` advanced by one and its ``expires_at`` as read;
        this sets the new ``expires_at`` of each.
        """
        if not writes:
            return
        now = int(self._clock())
        retention = self.retention
        held_buckets, held_events = _stamp(
            writes, now, retention.bucket_seconds, retention.event_seconds, LATEST_EXPIRY
        )
        await self._write(writes, Expected(held_buckets, held_events, now))

    async def init(self) -> None:
        """Create tables, collections and indexes; safe to run again."""
        await self._create()

    async def check(self) -> None:
        """Raise ``StoreNotInitialized`` unless ``init`` has been run on this store."""
        await self._verify()

    async def keep_rules(self, rules: RuleSet, *, keep: bool = True) -> int:
        """Keep what each rule's counters hold (``counter_meaning``) where this store has
        nothing kept for it yet, and refuse (``RuleChanged``) the rules whose counters were
        kept under another meaning. A refused start keeps nothing, also when another start
        comes in between: the new meanings are kept all together or not at all, and
        compared again when another start's got there first. With ``keep=False``, only
        compare (a rule new to the store passes). Returns how many of the rules' meanings
        the store had kept before."""
        meanings = dict(filter(None, map(counter_meaning, rules.rules)))
        keys = list(meanings)
        try:
            kept = await self._read_meanings(keys) if keys else {}
            check_kept_meanings(rules, kept)
            known = len(kept)
            # each refused write means another start kept some of these first: then fewer
            # are left to keep, or the comparison refuses; a few more for write conflicts
            for attempt in range(len(keys) + KEEP_ATTEMPTS if keep else 0):
                missing = {k: m for k, m in meanings.items() if k not in kept}
                if not missing:
                    break
                try:
                    await self._add_meanings(missing)
                except ConflictError:
                    await asyncio.sleep(random.uniform(0, min(1.0, 0.02 * 2**attempt)))  # noqa: S311
                kept = await self._read_meanings(keys)
                check_kept_meanings(rules, kept)
            if keep and len(kept) < len(keys):
                raise StoreUnavailable(
                    f"the store did not keep {', '.join(sorted(set(keys) - set(kept)))}"
                )
        except RuleChanged:
            raise
        except ValueError as exc:  # what _read_meanings and check_kept_meanings refuse
            raise StoreRejected(
                f"{exc}: it was not written by this version of limitflow, or it is damaged"
                " (`limitflow store forget-rule` removes it)"
            ) from exc
        return known

    async def forget_rule(self, rule_id: str, *, force: bool = False) -> int:
        """Forget what the counters of ``rule_id`` hold, in every window (the next start
        with the rule keeps its meaning again); returns how many meanings were kept.

        Refused (``CountersLive``) while any counter of the rule has not expired, unless
        ``force``: a rule changed and started again would carry on from it. Nothing kept
        (forgotten already): 0, whatever its counters."""
        keys = [f"{rule_id}:{w.value}" for w in Window if w is not Window.TRANSACTION]
        try:
            if not await self._read_meanings(keys):
                return 0
        except _MALFORMED:
            pass  # kept, if damaged: to be forgotten all the same
        if not force and await self._has_live_counters(f"{rule_id}|", int(self._clock())):
            raise CountersLive(
                f"rule {rule_id!r} has counters that have not expired: a rule changed under"
                " its id would carry on from them. Wait until they expire (the bucket"
                " retention after their period; a lifetime rule's never do), or give the"
                " changed rule a new id"
            )
        return await self._forget_meanings(keys)

    async def close(self) -> None:  # noqa: B027 - optional hook, most backends need it
        """Release connections."""

    @abc.abstractmethod
    async def _read(self, keys: Keys) -> Snapshot:
        """Fetch the stored records of ``keys`` (absent keys left out), as fresh copies.

        Not at one instant, but the accounts no later than the event records: a
        reversal's original read as absent is then absent when its account was read,
        or the reversal's write of the account fails its condition. (Read after the
        account, a payment committed in between is found; read before, it was not, and
        the reversal was committed "original not found" after the payment's seq.)"""

    @abc.abstractmethod
    async def _write(self, writes: Writes, expected: Expected) -> None:
        """Conditional all-or-nothing write; see the module docstring."""

    @abc.abstractmethod
    async def _create(self) -> None:
        """Create whatever the backend needs; idempotent."""

    @abc.abstractmethod
    async def _verify(self) -> None:
        """Raise ``StoreNotInitialized`` when ``_create`` has not been run."""

    @abc.abstractmethod
    async def _read_meanings(self, keys: list[str]) -> dict[str, str]:
        """The meanings stored for those of ``keys`` (``counter_meaning``) that have one;
        a stored one that is not text is a ``ValueError`` naming its record."""

    @abc.abstractmethod
    async def _add_meanings(self, meanings: dict[str, str]) -> None:
        """Store every meaning of ``meanings`` (by key), all together, or none of them
        and raise ``ConflictError`` when one is stored for any of the keys already (or
        another writer's transaction on them conflicts): a meaning once stored is never
        overwritten."""

    @abc.abstractmethod
    async def _forget_meanings(self, keys: list[str]) -> int:
        """Delete the meanings stored for ``keys``; how many there were."""

    @abc.abstractmethod
    async def _has_live_counters(self, prefix: str, now: int) -> bool:
        """Whether a bucket whose key starts with ``prefix`` (``<rule id>|``) is stored and
        not expired at ``now``."""


_PLAIN_OPTIONS: Final = frozenset(
    {
        *RETENTION_PARAMS,
        "endpoint_url",
        "region",
        "replicaSet",
        "authSource",
        "authMechanism",
        "tls",
        "directConnection",
        "serverSelectionTimeoutMS",
        "retryWrites",
        "retryReads",
        "w",
        "journal",
        "readPreference",
        "readConcernLevel",
        "appName",
        "maxPoolSize",
        "minPoolSize",
        "timeoutMS",
        "connectTimeoutMS",
        "socketTimeoutMS",
        "heartbeatFrequencyMS",
        "localThresholdMS",
        "compressors",
        "tlsCAFile",
    }
)
"""URL options that hold no secret; the value of any other (a misspelt one included) is
masked in logs and messages."""


def after_prefix(prefix: str) -> str:
    """The first text after every text that starts with ``prefix`` (its last character
    advanced by one): ``key >= prefix AND key < after_prefix(prefix)`` is a key range."""
    return prefix[:-1] + chr(ord(prefix[-1]) + 1)


def redacted(url: str) -> str:
    """A store URL without its password, nor the value of an option that may hold a
    secret (``authMechanismProperties=AWS_SESSION_TOKEN:…``), for messages and logs."""
    # rebuilt by hand: urlunsplit drops the empty host of sqlite:////abs/path
    netloc = urlsplit(url).netloc
    scheme, sep, rest = url.partition("://")
    if "@" in netloc:
        credentials, _, hosts = netloc.rpartition("@")
        user, has_password, _ = credentials.partition(":")
        if has_password:
            url = url.replace(netloc, f"{user}:***@{hosts}", 1)
    elif sep and "@" in rest:
        # a password with an unescaped /, ? or # ends the host part there for urlsplit,
        # which found no credentials and showed it whole: all to the last @ is hidden
        credentials, at, after = rest.rpartition("@")
        user, has_password, _ = credentials.partition(":")
        if has_password:
            url = f"{scheme}{sep}{user}:***{at}{after}"
    base, has_query, query = url.partition("?")
    options = [
        option
        if "=" not in option or option.partition("=")[0] in _PLAIN_OPTIONS
        else f"{option.partition('=')[0]}=***"
        for option in query.replace(";", "&").split("&")
        if option
    ]
    return base + has_query + "&".join(options)
