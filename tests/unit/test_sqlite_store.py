"""What is particular to the SQLite file: opening it from several processes at once, and
files made by earlier versions, deleting expired rows. The store contract itself is in
tests/contract."""

from __future__ import annotations

import json
import multiprocessing
import os
import re
import sqlite3
from collections.abc import Callable
from contextlib import closing
from multiprocessing.synchronize import Barrier
from pathlib import Path
from typing import Any

import pytest

from handlers.decide import Decider, OutcomeKind
from handlers.state import Account, Bucket, EventRecord, Keys, Snapshot, Writes
from limitflow.errors import ConflictError, StoreRejected, StoreUnavailable
from schemas.events import EventType, parse_event
from schemas.rules import load_rules, parse_rules
from schemas.verdicts import Decision
from stores import open_store
from stores.base import Expected
from stores.sqlite import SqliteStore
from streams.engine import Engine, Record

OPENERS = 6
ROUNDS = 10  # without the retry on open, about 1 round in 3 failed on this machine


def _open(path: str, barrier: Barrier, results: multiprocessing.Queue[str]) -> None:
    import asyncio

    barrier.wait()
    try:
        store = SqliteStore(path)
        asyncio.run(store.init())
        asyncio.run(store.close())
        results.put("ok")
    except Exception as exc:  # reported to the test, which names it
        results.put(repr(exc))


def _keep(path: str, zone: str, barrier: Barrier, results: multiprocessing.Queue[str]) -> None:
    import asyncio

    store = SqliteStore(path)
    rules = parse_rules(f"rules: [{{id: r, window: day, timezone: {zone}, max_count: 1}}]")
    barrier.wait()
    try:
        asyncio.run(store.keep_rules(rules))
        results.put(zone)
    except Exception as exc:  # reported to the test, which names it
        results.put(repr(exc))
    finally:
        asyncio.run(store.close())


def _open_together(path: str, target: Callable[..., None] = _open, *args: object) -> list[str]:
    """What each of ``OPENERS`` processes that run ``target`` on ``path`` at once saw: the
    ``n``-th process is given ``args[n % len(args)]`` too, if there are ``args``."""
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(OPENERS)
    results: multiprocessing.Queue[str] = ctx.Queue()
    given = [(path, args[n % len(args)]) if args else (path,) for n in range(OPENERS)]
    procs = [ctx.Process(target=target, args=(*a, barrier, results)) for a in given]
    for p in procs:
        p.start()
    outcomes = [results.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    return outcomes


async def test_processes_starting_together_keep_one_meaning_for_a_rule(tmp_path: Path) -> None:
    for n in range(ROUNDS // 2):
        path = str(tmp_path / f"store-{n}.db")
        made = SqliteStore(path)
        await made.init()
        await made.close()
        outcomes = _open_together(path, _keep, "UTC", "Asia/Tokyo")
        kept = {o for o in outcomes if not o.startswith("RuleChanged")}
        assert len(kept) == 1 and outcomes.count(kept.copy().pop()) == OPENERS // 2, outcomes
        with closing(sqlite3.connect(path)) as db:
            (stored,) = db.execute("SELECT value FROM meta WHERE name = 'rule:r:day'").fetchone()
        assert kept == {json.loads(stored)["timezone"]}


def test_processes_opening_a_new_file_together_all_succeed(tmp_path: Path) -> None:
    for n in range(ROUNDS):
        outcomes = _open_together(str(tmp_path / f"store-{n}.db"))
        assert outcomes == ["ok"] * OPENERS, f"round {n}: {outcomes}"


_EARLIER_EVENTS_TABLE = """
CREATE TABLE events (
    id TEXT PRIMARY KEY, fingerprint TEXT NOT NULL, account_id TEXT NOT NULL,
    type TEXT NOT NULL, accepted INTEGER NOT NULL, seq INTEGER NOT NULL,
    verdict BLOB NOT NULL, amount INTEGER NOT NULL, currency TEXT,
    reversed INTEGER NOT NULL, buckets TEXT NOT NULL, occurred INTEGER NOT NULL,
    version INTEGER NOT NULL, expires_at INTEGER
) WITHOUT ROWID;
"""


@pytest.mark.parametrize("seq", ["1.5e20", "'inf'", "2.5", "'seven'"])
async def test_an_account_sequence_that_is_not_an_integer_is_refused(
    tmp_path: Path, seq: str
) -> None:
    """SQLite keeps what does not fit an INTEGER column as it is: a file edited by hand
    must not put 1.5e20 or inf into verdicts."""
    path = str(tmp_path / "edited.db")
    store = SqliteStore(path)
    await store.init()
    try:
        with closing(sqlite3.connect(path, isolation_level=None)) as db:
            db.execute(f"INSERT INTO accounts VALUES ('a1', {seq}, 3)")
        with pytest.raises(StoreRejected, match="an account's row whose seq or version is no int"):
            await store.load(Keys(accounts={"a1"}))
    finally:
        await store.close()


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ("x'7b7d'", "meta row 'rule:day:day' holds bytes"),
        ("'[1]'", "the meaning kept for 'day:day' is not one limitflow writes"),
        ("'{'", "the meaning kept for 'day:day' is not JSON"),
    ],
)
async def test_a_kept_rule_meaning_edited_by_hand_is_refused(
    tmp_path: Path, value: str, said: str
) -> None:
    path = str(tmp_path / "edited.db")
    store = SqliteStore(path)
    await store.init()
    rules = parse_rules(_DAY_RULES)
    try:
        await store.keep_rules(rules)
        with closing(sqlite3.connect(path, isolation_level=None)) as db:
            edited = db.execute(f"UPDATE meta SET value = {value} WHERE name LIKE 'rule:%'")
            assert edited.rowcount == 1
        with pytest.raises(StoreRejected, match=f"^{re.escape(said)}.*or it is damaged"):
            await store.keep_rules(rules)
        assert await store.forget_rule("day") == 1  # what the message says to do
        assert await store.keep_rules(rules) == 0
    finally:
        await store.close()


