"""In-process store: the reference backend, and the fastest for a one-off replay.

Records are kept packed, so that a replay of millions of events fits in memory. A bucket
is 40 bytes, five 64-bit integers (a Bucket object with its integers took twice that).
An idempotency record is its version and expiry, then its other fields (the verdict,
which explains every applicable limit and is most of what a replay holds, and the
bucket keys) as one msgpack document, with the verdict kept as what differs from the
first verdict of its shape (``stores._shapes``: ~200 bytes for ~1,300; the shapes keep
none of the values that tell of an event or an account, ``TELLING``). A verdict of
no shape kept (past 256 shapes), or any verdict when the extension is not built, has the
record zstd-compressed instead, against a dictionary trained from one verdict
(``stores.verdict_codec.make_dictionary``, ~34 ms): the first verdict of no shape kept,
when that comes (most stores never train one), else the richest verdict of the store's
first commit. zstd had been a quarter of the
instructions a ``memory://`` replay spent on an event; records kept by shape take ~110
bytes more each. ``load`` unpacks the few records it is asked for.

``_read`` and ``_write`` run compiled (``stores._fastmemory``, the same loops, checks and
bytes) when the extension is built: a 200,000-event replay took ~13% less time. The
Python below is the reference, and what runs without a C compiler.
"""

from __future__ import annotations

import struct
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import msgspec

from handlers.state import Account, Bucket, EventRecord, Keys, Snapshot, Writes
from limitflow.errors import ConflictError
from schemas.events import EventType
from stores.base import Expected, Retention, Store, key_hint
from stores.verdict_codec import TELLING, make_dictionary, richest, zstd_pair

try:
    from stores import _fastmemory
except ImportError:  # built without a C compiler: the Python loops below, the same
    _fastmemory = None  # type: ignore[assignment]
try:
    from stores import _shapes
except ImportError:  # built without a C compiler: every record zstd-compressed
    _shapes = None  # type: ignore[assignment]
if sys.byteorder != "little":  # it packs integers in the host's order, these in "<"
    _fastmemory = None  # type: ignore[assignment]


