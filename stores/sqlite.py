"""Embedded, durable store in one SQLite file (WAL, fsync on commit).

Idempotency records are rows of a rowid table, their verdicts compressed
(``stores.verdict_codec``): a record is ~1.5 KB of JSON, and a WITHOUT ROWID table keeps
rows over ~1 KB (of a 4 KB page) in overflow pages, so each took a page of its own. The
file grew 4.6 KB per event; 0.9 KB with each verdict compressed alone, and now ~0.6 KB,
each compressed against a zstd dictionary kept in the file (the ``meta`` table), trained
from the first verdict stored: in under half the time, and a replay's commits take ~20%
less CPU than with verdicts compressed alone. Buckets and
accounts are small rows, for which WITHOUT ROWID is the better layout. Files made before
keep their tables and their uncompressed verdicts, and work unchanged.

Several processes may share the file: a commit takes SQLite's write lock
(``BEGIN IMMEDIATE``) and checks versions and expiries inside it.

Expired rows are deleted as the store goes, so that a long-running consumer's file
stops growing once its oldest records expire. Each commit, after its own writes and in
the same transaction, sweeps the next stretch of each table (twice as many rows as it
added to that table, plus 100, in key order, wrapping around at the end) and deletes
what has expired there; files made before the sweep existed are swept alike. Where a
table's sweep stopped is kept in ``meta``, so the next commit goes on from there, also
in another process (a replay a day that began at the table's start each time swept
its first stretch alone, and the file grew without end). A sweep
needs no index on ``expires_at``, which every bucket update would rewrite (that cost a
replay ~20%; the sweep ~1%). An expired row waits at most one round of the sweep, about
half the retention at a steady rate, so a file holds up to ~1.5 retentions of records.
Deleting a record only once past its ``expires_at`` is what TTL deletion does
elsewhere, and the conditions on ``expires_at`` make it safe (see ``stores.base``); one
may also delete expired rows by hand.

No row expires before its writer's clock plus the retention, so each table has an
expiry floor, kept in ``meta`` and lowered by every commit that writes an earlier one:
while the clock is below a table's floor nothing in it can have expired, and commits
sweep nothing there (a replay of recent events, a file's first retention). A file
without floors gets them from a scan of each table at its first commit. A floor is
never raised: once reached, every commit sweeps, as before (1.8% of a replay's
instructions).
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Final

import msgspec

from handlers.state import Account, Bucket, EventRecord, Keys, Snapshot, Writes
from limitflow.errors import (
    ConflictError,
    StoppedOpening,
    StoreNotInitialized,
    StoreRejected,
    StoreUnavailable,
)
from schemas.events import EventType
from stores.base import (
    LATEST_EXPIRY,
    DamagedRecord,
    Expected,
    Retention,
    Store,
    after_prefix,
    key_hint,
)
from stores.verdict_codec import (
    DICTIONARY_TAG,
    VerdictCodec,
    make_dictionary,
    pack_verdict,
    richest,
    unpack_verdict,
)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS buckets (
    key TEXT PRIMARY KEY, count INTEGER NOT NULL, amount INTEGER NOT NULL,
    version INTEGER NOT NULL, period_end INTEGER, expires_at INTEGER, born INTEGER
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS accounts (
    id TEXT PRIMARY KEY, seq INTEGER NOT NULL, version INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS events (
    id TEXT PRIMARY KEY, fingerprint TEXT NOT NULL, account_id TEXT NOT NULL,
    type TEXT NOT NULL, accepted INTEGER NOT NULL, seq INTEGER NOT NULL,
    verdict BLOB NOT NULL, amount INTEGER NOT NULL, currency TEXT,
    reversed INTEGER NOT NULL, buckets TEXT NOT NULL, occurred INTEGER NOT NULL,
    version INTEGER NOT NULL, expires_at INTEGER, born TEXT
);
"""
_META_SCHEMA: Final = (
    "CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value BLOB NOT NULL) WITHOUT ROWID"
)
_DICTIONARY: Final = "verdict_dictionary"
"""The ``meta`` row of the file's verdict dictionary (``stores.verdict_codec``): made
from the first verdict the file stores, never changed (every process that opens the
file reads it once), and left out of expiry (it holds nothing that names an event)."""
_RULE: Final = "rule:"
"""The start of the ``meta`` rows of what each rule's counters hold (``Store.keep_rules``):
``rule:<id>:<window>``, kept until ``store forget-rule`` (small, and naming no event)."""
_FIRST_COLUMNS: Final = {
    "buckets": frozenset({"key", "count", "amount", "version", "period_end", "expires_at"}),
    "accounts": frozenset({"id", "seq", "version"}),
    "events": frozenset(
        {
            *("id", "fingerprint", "account_id", "type", "accepted", "seq", "verdict"),
            *("amount", "currency", "reversed", "buckets", "occurred", "version", "expires_at"),
        }
    ),
    "meta": frozenset({"name", "value"}),
}
"""limitflow's tables and the columns each has had from the first: a table of one of
these names without them is another program's (``events``, ``accounts``, ``meta`` are
common names)."""
_ADDED_COLUMNS: Final = (("buckets", "born INTEGER"), ("events", "born TEXT"))
"""Columns added since the first schema: ``init`` adds them to a file made before (its
rows read them as NULL: a bucket's life and a record's list not known)."""
_CHUNK = 500
_keys_encoder: Final = msgspec.json.Encoder()
_decode_keys: Final = msgspec.json.Decoder(list[str]).decode
_decode_born: Final = msgspec.json.Decoder(list[int]).decode