@pytest.mark.parametrize(
    "edit",
    [
        "UPDATE buckets SET amount = 1.5",
        "UPDATE buckets SET count = 'abc'",
        "UPDATE buckets SET count = -3",
        "UPDATE events SET verdict = x'00'",
        "UPDATE events SET accepted = 'yes'",
        "UPDATE events SET seq = 'x'",
        "UPDATE events SET amount = 2.5",
    ],
)
async def test_a_bucket_or_event_row_edited_by_hand_is_refused(tmp_path: Path, edit: str) -> None:
    """As for accounts: a REAL amount was published in verdicts ("3551..5"), a text
    count ended in a traceback, a verdict of b"\x00" went to every resend."""
    path = str(tmp_path / "edited.db")
    store = SqliteStore(path)
    await store.init()
    try:
        engine = Engine(Decider(parse_rules(_DAY_RULES)), store)
        await engine.process([Record(_PAYMENT, {"line": 1})])
        with closing(sqlite3.connect(path, isolation_level=None)) as db:
            db.execute(edit)
        with pytest.raises(StoreRejected, match=r"is not|not an event's|not a JSON object"):
            await engine.process([Record(_PAYMENT, {"line": 1})])
    finally:
        await store.close()


_PAYMENT = (
    b'{"event_id":"p1","account_id":"a","amount":"10.00","currency":"CNY",'
    b'"occurred_at":"2030-03-17T10:00:00Z"}'
)


async def test_a_file_made_before_verdicts_were_compressed_reads_and_writes(
    tmp_path: Path,
) -> None:
    path = str(tmp_path / "earlier.db")
    old_verdict = b'{"event_id":"e1","decision":"accept"}'
    with closing(sqlite3.connect(path, isolation_level=None)) as db:
        db.executescript(_EARLIER_EVENTS_TABLE)
        db.execute(
            "INSERT INTO events VALUES ('e1', 'f', 'a1', 'payment', 1, 1, ?, 100, 'CNY', 0,"
            " '[\"k\"]', 1770000000, 1, NULL)",
            (old_verdict,),
        )
    store = SqliteStore(path)
    await store.init()  # creates the missing tables, keeps the earlier one as it is
    try:
        new_verdict = b'{"event_id":"e2","decision":"reject","limits":[]}' * 20
        record = EventRecord("g", "a1", EventType.PAYMENT, False, 2, new_verdict, version=1)
        await store._write(Writes(events={"e2": record}), Expected({}, {}))
        loaded = await store.load(Keys(events={"e1", "e2"}))
        assert loaded.events["e1"].verdict == old_verdict
        assert loaded.events["e1"].buckets == ("k",)
        assert loaded.events["e2"].verdict == new_verdict
        with closing(sqlite3.connect(path)) as db:
            (stored,) = db.execute("SELECT verdict FROM events WHERE id = 'e2'").fetchone()
        assert len(stored) < len(new_verdict) / 4  # kept compressed
    finally:
        await store.close()