class MemoryStore(Store):
    """Dicts of packed records. Lost when the process ends."""

    replay_batch_size = 500
    """No round trip to share: smaller batches keep a batch's working state in the
    processor's caches (a 200,000-event replay took 4.0-4.4 s in batches of 2,000,
    3.8-3.9 s in batches of 500)."""

    def __init__(
        self,
        retention: Retention | None = None,
        clock: Callable[[], float] = time.time,
        *,
        compiled: bool = True,
    ) -> None:
        super().__init__(retention, clock)
        self.data = MemoryData()
        self._fast = _fastmemory if compiled else None
        """The compiled read and write (``stores._fastmemory``), when built and ``compiled``."""

    @property
    def compiled(self) -> bool:
        """Whether reads and writes take the compiled loops."""
        return self._fast is not None

    def bucket(self, key: str) -> Bucket | None:
        """The stored bucket ``key`` (a copy), or None."""
        packed = self.data.buckets.get(key)
        return None if packed is None else _unpack_bucket(packed)

    def put_bucket(self, key: str, bucket: Bucket) -> None:
        """Store ``bucket`` as it is, with no checks (for tests and tools)."""
        self.data.buckets[key] = _pack_bucket(bucket)

    async def _read_meanings(self, keys: list[str]) -> dict[str, str]:
        kept = self.data.rules
        return {key: kept[key] for key in keys if key in kept}

    async def _add_meanings(self, meanings: dict[str, str]) -> None:
        kept = self.data.rules
        if not kept.keys().isdisjoint(meanings):
            raise ConflictError("a rule's meaning was kept since it was read")
        kept.update(meanings)

    async def _forget_meanings(self, keys: list[str]) -> int:
        return sum(self.data.rules.pop(key, None) is not None for key in keys)

    async def _has_live_counters(self, prefix: str, now: int) -> bool:
        return any(
            (expires := _unpack_bucket(packed).expires_at) is None or expires > now
            for key, packed in self.data.buckets.items()
            if key.startswith(prefix)
        )

    async def _read(self, keys: Keys) -> Snapshot:
        self.round_trips += 1
        data = self.data
        if self._fast is not None:
            codec = data.codec
            unpack = None if codec is None else codec.unpack
            snapshot: Snapshot = self._fast.read(
                data.buckets, data.accounts, data.events, keys, unpack
            )
            return snapshot
        snapshot = Snapshot()
        for key in keys.buckets:
            if (packed := data.buckets.get(key)) is not None:
                snapshot.buckets[key] = _unpack_bucket(packed)
        for key in keys.accounts:
            if (account := data.accounts.get(key)) is not None:
                snapshot.accounts[key] = account.copy()
        if data.codec is not None:
            for key in keys.events:
                if (record := data.events.get(key)) is not None:
                    snapshot.events[key] = data.codec.unpack(record)
        return snapshot

    async def _write(self, writes: Writes, expected: Expected) -> None:
        self.round_trips += 1
        data = self.data
        if self._fast is not None:
            self._fast.write(
                data.buckets,
                data.accounts,
                data.events,
                writes,
                expected,
                _encode,
                lambda: self._codec(writes),
            )
            return
        # check everything before changing anything: all or nothing
        for key, account in writes.accounts.items():
            stored = data.accounts.get(key)
            _check(key, None if stored is None else (stored.version, None), account.version)
        for key, bucket in writes.buckets.items():
            packed = data.buckets.get(key)
            held = None if packed is None else _BUCKET.unpack(packed)[2:5:2]
            _check(key, held and _none(held), bucket.version, expected.buckets[key])
        for key, record in writes.events.items():
            packed = data.events.get(key)
            held = None if packed is None else _HEADER.unpack_from(packed)
            _check(key, held and _none(held), record.version, expected.events[key])
        for key, bucket in writes.buckets.items():
            data.buckets[key] = _pack_bucket(bucket)
        for key, account in writes.accounts.items():
            data.accounts[key] = account.copy()  # the caller keeps changing its records
        if writes.events:
            codec = self._codec(writes)
            for key, record in writes.events.items():
                data.events[key] = codec.pack(record)

    def _codec(self, writes: Writes) -> Codec:
        """The store's codec; made at its first commit of event records (``writes``), with
        a dictionary made from the richest of their verdicts when there are no shapes."""
        data = self.data
        if data.codec is None:
            if _shapes is None:
                first = richest(r.verdict for r in writes.events.values()) or b""
                data.codec = Codec(make_dictionary(first))
            else:  # the dictionary, when a verdict has no shape kept: most never need one
                data.codec = Codec()
        return data.codec

    async def _create(self) -> None:
        return None

    async def _verify(self) -> None:
        return None


@dataclass(slots=True)
class MemoryData:
    """What a memory store holds; two stores given the same one see the same data."""

    buckets: dict[str, bytes] = field(default_factory=dict)
    accounts: dict[str, Account] = field(default_factory=dict)
    events: dict[str, bytes] = field(default_factory=dict)
    codec: Codec | None = None
    """Made at the first commit of event records, from the richest of their verdicts."""
    rules: dict[str, str] = field(default_factory=dict)
    """What each rule's counters hold, by ``<rule id>:<window>`` (``Store.keep_rules``)."""


_encode = msgspec.msgpack.Encoder().encode
_decode = msgspec.msgpack.Decoder().decode
_NONE = -(2**63)
"""None in a packed integer field (every real value is larger)."""
_BUCKET = struct.Struct("<6q")
"""count, amount, version, period_end, expires_at, born"""
_HEADER = struct.Struct("<2q")
"""version, expires_at: the start of a packed event record"""
_SHAPED = b"\x02"
"""After the header: the record's verdict is packed by its shape (``stores._shapes``)."""