_EventRow = tuple[
    str, str, str, int, int, bytes, int, str | None, int, str, int, int, int | None, str | None, str
]
"""An ``events`` row as the statements take it: every column but ``id``, then ``id``."""


def _json_text(values: tuple[str, ...] | tuple[int, ...]) -> str:
    """A record's bucket keys or their life stamps as JSON text, by msgspec (several times
    faster than the json module; rows that json wrote, with spaces, read the same)."""
    return _keys_encoder.encode(values).decode()


_BucketRow = tuple[str, int, int, int | None, int | None, int]
_OldBucketRow = tuple[int, int, int, int | None, int | None, int, str, int, int | None]
Rows = tuple[
    list[_BucketRow],
    list[_OldBucketRow],
    list[tuple[str, int]],
    list[tuple[int, int, str, int]],
    list[_EventRow],
    list[tuple[Any, ...]],
]
"""The parameters of a commit's statements: new and changed buckets, accounts and
event records."""


def rows(
    buckets: dict[str, Bucket],
    accounts: dict[str, Account],
    events: dict[str, EventRecord],
    expected_buckets: dict[str, int | None],
    expected_events: dict[str, int | None],
    pack: Callable[[bytes], bytes],
    json_text: Callable[[tuple[str, ...] | tuple[int, ...]], str],
) -> Rows:
    """The parameters of a commit's six statements: new rows (version 1) to insert, and
    rows to update on condition (each with the version and expiry it replaces).

    The reference, and what runs without a C compiler; ``stores._fastsqlite.rows`` is
    its compiled twin."""
    fresh_b: list[_BucketRow] = []
    old_b: list[_OldBucketRow] = []
    for k, b in buckets.items():
        version = b.version
        if version == 1:
            fresh_b.append((k, b.count, b.amount, b.period_end, b.expires_at, b.born))
        elif version > 1:
            old_b.append(
                (
                    *(b.count, b.amount, version, b.period_end, b.expires_at, b.born),
                    *(k, version - 1, expected_buckets[k]),
                )
            )
    fresh_a: list[tuple[str, int]] = []
    old_a: list[tuple[int, int, str, int]] = []
    for k, a in accounts.items():
        version = a.version
        if version == 1:
            fresh_a.append((k, a.seq))
        elif version > 1:
            old_a.append((a.seq, version, k, version - 1))
    fresh_e: list[_EventRow] = []
    old_e: list[tuple[Any, ...]] = []
    for k, r in events.items():
        row: _EventRow = (
            r.fingerprint,
            r.account_id,
            r.type.value,
            int(r.accepted),
            r.seq,
            pack(r.verdict),
            r.amount,
            r.currency,
            r.reversed,
            json_text(r.buckets),
            r.occurred,
            r.version,
            r.expires_at,
            json_text(r.born) if r.born else None,
            k,
        )
        if r.version == 1:
            fresh_e.append(row)
        elif r.version > 1:
            old_e.append((*row, r.version - 1, expected_events[k]))
    return fresh_b, old_b, fresh_a, old_a, fresh_e, old_e


def buckets_into(found: Iterable[tuple[Any, ...]], out: dict[str, Bucket]) -> None:
    """Each ``buckets`` row (key, count, amount, version, period_end, expires_at, born)
    as a Bucket in ``out``. The reference; ``stores._fastsqlite.buckets_into`` is its
    compiled twin."""
    for key, count, amount, version, period_end, expires_at, born in found:
        # SQLite keeps any value in any column (a file edited by hand, or damaged): a
        # REAL or text count would be published in verdicts, a negative one over-accept
        if not (
            type(count) is int
            and type(amount) is int
            and type(version) is int
            and count >= 0
            and amount >= 0
            and (period_end is None or type(period_end) is int)
            and (expires_at is None or type(expires_at) is int)
            and (born is None or type(born) is int)
        ):
            raise DamagedRecord(f"{key_hint(key)}: a row that is not a bucket's")
        out[key] = Bucket(count, amount, version, period_end, expires_at, born or 0)