_BEFORE_BORN = """
CREATE TABLE buckets (
    key TEXT PRIMARY KEY, count INTEGER NOT NULL, amount INTEGER NOT NULL,
    version INTEGER NOT NULL, period_end INTEGER, expires_at INTEGER
) WITHOUT ROWID;
CREATE TABLE accounts (
    id TEXT PRIMARY KEY, seq INTEGER NOT NULL, version INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE events (
    id TEXT PRIMARY KEY, fingerprint TEXT NOT NULL, account_id TEXT NOT NULL,
    type TEXT NOT NULL, accepted INTEGER NOT NULL, seq INTEGER NOT NULL,
    verdict BLOB NOT NULL, amount INTEGER NOT NULL, currency TEXT,
    reversed INTEGER NOT NULL, buckets TEXT NOT NULL, occurred INTEGER NOT NULL,
    version INTEGER NOT NULL, expires_at INTEGER
);
"""
_DAY_RULES = b"""
rules:
  - {id: day, window: day, currency: CNY, max_amount: "100.00"}
"""


def _file_before_born(path: str) -> None:
    """A file of the version before buckets kept their life: p1 (80.00) counted."""
    p1 = (
        b'{"event_id":"p1","account_id":"a","currency":"CNY","amount":"80.00",'
        b'"occurred_at":"2030-03-17T10:00:00Z"}'
    )
    verdict = b'{"event_id":"p1","decision":"accept"}'
    fingerprint = parse_event(p1).fingerprint
    with closing(sqlite3.connect(path, isolation_level=None)) as db:
        db.executescript(_BEFORE_BORN)
        db.execute("INSERT INTO buckets VALUES ('day|2030-03-17|a', 1, 8000, 1, 1900000000, NULL)")
        db.execute("INSERT INTO accounts VALUES ('a', 1, 1)")
        db.execute(
            "INSERT INTO events VALUES ('p1', ?, 'a', 'payment', 1, 1, ?, 8000, 'CNY', 0,"
            " '[\"day|2030-03-17|a\"]', 1900000000, 1, NULL)",
            (fingerprint, verdict),
        )


async def test_a_file_made_before_buckets_kept_their_life_is_upgraded_and_releases(
    tmp_path: Path,
) -> None:
    path = str(tmp_path / "before.db")
    _file_before_born(path)
    store = open_store(f"sqlite:///{path}")
    await store.init()  # adds the new columns; the rows read them as not known
    try:
        loaded = await store.load(Keys(buckets={"day|2030-03-17|a"}, events={"p1"}))
        assert loaded.buckets["day|2030-03-17|a"].born == 0
        assert loaded.events["p1"].born == ()
        engine = Engine(Decider(parse_rules(_DAY_RULES)), store)
        reversal = (
            b'{"event_id":"r1","type":"reversal","account_id":"a","original_event_id":"p1",'
            b'"occurred_at":"2030-03-17T11:00:00Z"}'
        )
        (result,) = await engine.process([Record(reversal, {"line": 1})])
        assert result.decision is Decision.ACCEPT
        after = await store.load(Keys(buckets={"day|2030-03-17|a"}))
        bucket = after.buckets["day|2030-03-17|a"]
        assert (bucket.count, bucket.amount) == (0, 0)  # a life not known: released
        assert bucket.born > 0  # and now known
    finally:
        await store.close()


def test_processes_opening_a_file_made_before_born_together_all_succeed(
    tmp_path: Path,
) -> None:
    for n in range(3):
        path = str(tmp_path / f"before-{n}.db")
        _file_before_born(path)
        outcomes = _open_together(path)
        assert outcomes == ["ok"] * OPENERS, f"round {n}: {outcomes}"
        with closing(sqlite3.connect(path)) as db:
            for table in ("buckets", "events"):
                columns = [row[1] for row in db.execute(f"PRAGMA table_info({table})")]
                assert columns.count("born") == 1


async def _expiring_store(path: Path, now: list[float]) -> tuple[SqliteStore, Engine]:
    """A sqlite store at ``path`` whose buckets expire after a day and event records
    after two, on the clock ``now[0]``, and an engine of the example rules on it."""
    url = f"sqlite:///{path}?bucket_retention_days=1&event_retention_days=2"
    store = open_store(url, clock=lambda: now[0])
    assert isinstance(store, SqliteStore)
    await store.init()
    rules = load_rules(str(Path(__file__).resolve().parents[2] / "examples" / "rules.yaml"))
    return store, Engine(Decider(rules), store)