def _pack_bucket(b: Bucket) -> bytes:
    return _BUCKET.pack(
        b.count,
        b.amount,
        b.version,
        _NONE if b.period_end is None else b.period_end,
        _NONE if b.expires_at is None else b.expires_at,
        b.born,
    )


def _unpack_bucket(packed: bytes) -> Bucket:
    count, amount, version, period_end, expires_at, born = _BUCKET.unpack(packed)
    return Bucket(
        count,
        amount,
        version,
        None if period_end == _NONE else period_end,
        None if expires_at == _NONE else expires_at,
        born,
    )


def _none(held: tuple[int, int]) -> tuple[int, int | None]:
    """(version, expires_at) with the packed None turned back."""
    return held[0], None if held[1] == _NONE else held[1]


class Codec:
    """Packs event records: a header, then either ``_SHAPED`` and the record's msgpack
    with its verdict packed by ``shapes`` (``stores._shapes``, when built), or, for a
    verdict of no shape kept, the record's msgpack zstd-compressed against a dictionary
    (a frame starts with zstd's magic number, never ``_SHAPED``). Without ``dictionary``,
    one is made from the verdict of the first record compressed."""

    __slots__ = ("_zstd", "shapes")

    def __init__(self, dictionary: bytes | None = None) -> None:
        self._zstd = None if dictionary is None else zstd_pair(dictionary)
        self.shapes: _shapes.Shapes | None = None if _shapes is None else _shapes.Shapes(TELLING)

    def compress(self, doc: bytes) -> bytes:
        """``doc`` (a record's msgpack) zstd-compressed against the dictionary."""
        if self._zstd is None:
            self._zstd = zstd_pair(make_dictionary(_decode(doc)[5]))
        return self._zstd[0](doc)

    def decompress(self, frame: bytes | memoryview) -> bytes:
        if self._zstd is None:  # no record was compressed: not one of this store's
            raise ValueError("a zstd-compressed record, and no dictionary made")
        return self._zstd[1](frame)

    def pack(self, r: EventRecord) -> bytes:
        shaped = None if self.shapes is None else self.shapes.pack(r.verdict)
        verdict = r.verdict if shaped is None else shaped
        fields = (r.fingerprint, r.account_id, r.type, r.accepted, r.seq, verdict, r.amount)
        doc = _encode((*fields, r.currency, r.reversed, r.buckets, r.occurred, r.born or ()))
        expires_at = _NONE if r.expires_at is None else r.expires_at
        header = _HEADER.pack(r.version, expires_at)
        if shaped is not None:
            return b"".join((header, _SHAPED, doc))
        # zstd returns its worst-case-sized output buffer, shrunk only in its length
        # field (~1.3 KiB of heap per ~120-byte record); the join copies just the bytes
        return b"".join((header, self.compress(doc)))

    def unpack(self, packed: bytes) -> EventRecord:
        version, expires_at = _none(_HEADER.unpack_from(packed))
        body = memoryview(packed)[_HEADER.size :]
        if body[:1] == _SHAPED:
            if self.shapes is None:
                raise ValueError("a record packed by its verdict's shape, and no shapes")
            f = _decode(body[1:])
            verdict = self.shapes.unpack(f[5])
        else:
            f = _decode(self.decompress(body))
            verdict = f[5]
        return EventRecord(
            *(f[0], f[1], EventType(f[2]), f[3], f[4], verdict, f[6], f[7], f[8], tuple(f[9])),
            occurred=f[10],
            version=version,
            expires_at=expires_at,
            born=tuple(f[11]),
        )


def _check(
    key: str, stored: tuple[int, int | None] | None, version: int, expires_at: int | None = None
) -> None:
    """Raise ``ConflictError`` unless ``stored`` (its version and expiry, None when
    absent) is the record a write of ``version`` replaces: none for version 1, else
    version - 1 with the expiry read (accounts never expire: None on both sides)."""
    if stored is None:
        if version == 1:
            return
    elif stored == (version - 1, expires_at):
        return
    raise ConflictError(f"{key_hint(key)} changed since it was read")