def event_row_ok(row: tuple[Any, ...]) -> bool:
    """Whether an ``events`` row as ``_read`` selects it holds ints where limitflow writes
    them (seq, amount, reversed, occurred, version, accepted 0 or 1, expires_at or
    NULL): SQLite keeps any value in any column, and a file edited by hand must not put
    a REAL or a text into verdicts. The reference; ``stores._fastsqlite.event_row_ok``
    is its compiled twin (here, ~1,700 instructions an event: 0.8% of a replay of
    resends)."""
    return (
        type(row[5]) is int
        and type(row[7]) is int
        and type(row[9]) is int
        and type(row[11]) is int
        and type(row[12]) is int
        and type(row[4]) is int
        and row[4] in (0, 1)
        and (row[13] is None or type(row[13]) is int)
    )


try:
    from stores._fastsqlite import buckets_into as _buckets_into
    from stores._fastsqlite import event_row_ok as _event_row_ok
    from stores._fastsqlite import rows as _rows
except ImportError:  # built without a C compiler
    _buckets_into, _event_row_ok, _rows = buckets_into, event_row_ok, rows


_CHECKPOINT_PAGES: Final = 4000
"""WAL pages after which a commit copies them into the database (SQLite's default is
1,000). A replay's commit of 2,000 events dirties ~2,000 pages, most of them bucket
pages that the next commits dirty again: with the default every commit checkpointed
them all, and a checkpoint writes a page once however many commits changed it. At
4,000 (a WAL of ~16 MiB of 4 KB pages, ~32 MiB of 8 KB ones, while the file is open) a
100,000-event replay wrote 19% fewer bytes (465 -> 378 MiB, with 4 KB pages); 10,000
and 30,000 pages saved little more (349, 330 MiB) for a larger WAL and longer
checkpoints, which hold up the committing process.
Durability is the WAL's, fsynced at every commit, whatever this is."""
_PAGE_BYTES: Final = 8192
"""Page size of a new file (SQLite's default is 4,096). A commit writes each dirty page
to the WAL, and a checkpoint to the file, with a system call apiece: a 200,000-event
replay made 277,000 of them with 4 KB pages and 150,000 with 8 KB, for much the same
bytes, and took ~3% less time (three alternating runs each: 9.70-10.04 s against
10.09-10.39 s). Files made before keep their page size."""
_OPEN_TIMEOUT = 30.0
"""Seconds to wait for another process holding the file's lock at open."""
LOCK_WAIT = 30.0
"""Seconds a commit waits for another process's write lock, by default (a replay has
nothing else to do meanwhile)."""
_LOCK_TRY: Final = 0.2
"""Seconds of one wait inside SQLite for another process's lock (``_begin_immediate``)."""
CONSUMER_LOCK_WAIT = 1.0
"""The same for a Kafka consumer, whose event loop waits with the commit: past this the
commit fails as unavailable, and the consumer's retry (logged, readiness 503,
heartbeats going) takes over."""


def _chunks(keys: Iterable[str]) -> Iterator[list[str]]:
    """``keys`` in order, in lists of at most ``_CHUNK``. SQLite looks a list's keys up in
    order; lists in order too go through the table once, page after page (a read of a
    batch's keys took ~10% less time than in a set's order)."""
    ordered = sorted(keys)
    for start in range(0, len(ordered), _CHUNK):
        yield ordered[start : start + _CHUNK]