async def test_expired_rows_are_deleted_as_commits_go_and_decisions_do_not_change(
    tmp_path: Path,
) -> None:
    # a long-running consumer's file must stop growing once its oldest records expire
    now = [1_900_000_000.0]
    store, engine = await _expiring_store(tmp_path / "purged.db", now)
    payment = _payment

    def rows() -> tuple[int, int]:
        with closing(sqlite3.connect(store.path)) as db:
            events = db.execute("SELECT count(*) FROM events").fetchone()[0]
            buckets = db.execute("SELECT count(*) FROM buckets").fetchone()[0]
        return int(events), int(buckets)

    try:
        # 2030-03-17 is just after `now`: the records expire 2 days (buckets 1 day)
        # after their time or period
        old = [payment(f"old-{n}", "2030-03-17", n) for n in range(5)]
        assert [r.decision for r in await engine.process(old)] == ["accept"] * 5
        assert rows() == (5, 8)  # acct-day, 5 acct-minute, card-month, merchant-hour
        now[0] += 40 * 86_400  # past every expiry, the month bucket's too
        (fresh,) = await engine.process([payment("new-1", "2030-04-26")])
        assert fresh.decision == "accept"
        assert store.expired_deleted == 5 + 8
        assert rows() == (1, 4)  # only new-1's record and buckets are left
        # an old event sent again is decided again, as it was when its record had
        # only expired on read: deletion changes no decision
        (again,) = await engine.process([old[0]])
        assert again.kind is OutcomeKind.VERDICT
    finally:
        await store.close()