class SqliteStore(Store):
    """State in a SQLite file at ``path``."""

    def __init__(
        self,
        path: str,
        retention: Retention | None = None,
        *,
        lock_wait: float = LOCK_WAIT,
        wal: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(retention, **kwargs)
        self.path = path
        self._db = _open(path, wal=wal)
        self._file = _identity(path)
        """The device and inode of the file opened (``_begin_immediate`` checks that the
        path still names it)."""
        self._journal: list[tuple[int, int] | None] = [None, None]
        """The same of its -wal and -shm files, once seen (``_still_at_path``)."""
        self._journal_base = os.path.realpath(path)
        """Where SQLite keeps them: beside the file, a symbolic link to it resolved
        (looked for beside the link, none was found, and a -wal deleted went unnoticed)."""
        # SQLite waits for a lock inside the call, holding the event loop: `limitflow run`
        # keeps this short and retries with its own backoff, which lets the loop go on
        self.lock_wait = lock_wait
        self._db.execute(f"PRAGMA busy_timeout={int(min(lock_wait, _LOCK_TRY) * 1000)}")
        self._has_meta = False
        """Whether this store has seen the ``meta`` table in its file (it never goes)."""
        self._codec: VerdictCodec | None = None
        """Made from the file's dictionary, once it is known (see ``_verdict_codec``)."""

    async def _create(self) -> None:
        # once, at start: the whole wait in SQLite's calls, as the statements are several
        self._db.execute(f"PRAGMA busy_timeout={int(self.lock_wait * 1000)}")
        try:
            self._refuse_alien(
                [
                    row[0]
                    for row in self._db.execute("SELECT name FROM sqlite_master WHERE type='table'")
                ]
            )
            self._db.executescript(_SCHEMA)
            self._db.execute(_META_SCHEMA)
            for table, column in _ADDED_COLUMNS:
                have = self._columns(table)
                if column.split()[0] not in have:
                    try:
                        self._db.execute(f"ALTER TABLE {table} ADD COLUMN {column}")
                    except sqlite3.OperationalError as exc:
                        # another process opening the file added it first
                        if "duplicate column" not in str(exc):
                            raise
        except sqlite3.Error as exc:
            raise _translate(exc, self.path) from exc
        finally:
            self._db.execute(f"PRAGMA busy_timeout={int(min(self.lock_wait, _LOCK_TRY) * 1000)}")

    def refuse_foreign(self) -> None:
        """Raise ``StoreRejected`` when the file holds tables and none of limitflow's: a
        store URL that names another program's database (a typo, a path copied from the
        wrong setting). Making limitflow's tables there would mix a payment processor's
        state into it. ``limitflow store init`` adds them all the same, when asked.
        Also when one of its tables has a name of limitflow's and not its columns:
        limitflow added its tables and the rules' meanings, and a column to that table,
        before its first commit failed ("no such column")."""
        try:
            names = sorted(
                row[0]
                for row in self._db.execute("SELECT name FROM sqlite_master WHERE type='table'")
                if not row[0].startswith("sqlite_")
            )
        except sqlite3.Error as exc:
            raise _translate(exc, self.path) from exc
        self._refuse_alien(names)
        if names and not _FIRST_COLUMNS.keys() & set(names):
            shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
            raise StoreRejected(
                f"{self.path} holds tables of another program ({shown}) and none of"
                " limitflow's: give limitflow a file of its own (`limitflow store init`"
                " adds its tables there all the same)"
            )

    def _columns(self, table: str) -> set[str]:
        """The names of ``table``'s columns (none when there is no such table)."""
        return {row[1] for row in self._db.execute(f"PRAGMA table_info({table})")}

    def _refuse_alien(self, names: list[str]) -> None:
        """Raise ``StoreRejected`` when one of the tables ``names`` has a name of
        limitflow's and not its columns: no store can be made there (``store init`` too
        added a column to it, and said the file was ready)."""
        try:
            alien = [
                name
                for name in names
                if name in _FIRST_COLUMNS and not _FIRST_COLUMNS[name] <= self._columns(name)
            ]
        except sqlite3.Error as exc:
            raise _translate(exc, self.path) from exc
        if alien:
            raise StoreRejected(
                f"{self.path} holds a table of another program under the name of one of"
                f" limitflow's ({', '.join(alien)}): give limitflow a file of its own"
            )

    async def _verify(self) -> None:
        # another program's file is not one to run `store init` on, as the advice to a
        # file with no tables is
        self.refuse_foreign()
        try:
            names = {
                row[0]
                for row in self._db.execute("SELECT name FROM sqlite_master WHERE type='table'")
            }
            if not {"buckets", "accounts", "events"} <= names:
                raise StoreNotInitialized(f"{self.path} has no limitflow tables")
            lacking = [
                f"{table}.{column.split()[0]}"
                for table, column in _ADDED_COLUMNS
                if column.split()[0] not in self._columns(table)
            ]
        except sqlite3.Error as exc:
            raise _translate(exc, self.path) from exc
        if lacking:
            # a replay or a run adds them as it starts; a dry run, which writes nothing,
            # read such a file as "no such column": another program's tables, it said
            raise StoreNotInitialized(
                f"{self.path} was made by an older version of limitflow (no column"
                f" {', '.join(lacking)}; a replay or a run adds what is missing, a dry run"
                " writes nothing)"
            )

    async def _read_meanings(self, keys: list[str]) -> dict[str, str]:
        kept: dict[str, str] = {}
        try:
            for chunk in _chunks(_RULE + key for key in keys):
                marks = ",".join("?" * len(chunk))
                for name, value in self._db.execute(
                    f"SELECT name, value FROM meta WHERE name IN ({marks})",  # noqa: S608
                    chunk,
                ):
                    if type(value) is not str:
                        raise DamagedRecord(f"meta row {name!r} holds {type(value).__name__}")
                    kept[name.removeprefix(_RULE)] = value
        except sqlite3.OperationalError as exc:
            if "no such table" in str(exc):  # a file made before the meta table
                return {}
            raise _translate(exc, self.path) from exc
        except sqlite3.Error as exc:
            raise _translate(exc, self.path) from exc
        return kept

    async def _add_meanings(self, meanings: dict[str, str]) -> None:
        rows: list[tuple[str, ...]] = [(_RULE + k, m) for k, m in meanings.items()]
        # another process's, if first, stays, and none of these is kept
        if self._in_meta("INSERT OR IGNORE INTO meta VALUES (?, ?)", rows, all_or_none=True):
            return
        raise ConflictError("a rule's meaning was kept since it was read")

    async def _forget_meanings(self, keys: list[str]) -> int:
        return self._in_meta("DELETE FROM meta WHERE name = ?", [(_RULE + k,) for k in keys])

    async def _has_live_counters(self, prefix: str, now: int) -> bool:
        try:
            found = self._db.execute(
                "SELECT 1 FROM buckets WHERE key >= ? AND key < ?"
                " AND (expires_at IS NULL OR expires_at > ?) LIMIT 1",
                (prefix, after_prefix(prefix), now),
            ).fetchone()
        except sqlite3.Error as exc:
            raise _translate(exc, self.path) from exc
        return found is not None

    def _in_meta(
        self, statement: str, rows: list[tuple[str, ...]], *, all_or_none: bool = False
    ) -> int:
        """Run ``statement`` for each of ``rows`` in one write transaction on ``meta``;
        how many rows it changed (``all_or_none``: 0, rolled back, unless it changed one
        for each row). At a start (a rule new to the file) or by hand: it
        waits as long as a replay's commit would, also in a consumer, whose commits wait
        briefly and retry (a consumer starting while another commits waited 1 s, then
        failed)."""
        db = self._db
        try:
            self._begin_immediate(max(self.lock_wait, LOCK_WAIT))
            try:
                db.execute(_META_SCHEMA)
                changed = db.executemany(statement, rows).rowcount
                if all_or_none and changed != len(rows):
                    db.execute("ROLLBACK")
                    return 0
                db.execute("COMMIT")
            except BaseException:
                if db.in_transaction:
                    db.execute("ROLLBACK")
                raise
        except sqlite3.Error as exc:
            error = _translate(exc, self.path)
            raise type(error)(f"writing the rules' meanings: {error}") from exc
        return changed

    async def _read(self, keys: Keys) -> Snapshot:
        snapshot = Snapshot()
        db = self._db
        try:
            for chunk in _chunks(keys.buckets):
                self.round_trips += 1
                marks = ",".join("?" * len(chunk))
                _buckets_into(
                    db.execute(
                        "SELECT key, count, amount, version, period_end, expires_at, born"  # noqa: S608
                        f" FROM buckets WHERE key IN ({marks})",
                        chunk,
                    ),
                    snapshot.buckets,
                )
            for chunk in _chunks(keys.accounts):
                self.round_trips += 1
                marks = ",".join("?" * len(chunk))
                for key, seq, version in db.execute(
                    f"SELECT id, seq, version FROM accounts WHERE id IN ({marks})",  # noqa: S608
                    chunk,
                ):
                    # SQLite keeps a REAL in an INTEGER column (a file edited by hand):
                    # a seq of 1.5e20 would be published in verdicts (load: StoreRejected)
                    if type(seq) is not int or type(version) is not int:
                        raise DamagedRecord("an account's row whose seq or version is no int")
                    snapshot.accounts[key] = Account(seq, version)
            for chunk in _chunks(keys.events):
                self.round_trips += 1
                marks = ",".join("?" * len(chunk))
                for row in db.execute(
                    "SELECT id, fingerprint, account_id, type, accepted, seq, verdict, amount,"  # noqa: S608
                    " currency, reversed, buckets, occurred, version, expires_at, born"
                    f" FROM events WHERE id IN ({marks})",
                    chunk,
                ):
                    if not _event_row_ok(row):  # every number an int, as for buckets
                        raise DamagedRecord("an event's row that is not one")
                    snapshot.events[row[0]] = EventRecord(
                        fingerprint=row[1],
                        account_id=row[2],
                        type=EventType(row[3]),
                        accepted=bool(row[4]),
                        seq=row[5],
                        verdict=self._unpack(row[6]),
                        amount=row[7],
                        currency=row[8],
                        reversed=row[9],
                        buckets=tuple(_decode_keys(row[10])),
                        occurred=row[11],
                        version=row[12],
                        expires_at=row[13],
                        born=() if row[14] is None else tuple(_decode_born(row[14])),
                    )
        except sqlite3.Error as exc:  # also a damaged file (DatabaseError)
            raise _translate(exc, self.path) from exc
        return snapshot

    def _unpack(self, stored: bytes) -> bytes:
        if stored[:1] == DICTIONARY_TAG and self._codec is None:
            self._codec = self._verdict_codec(None)
        return unpack_verdict(stored, self._codec)

    def _verdict_codec(self, first: bytes | None) -> VerdictCodec | None:
        """The codec of the file's verdict dictionary; when the file has none yet, one
        made from ``first`` (the richest of the verdicts about to be stored) and kept in
        the file, or None without ``first``. Files made before the ``meta`` table get it here."""
        db = self._db
        found = self._dictionary()
        if found is None and first is not None:
            made = make_dictionary(first)  # ~25 ms of training, before the lock
            self._begin_immediate()
            try:
                db.execute(_META_SCHEMA)
                db.execute(  # another process's, if it got there first
                    "INSERT OR IGNORE INTO meta VALUES (?, ?)",
                    (_DICTIONARY, made),
                )
                db.execute("COMMIT")
            except BaseException:
                if db.in_transaction:
                    db.execute("ROLLBACK")
                raise
            found = self._dictionary()
        return None if found is None else VerdictCodec(found)

    def _dictionary(self) -> bytes | None:
        try:
            row = self._db.execute(
                "SELECT value FROM meta WHERE name = ?", (_DICTIONARY,)
            ).fetchone()
        except sqlite3.OperationalError as exc:
            if "no such table" in str(exc):
                return None
            raise
        return None if row is None else bytes(row[0])

    def _begin_immediate(self, wait: float | None = None) -> None:
        """Take the write lock, waiting up to ``wait`` (default ``lock_wait``) for another
        process's, in waits of ``_LOCK_TRY``: SQLite waits inside the call, where no signal
        handler runs, so a wait of 30 s in one call left a replay's second Ctrl-C
        unanswered until it ended. Between the tries, Python's handlers run. Refused once
        taken when the file is no longer at its path (``_still_at_path``)."""
        give_up = time.monotonic() + (self.lock_wait if wait is None else wait)
        while True:
            try:
                self._db.execute("BEGIN IMMEDIATE")
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() >= give_up:
                    raise
            else:
                try:
                    self._still_at_path()
                except (StoreRejected, StoreUnavailable):
                    self._db.execute("ROLLBACK")  # the write lock just taken, given back
                    raise
                return
            if self.stopping is not None and self.stopping():
                raise StoppedOpening(f"stopped while waiting for the lock of {self.path}")

    def _still_at_path(self) -> None:
        """Raise ``StoreRejected`` unless the path still names the file opened. SQLite in
        WAL mode goes on committing to a file deleted, replaced or moved under it: a
        replay or a run went on deciding, and publishing verdicts, on counters that no
        later start would see (it opens the path: an empty new file, or the one put
        there), and so over-accepted."""
        if _looked_at(self.path, "the file") != self._file:
            raise StoreRejected(
                f"SQLite {self.path}: the file opened is no longer at its path (deleted,"
                " replaced or moved since it was opened); nothing more is written to it"
            )
        # Its -wal and -shm likewise, as first seen with the write lock held (a new file
        # has none until its first write; this connection holds them open from then on,
        # and SQLite deletes them only with the last connection): a -wal deleted took
        # the commits since the last checkpoint with it at a crash, and a process
        # opening the file then made new ones, with a -shm whose locks this one's
        # writes did not take
        for index, suffix in enumerate(("-wal", "-shm")):
            found = _looked_at(f"{self._journal_base}{suffix}", f"its {suffix} file", self.path)
            if self._journal[index] is None:
                self._journal[index] = found
            elif found != self._journal[index]:
                raise StoreRejected(
                    f"SQLite {self.path}: its {suffix} file was deleted or replaced while"
                    " it was open (commits since the last checkpoint may be lost with it);"
                    " nothing more is written to it"
                )

    async def _write(self, writes: Writes, expected: Expected) -> None:
        db = self._db
        self.round_trips += 1
        codec = self._codec
        first = None if codec is not None else richest(r.verdict for r in writes.events.values())
        if first is not None:
            try:
                codec = self._codec = self._verdict_codec(first)
            except sqlite3.Error as exc:
                raise _translate(exc, self.path) from exc
        # (without events, no verdict is packed: the fallback is never called)
        pack = pack_verdict if codec is None else codec.pack
        # every parameter is made (verdicts compressed) before the write lock is taken:
        # other processes sharing the file wait only for the statements
        fresh_b, old_b, fresh_a, old_a, fresh_e, old_e = _rows(
            writes.buckets,
            writes.accounts,
            writes.events,
            expected.buckets,
            expected.events,
            pack,
            _json_text,
        )
        # an event record of any other version is counted and written by no statement:
        # the commit fails as a conflict (as before; ``take_writes`` makes none such)
        changes = len(fresh_b) + len(old_b) + len(fresh_a) + len(old_a) + len(writes.events)
        try:
            self._begin_immediate()
        except sqlite3.Error as exc:
            raise _translate(exc, self.path) from exc
        try:
            if not self._has_meta:  # a file made before it: the floors are kept there
                db.execute(_META_SCHEMA)
            before = db.total_changes
            db.executemany(
                "INSERT INTO buckets (key, count, amount, period_end, expires_at, born, version)"
                " VALUES (?, ?, ?, ?, ?, ?, 1)",
                fresh_b,
            )
            db.executemany(
                "UPDATE buckets SET count=?, amount=?, version=?, period_end=?, expires_at=?,"
                " born=? WHERE key=? AND version=? AND expires_at IS ?",
                old_b,
            )
            db.executemany("INSERT INTO accounts VALUES (?, ?, 1)", fresh_a)
            db.executemany("UPDATE accounts SET seq=?, version=? WHERE id=? AND version=?", old_a)
            db.executemany(
                "INSERT INTO events (fingerprint, account_id, type, accepted, seq, verdict,"
                " amount, currency, reversed, buckets, occurred, version, expires_at, born,"
                " id) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                fresh_e,
            )
            db.executemany(
                "UPDATE events SET fingerprint=?, account_id=?, type=?, accepted=?, seq=?,"
                " verdict=?, amount=?, currency=?, reversed=?, buckets=?, occurred=?,"
                " version=?, expires_at=?, born=? WHERE id=? AND version=? AND expires_at IS ?",
                old_e,
            )
            if db.total_changes - before != changes:
                raise ConflictError("a record changed since it was read")
            now = int(self._clock())
            # no expiry written is earlier than this (0 + the retention when not known:
            # a floor that low only means the sweeps run)
            at, retention = expected.written_at, self.retention
            buckets_floor = self._floor(
                db, "buckets", _earliest(at, retention.bucket_seconds) if writes.buckets else None
            )
            events_floor = self._floor(
                db, "events", _earliest(at, retention.event_seconds) if writes.events else None
            )
            # twice the rows added: a round of the sweep outpaces a table's growth
            swept = 0  # rows deleted
            if now >= buckets_floor:
                swept += self._sweep(db, "buckets", "key", 2 * len(fresh_b) + 100, now)
            if now >= events_floor:
                swept += self._sweep(db, "events", "id", 2 * len(fresh_e) + 100, now)
            db.execute("COMMIT")
            self._has_meta = True
            self.expired_deleted += swept  # once committed: a rollback deletes none
        except sqlite3.IntegrityError as exc:
            db.execute("ROLLBACK")
            raise ConflictError("a record was created since it was read") from exc
        except ConflictError:
            db.execute("ROLLBACK")
            raise
        except sqlite3.Error as exc:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise _translate(exc, self.path) from exc

    def _floor(self, db: sqlite3.Connection, table: str, written: int | None) -> int:
        """The expiry floor of ``table``: no row of it expires before. Lowered to
        ``written`` (the earliest expiry this commit's rows may have), if lower.

        Kept in ``meta`` by every commit, in its transaction; a file that has none gets
        its table's earliest expiry (one scan of the table, once)."""
        name = f"expiry_floor:{table}"
        row = db.execute("SELECT value FROM meta WHERE name = ?", (name,)).fetchone()
        kept = row is not None and type(row[0]) is int
        if kept:
            floor: int = row[0]
        else:  # none yet (or not a number: found again)
            (found,) = db.execute(f"SELECT min(expires_at) FROM {table}").fetchone()  # noqa: S608
            # (None when no row expires, or when none is a number)
            floor = found if type(found) is int else LATEST_EXPIRY
        if written is not None and written < floor:
            floor, kept = written, False
        if not kept:
            db.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (name, floor))
        return floor

    def _sweep(self, db: sqlite3.Connection, table: str, key: str, rows: int, now: int) -> int:
        """Delete the expired rows among the next ``rows`` of ``table`` (by ``key``), and
        keep in ``meta`` the key the next sweep starts after: the rows deleted, to count
        once the transaction commits (a commit that failed on a full disk counted its
        sweep's deletions, rolled back, in ``limitflow_store_expired_deleted``, and moved
        on; its place, kept in the same transaction, rolls back with them)."""
        # where the last commit's sweep of the table stopped, whichever process made it:
        # a process that began again at the table's start each time (a replay a day of
        # fewer events than the table holds) swept its first stretch over and over, and
        # the file grew for ever with the expired rows past it
        name = f"sweep:{table}"
        kept = db.execute("SELECT value FROM meta WHERE name = ?", (name,)).fetchone()
        start = kept[0] if kept is not None and type(kept[0]) is str else ""
        reached, deleted = self._sweep_from(db, table, key, start, rows, now)
        db.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (name, reached))
        return deleted

    @staticmethod
    def _sweep_from(
        db: sqlite3.Connection, table: str, key: str, start: str, rows: int, now: int
    ) -> tuple[str, int]:
        found = db.execute(
            f"SELECT {key} FROM {table} WHERE {key} > ?"  # noqa: S608 - fixed names
            " ORDER BY 1 LIMIT 1 OFFSET ?",
            (start, rows - 1),
        ).fetchone()
        if found is None:  # the rest of the table; the next sweep starts over
            deleted = db.execute(
                f"DELETE FROM {table} WHERE {key} > ? AND expires_at < ?",  # noqa: S608
                (start, now),
            )
            return "", deleted.rowcount
        deleted = db.execute(
            f"DELETE FROM {table} WHERE {key} > ? AND {key} <= ?"  # noqa: S608
            " AND expires_at < ?",
            (start, found[0], now),
        )
        return found[0], deleted.rowcount

    async def close(self) -> None:
        self._db.close()


def _looked_at(path: str, what: str, store: str | None = None) -> tuple[int, int] | None:
    """``_identity`` of ``path``, ``what`` of the store at ``store`` (default ``path``). A
    look that fails says nothing of the file (a folder unreadable for a while, an NFS
    ESTALE or EIO): an outage, retried, not a stop for good."""
    try:
        return _identity(path)
    except OSError as exc:
        raise StoreUnavailable(f"SQLite {store or path}: cannot look at {what}: {exc}") from exc


def _identity(path: str) -> tuple[int, int] | None:
    """The device and inode of the file at ``path``; None when there is none (an
    ``OSError`` that does not say so is raised: it says nothing of the file)."""
    try:
        found = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    return found.st_dev, found.st_ino


def _earliest(written_at: int, retention: int) -> int:
    """The earliest expiry a record written at ``written_at`` may have (``Store.commit``)."""
    return min(written_at + retention, LATEST_EXPIRY)


def _open(path: str, *, wal: bool = True) -> sqlite3.Connection:
    """Connect in WAL mode. Switching a new file to WAL fails at once with SQLITE_BUSY
    while another process opens it too (SQLite's busy handler is not used there), as
    when two consumers start together: retry until ``_OPEN_TIMEOUT``.

    Not ``wal``: the file's journal mode (and a new file's page size) as it is, for a
    command that writes nothing (``replay --dry-run``, ``rules check --store``). The
    journal mode is kept in the file: a copy in rollback mode (``VACUUM INTO`` makes
    one) was switched to WAL by a dry run on it."""
    deadline = time.monotonic() + _OPEN_TIMEOUT
    delay = 0.01
    while True:
        db: sqlite3.Connection | None = None
        try:
            db = sqlite3.connect(path, timeout=_OPEN_TIMEOUT, isolation_level=None)
            if wal:
                db.execute(f"PRAGMA page_size={_PAGE_BYTES}")  # a new file's; a file keeps its own
                db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=FULL")
            db.execute("PRAGMA cache_size=-65536")
            db.execute(f"PRAGMA wal_autocheckpoint={_CHECKPOINT_PAGES}")
        except sqlite3.Error as exc:
            if db is not None:
                db.close()
            busy = getattr(exc, "sqlite_errorcode", None) in (
                sqlite3.SQLITE_BUSY,
                sqlite3.SQLITE_LOCKED,
            )
            if type(exc) is sqlite3.DatabaseError:  # "malformed", "not a database"
                raise _translate(exc, path) from exc  # no retry mends it (StoreRejected)
            if not busy or time.monotonic() + delay > deadline:
                # sqlite:///tmp/x.db names tmp/x.db in the working directory, a common slip
                # (only when its folder is missing: a read-only one is not that slip)
                hint = (
                    ""
                    if os.path.isabs(path) or os.path.isdir(os.path.dirname(path) or ".")
                    else f" (a relative path, from {os.getcwd()}; an absolute one takes"
                    f" four slashes: sqlite:////{path})"
                )
                raise StoreUnavailable(
                    f"cannot open SQLite database {path}: {exc}{_disk(exc, path)}{hint}"
                ) from exc
            time.sleep(delay)
            delay = min(delay * 2, 0.5)
            continue
        return db