class _CommitFails:
    """A store's connection whose next COMMIT fails as on a full disk (the transaction
    is left open, as SQLite leaves one whose commit failed)."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db

    def execute(self, sql: str, *args: Any) -> sqlite3.Cursor:
        if sql == "COMMIT":
            raise sqlite3.OperationalError("database or disk is full")
        return self.db.execute(sql, *args)

    def __getattr__(self, name: str) -> object:
        return getattr(self.db, name)


async def test_a_sweep_whose_commit_failed_deleted_nothing_and_counts_nothing(
    tmp_path: Path,
) -> None:
    # its deletions, rolled back, were counted (limitflow_store_expired_deleted grew
    # with each failed retry of a store outage) and its place in the table kept
    now = [1_900_000_000.0]
    store, engine = await _expiring_store(tmp_path / "swept.db", now)
    try:
        old = [_payment(f"old-{n}", "2030-03-17", n) for n in range(5)]
        assert [r.decision for r in await engine.process(old)] == ["accept"] * 5
        now[0] += 40 * 86_400  # past every expiry
        real = store._db
        places = "SELECT name, value FROM meta WHERE name LIKE 'sweep:%' ORDER BY 1"
        swept = real.execute(places).fetchall()
        store._db = _CommitFails(real)  # type: ignore[assignment]
        with pytest.raises(StoreUnavailable, match="database or disk is full"):
            await engine.process([_payment("new-1", "2030-04-26")])
        store._db = real
        assert (store.expired_deleted, real.execute(places).fetchall()) == (0, swept)
        (fresh,) = await engine.process([_payment("new-1", "2030-04-26")])
        assert fresh.decision == "accept"
        assert store.expired_deleted == 5 + 8
    finally:
        await store.close()


def _as_tuples(snapshot: Snapshot) -> tuple[dict[str, tuple[object, ...]], ...]:
    """Every field of every record of ``snapshot``, to compare two reads."""

    def fields(record: Bucket | Account | EventRecord) -> tuple[object, ...]:
        return tuple(getattr(record, name) for name in record.__struct_fields__)

    return tuple(
        {key: fields(record) for key, record in table.items()}
        for table in (snapshot.buckets, snapshot.accounts, snapshot.events)
    )


async def test_commits_and_reads_larger_than_a_chunk_are_whole_and_refused_whole(
    tmp_path: Path,
) -> None:
    # reads go by chunks of 500 keys, in key order, and a commit makes every statement's
    # parameters before it takes the lock: neither may lose, add or mix up a record,
    # and one stale record among a thousand still refuses all of them
    store = SqliteStore(str(tmp_path / "big.db"), clock=lambda: 1_900_000_000.0)
    await store.init()
    n = 1_234
    bucket_keys = [f"r|2030-03-17|acct-{i}" for i in range(n)]
    account_keys = [f"acct-{i}" for i in range(n // 2)]
    event_keys = [f"evt-{i}" for i in range(n // 3)]

    def event(i: int) -> EventRecord:
        verdict = b'{"event_id":"evt-%d","decision":"accept","limits":[]}' % i
        keys = (bucket_keys[i], bucket_keys[i + 1])
        return EventRecord("f", f"acct-{i}", EventType.PAYMENT, True, i, verdict, 100 + i,
                           "CNY", 0, keys, 1_900_000_000 + i, version=1, born=None)  # fmt: skip

    try:
        await store.commit(
            Writes(
                buckets={
                    key: Bucket(1, i, version=1, period_end=1_900_086_400)
                    for i, key in enumerate(bucket_keys)
                },
                accounts={key: Account(seq=i, version=1) for i, key in enumerate(account_keys)},
                events={key: event(i) for i, key in enumerate(event_keys)},
            )
        )
        absent = {f"nope-{i}" for i in range(300)}
        everything = Keys(
            buckets=set(bucket_keys) | absent,
            accounts=set(account_keys) | absent,
            events=set(event_keys) | absent,
        )
        first = await store.load(everything)
        assert store.round_trips == 1 + 4 + 2 + 2  # the commit, then 1,534, 917, 711 keys
        assert (len(first.buckets), len(first.accounts), len(first.events)) == (
            n,
            n // 2,
            n // 3,
        )
        for i, key in enumerate(bucket_keys):
            bucket = first.buckets[key]
            assert (bucket.count, bucket.amount, bucket.version) == (1, i, 1)
            assert bucket.born == 1_900_000_000
        for i, key in enumerate(account_keys):
            assert (first.accounts[key].seq, first.accounts[key].version) == (i, 1)
        for i, key in enumerate(event_keys):
            got, want = first.events[key], event(i)
            assert (got.verdict, got.seq, got.amount, got.buckets, got.occurred) == (
                want.verdict,
                want.seq,
                want.amount,
                want.buckets,
                want.occurred,
            )
            assert got.born == (1_900_000_000, 1_900_000_000)

        def updated(snapshot: Snapshot, stale: Callable[[Writes], None] | None = None) -> Writes:
            writes = Writes(
                buckets={k: b.copy() for k, b in snapshot.buckets.items()},
                accounts={k: a.copy() for k, a in snapshot.accounts.items()},
                events={k: r.copy() for k, r in snapshot.events.items()},
            )
            for bucket in writes.buckets.values():
                bucket.count, bucket.version = bucket.count + 1, bucket.version + 1
            for account in writes.accounts.values():
                account.seq, account.version = account.seq + 1, account.version + 1
            for record in writes.events.values():
                record.reversed, record.version = 1, record.version + 1
            if stale is not None:
                stale(writes)
            return writes

        def stale_bucket(writes: Writes) -> None:
            writes.buckets[bucket_keys[n - 1]].version = 1  # as if it were read at 0

        def stale_account(writes: Writes) -> None:
            writes.accounts[account_keys[0]].version = 3  # as if read at version 2

        def stale_event(writes: Writes) -> None:
            writes.events[event_keys[200]].expires_at = 1  # another life of the record

        for stale in (stale_bucket, stale_account, stale_event):
            with pytest.raises(ConflictError):
                await store.commit(updated(await store.load(everything), stale))
            assert _as_tuples(await store.load(everything)) == _as_tuples(first)
        await store.commit(updated(await store.load(everything)))
        after = await store.load(everything)
        assert {b.version for b in after.buckets.values()} == {2}
        assert {b.count for b in after.buckets.values()} == {2}
        assert {a.version for a in after.accounts.values()} == {2}
        assert {(r.version, r.reversed) for r in after.events.values()} == {(2, 1)}
    finally:
        await store.close()


def _sample_records() -> list[Record]:
    examples = Path(__file__).resolve().parents[2] / "examples"
    lines = (examples / "events.jsonl").read_bytes().splitlines()
    return [Record(line, {"line": n}) for n, line in enumerate(lines, start=1) if line.strip()]


async def test_verdicts_are_kept_against_the_files_dictionary_which_every_store_reads(
    tmp_path: Path,
) -> None:
    path = str(tmp_path / "dictionary.db")
    rules = load_rules(str(Path(__file__).resolve().parents[2] / "examples" / "rules.yaml"))
    records = _sample_records()
    first = SqliteStore(path)
    await first.init()
    with closing(sqlite3.connect(path, isolation_level=None)) as db:
        db.execute("DROP TABLE meta")  # as in a file made before it: the first commit adds it
    second = SqliteStore(path)  # as another process sharing the file
    try:
        results = await Engine(Decider(rules), first).process(records)
        verdicts = [r.verdict for r in results if r.verdict is not None]
        assert len(verdicts) > 5
        # the other store reads the dictionary from the file: the same bytes come back
        again = await Engine(Decider(rules), second).process(records)
        assert [r.verdict for r in again if r.verdict is not None] == verdicts
        assert {r.kind for r in again if r.verdict is not None} == {OutcomeKind.DUPLICATE}
        with closing(sqlite3.connect(path)) as db:
            stored = [bytes(v) for (v,) in db.execute("SELECT verdict FROM events")]
            dictionaries = db.execute(
                "SELECT count(*) FROM meta WHERE name = 'verdict_dictionary'"
            ).fetchone()[0]
        assert dictionaries == 1
        assert stored and all(v[:1] == b"\x01" for v in stored)
        assert sum(map(len, stored)) < sum(map(len, verdicts)) / 4
    finally:
        await first.close()
        await second.close()


async def test_a_verdict_whose_dictionary_is_gone_is_refused_not_misread(tmp_path: Path) -> None:
    path = str(tmp_path / "lost.db")
    rules = load_rules(str(Path(__file__).resolve().parents[2] / "examples" / "rules.yaml"))
    records = _sample_records()
    store = SqliteStore(path)
    await store.init()
    await Engine(Decider(rules), store).process(records[:1])
    await store.close()
    with closing(sqlite3.connect(path, isolation_level=None)) as db:
        db.execute("DELETE FROM meta")
        (event_id,) = db.execute("SELECT id FROM events").fetchone()
    reader = SqliteStore(path)
    try:
        with pytest.raises(StoreRejected, match="dictionary"):
            await reader.load(Keys(events={event_id}))
    finally:
        await reader.close()


def _payment(event_id: str, day: str, minute: int = 0) -> Record:
    doc = (
        f'{{"event_id": "{event_id}", "account_id": "a1", "card_id": "c1",'
        f' "merchant_id": "m1", "amount": "10.00", "currency": "CNY",'
        f' "occurred_at": "{day}T10:{minute:02d}:00Z"}}'
    )
    return Record(doc.encode(), {"line": 1})


def _floors(path: str) -> dict[str, int]:
    with closing(sqlite3.connect(path)) as db:
        rows = db.execute("SELECT name, value FROM meta WHERE name LIKE 'expiry_floor:%'")
        return {name.split(":")[1]: value for name, value in rows}


async def test_no_sweep_runs_while_nothing_can_have_expired(tmp_path: Path) -> None:
    # a new file's rows cannot expire before their writer's clock plus the retention:
    # until then a commit looks for no expired row (a replay of recent events never does)
    now = [1_900_000_000.0]
    path = str(tmp_path / "floor.db")
    store = open_store(
        f"sqlite:///{path}?bucket_retention_days=1&event_retention_days=2", clock=lambda: now[0]
    )
    assert isinstance(store, SqliteStore)
    await store.init()
    rules = load_rules(str(Path(__file__).resolve().parents[2] / "examples" / "rules.yaml"))
    engine = Engine(Decider(rules), store)
    statements: list[str] = []
    store._db.set_trace_callback(statements.append)

    def swept() -> set[str]:
        found = {table for table in ("buckets", "events") for s in statements
                 if s.startswith(f"DELETE FROM {table}")}  # fmt: skip
        statements.clear()
        return found

    try:
        await engine.process([_payment("p1", "2030-03-17", 0)])
        assert _floors(path) == {"buckets": 1_900_086_400, "events": 1_900_172_800}
        assert swept() == set()
        now[0] += 43_200  # half a day: nothing can have expired yet
        await engine.process([_payment("p2", "2030-03-18", 1)])
        assert swept() == set()
        assert _floors(path) == {"buckets": 1_900_086_400, "events": 1_900_172_800}
        now[0] += 86_400  # past the buckets' floor, not the records'
        await engine.process([_payment("p3", "2030-03-19", 2)])
        assert swept() == {"buckets"}
        now[0] += 40 * 86_400
        await engine.process([_payment("p4", "2030-04-28", 3)])
        assert swept() == {"buckets", "events"}
        assert store.expired_deleted > 0
        with closing(sqlite3.connect(path)) as db:
            left = {row[0] for row in db.execute("SELECT id FROM events")}
        assert left == {"p4"}
    finally:
        await store.close()


async def test_each_process_sweeps_on_from_where_the_last_one_stopped(tmp_path: Path) -> None:
    # a replay a day, each of fewer events than the file holds: every run's sweep began at
    # the table's start, among the live rows there, and never reached the expired ones
    # past them (a file of 3,000 events a day with 4 days' retention held 57,000 records
    # after 30 days, 45,000 of them expired, and grew by 1,750 a day)
    now = [1_900_000_000.0]  # 2030-03-17
    path = str(tmp_path / "daily.db")
    url = f"sqlite:///{path}?bucket_retention_days=1&event_retention_days=2"
    rules = parse_rules("rules: [{id: r, scope: account_id, window: day, max_count: 1000000}]")

    async def run(events: list[Record]) -> None:  # one process: a store of its own
        store = open_store(url, clock=lambda: now[0])
        await store.init()
        try:
            await Engine(Decider(rules), store).process(events)
        finally:
            await store.close()

    def left(prefix: str) -> int:
        with closing(sqlite3.connect(path)) as db:
            found = db.execute("SELECT count(*) FROM events WHERE id LIKE ?", (prefix + "%",))
            return int(found.fetchone()[0])

    await run([_payment(f"m-{n:03}", "2030-03-17", n % 60) for n in range(300)])
    # still live when the m- records have expired; first in key order
    await run([_payment(f"a-{n:03}", "2030-05-20", n % 60) for n in range(300)])
    now[0] += 40 * 86_400  # 2030-04-26: the m- records have expired, the a- ones not
    for day in range(8):
        await run([_payment(f"b-{day}", "2030-04-26", day)])
    assert (left("a-"), left("m-")) == (300, 0)


async def test_a_file_without_floors_gets_them_from_its_rows(tmp_path: Path) -> None:
    now = [1_900_000_000.0]
    path = str(tmp_path / "no-floors.db")
    store = open_store(f"sqlite:///{path}", clock=lambda: now[0])
    await store.init()
    rules = load_rules(str(Path(__file__).resolve().parents[2] / "examples" / "rules.yaml"))
    engine = Engine(Decider(rules), store)
    try:
        await engine.process([_payment("p1", "2030-03-17", 0), _payment("p2", "2030-03-17", 1)])
        with closing(sqlite3.connect(path, isolation_level=None)) as db:
            # as in a file of an earlier version, with a row already expired
            db.execute("DELETE FROM meta WHERE name LIKE 'expiry_floor:%'")
            db.execute("UPDATE events SET expires_at = 1800000000 WHERE id = 'p1'")
        await engine.process([_payment("p3", "2030-03-17", 2)])
        with closing(sqlite3.connect(path)) as db:
            left = {row[0] for row in db.execute("SELECT id FROM events")}
        assert left == {"p2", "p3"}  # p1 found and deleted
        assert _floors(path)["events"] <= 1_900_000_000 + 400 * 86_400
    finally:
        await store.close()


async def test_new_files_have_8_kb_pages_and_files_made_before_keep_theirs(
    tmp_path: Path,
) -> None:
    rules = load_rules(str(Path(__file__).resolve().parents[2] / "examples" / "rules.yaml"))
    older = str(tmp_path / "older.db")
    with closing(sqlite3.connect(older, isolation_level=None)) as db:
        db.execute("PRAGMA page_size=4096")
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("CREATE TABLE t (x)")  # the file now exists, with 4 KB pages
    for path, page in ((str(tmp_path / "new.db"), 8192), (older, 4096)):
        store = SqliteStore(path)
        await store.init()
        try:
            results = await Engine(Decider(rules), store).process(_sample_records())
            assert any(r.decision == "accept" for r in results)
        finally:
            await store.close()
        with closing(sqlite3.connect(path)) as db:
            assert db.execute("PRAGMA page_size").fetchone()[0] == page


async def test_a_consumer_keeping_a_new_rule_waits_for_another_process_s_commit(
    tmp_path: Path,
) -> None:
    # a consumer's commits wait 1 s for the lock and retry; its start, keeping a rule new
    # to the file, failed after that second while another process committed
    import threading

    from stores.sqlite import CONSUMER_LOCK_WAIT

    path = str(tmp_path / "shared.db")
    store = SqliteStore(path, lock_wait=CONSUMER_LOCK_WAIT)
    await store.init()
    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN IMMEDIATE")
    letting_go = threading.Timer(2.5, holder.execute, ("ROLLBACK",))
    letting_go.start()
    try:
        assert await store.keep_rules(parse_rules(_DAY_RULES)) == 0
    finally:
        letting_go.join()
        holder.close()
        await store.close()


@pytest.mark.parametrize("how", ["deleted", "replaced", "folder renamed"])
async def test_a_commit_to_a_file_no_longer_at_its_path_is_refused(
    tmp_path: Path, how: str
) -> None:
    # SQLite in WAL mode goes on committing to a file deleted or replaced under it: a
    # replay or a run went on deciding, publishing and committing offsets into an
    # inode no process would open again, and its next start had none of those counters
    folder = tmp_path / "state"
    folder.mkdir()
    path = folder / "store.db"
    store, engine = await _expiring_store(path, [1_900_000_000.0])
    try:
        (first,) = await engine.process([_payment("e-1", "2030-03-17")])
        assert first.decision == "accept"
        if how == "deleted":
            path.unlink()
        elif how == "replaced":
            other = tmp_path / "other.db"
            with closing(sqlite3.connect(other)) as db:
                db.execute("CREATE TABLE t (x)")
            other.replace(path)
        else:
            folder.rename(tmp_path / "moved")
        with pytest.raises(StoreRejected, match="no longer at its path"):
            await engine.process([_payment("e-2", "2030-03-17", 1)])
        assert not store._db.in_transaction
    finally:
        await store.close()


@pytest.mark.parametrize("looked_at", ["store.db", "store.db-wal"])
async def test_a_file_that_cannot_be_looked_at_for_a_while_is_an_outage_not_a_move(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, looked_at: str
) -> None:
    # a stat that failed for another reason than "no such file" (a folder unreadable for
    # a while, an NFS ESTALE) was read as the file gone: `run` stopped for good, exit 3
    path = tmp_path / "store.db"
    store, engine = await _expiring_store(path, [1_900_000_000.0])
    real_stat = os.stat

    def failing(name: str, *args: Any, **kwargs: Any) -> os.stat_result:
        if os.path.basename(name) == looked_at:
            raise PermissionError(13, "Permission denied", name)
        return real_stat(name, *args, **kwargs)

    try:
        (first,) = await engine.process([_payment("e-1", "2030-03-17")])
        with monkeypatch.context() as patched:
            patched.setattr(os, "stat", failing)  # the store's, and every other's
            with pytest.raises(StoreUnavailable, match="cannot look at"):
                await engine.process([_payment("e-2", "2030-03-17", 1)])
        assert not store._db.in_transaction
        (second,) = await engine.process([_payment("e-2", "2030-03-17", 1)])  # retried
        assert (first.decision, second.decision) == ("accept", "accept")
    finally:
        await store.close()


@pytest.mark.parametrize("suffix", ["-wal", "-shm"])
async def test_a_commit_after_the_files_wal_or_shm_was_deleted_is_refused(
    tmp_path: Path, suffix: str
) -> None:
    # a deleted -wal took the commits since the last checkpoint with it at a crash
    # (kill -9 of a replay: its verdicts written, its file without even its tables), and
    # another process opening the file made new ones: with a -shm of its own, the two
    # no longer excluded each other's writes
    path = tmp_path / "store.db"
    store, engine = await _expiring_store(path, [1_900_000_000.0])
    try:
        (first,) = await engine.process([_payment("e-1", "2030-03-17")])
        assert first.decision == "accept"
        Path(f"{path}{suffix}").unlink()
        with pytest.raises(StoreRejected, match=f"its {suffix} file"):
            await engine.process([_payment("e-2", "2030-03-17", 1)])
        assert not store._db.in_transaction
    finally:
        await store.close()


async def test_a_file_opened_read_only_is_refused_for_good_not_retried(tmp_path: Path) -> None:
    # SQLite opens a file it may not write read-only, and its connection stays so: a run
    # on it retried every batch for ever (waiting on decide), also once the file's mode
    # was mended, where a restart would have opened it for writing
    path = tmp_path / "store.db"
    store, engine = await _expiring_store(path, [1_900_000_000.0])
    try:
        writable = store._db
        store._db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, isolation_level=None)
        with pytest.raises(StoreRejected, match="opened read-only"):
            await engine.process([_payment("e-1", "2030-03-17")])
        assert not store._db.in_transaction
        store._db.close()
        store._db = writable
    finally:
        await store.close()


@pytest.mark.parametrize("suffix", ["-wal", "-shm"])
async def test_a_deleted_wal_or_shm_is_refused_also_through_a_symlinked_path(
    tmp_path: Path, suffix: str
) -> None:
    # SQLite resolves a symbolic link to the database and keeps its -wal and -shm beside
    # the file linked to, not beside the link: looked for beside the link, none was ever
    # found, and a -wal deleted went unnoticed (the commits since the last checkpoint
    # lost at a crash, as without the check)
    (tmp_path / "real").mkdir()
    link = tmp_path / "store.db"
    link.symlink_to(tmp_path / "real" / "store.db")
    store, engine = await _expiring_store(link, [1_900_000_000.0])
    try:
        (first,) = await engine.process([_payment("e-1", "2030-03-17")])
        assert first.decision == "accept"
        Path(f"{tmp_path / 'real' / 'store.db'}{suffix}").unlink()
        with pytest.raises(StoreRejected, match=f"its {suffix} file"):
            await engine.process([_payment("e-2", "2030-03-17", 1)])
        assert not store._db.in_transaction
    finally:
        await store.close()