def _translate(exc: sqlite3.Error, path: str) -> Exception:
    text = f"{exc}{_disk(exc, path)}"
    if "no such table" in text:
        return StoreNotInitialized("SQLite tables are missing")
    # which file, for these two: an operator with several stores could not tell
    if type(exc) is sqlite3.DatabaseError:  # "malformed", "not a database": no retry helps
        return StoreRejected(f"SQLite {path}: {text} (the file is damaged or not a database)")
    if "no such column" in text:  # another program's tables of the same names
        return StoreRejected(f"SQLite {path}: {text} (the file's tables are not limitflow's)")
    if getattr(exc, "sqlite_errorcode", 0) & 0xFF == sqlite3.SQLITE_READONLY:
        # SQLite opens a file it may not write read-only, and the connection stays so:
        # retried, a run waited for ever, also once the file's mode was mended
        return StoreRejected(
            f"SQLite {path}: {text} (the file, its -wal or -shm, was opened read-only:"
            " make them writable and start again)"
        )
    return StoreUnavailable(f"SQLite: {text}")


def _disk(exc: sqlite3.Error, path: str) -> str:
    """For an I/O error or a full database: SQLite's name of it, and the room left on the
    file's disk. A full disk was "disk I/O error" alone where SQLite could not make the
    ``-shm`` file beside the database (``SQLITE_IOERR_SHMSIZE``), read as a failing disk."""
    code = getattr(exc, "sqlite_errorcode", None)
    if code is None or code & 0xFF not in (sqlite3.SQLITE_IOERR, sqlite3.SQLITE_FULL):
        return ""
    name = getattr(exc, "sqlite_errorname", None) or "SQLITE_IOERR"
    try:
        disk = os.statvfs(os.path.dirname(os.path.abspath(path)))
    except OSError:
        return f" ({name})"
    free = disk.f_bavail * disk.f_frsize
    room = f"{free // 1024} KiB" if free < 10 * 1024 * 1024 else f"{free // (1024 * 1024)} MiB"
    return f" ({name}; {room} free on the file's disk)"
