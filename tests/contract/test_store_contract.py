"""The store contract, run unchanged against every backend."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import sqlite3
from collections.abc import Callable
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from benchmarks.generate import events as generated_events
from handlers.decide import MAX_APPLICABLE_RULES, MAX_KEY_BYTES, Decider, OutcomeKind
from handlers.state import Account, Bucket, EventRecord, Keys, Snapshot, WorkingState, Writes
from limitflow.errors import ConflictError, StoreRejected
from schemas.events import EventRejected, EventType, parse_event
from schemas.rules import RuleChanged, RuleSet, load_rules, parse_rules
from schemas.verdicts import Decision
from stores import open_store
from stores.base import CountersLive, Store
from stores.dry_run import DryRunStore
from stores.dynamo import DynamoStore
from stores.memory import MemoryStore
from stores.mongo import MongoStore
from stores.sqlite import SqliteStore
from streams.engine import Engine, Record, Result
from tests.oracle.generate import Case
from tests.oracle.generate import case as oracle_case
from tests.oracle.model import EXPIRIES
from tests.unit.test_oracle import ASKED as ORACLE_ASKED
from tests.unit.test_oracle import FRESH_SEED as ORACLE_FRESH_SEED
from tests.unit.test_oracle import RETENTION as ORACLE_RETENTION
from tests.unit.test_oracle import differences as oracle_differences
from tests.unit.test_oracle import expiring as oracle_expiring
from tests.unit.test_oracle import expiry_reached as oracle_expiry_reached
from tests.unit.test_oracle import nonblank as oracle_nonblank
from tests.unit.test_oracle import report as oracle_report
from tests.unit.test_oracle import unreached as oracle_unreached

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
ORACLE_SEEDS = (91, 155, 256, 362)  # of test_oracle's fixed seeds: together, every outcome
EXPIRY_SEEDS = (90, 143)  # each reaches every expiry, on either clock


def expiry_seeds() -> list[Any]:
    """The fixed seeds and a fresh one, or the one ``LIMITFLOW_ORACLE_SEED`` asks for."""
    if ORACLE_ASKED:
        return [pytest.param(int(ORACLE_ASKED), id=f"seed={ORACLE_ASKED}")]
    fixed = [pytest.param(seed, id=f"seed={seed}") for seed in EXPIRY_SEEDS]
    return [*fixed, pytest.param(ORACLE_FRESH_SEED, id="fresh")]


async def opened(url: str, clock: float | Callable[[], float] | None = None) -> Store:
    """A store of ``url``, initialised, on the wall clock or on ``clock``: a time, or
    what tells it."""
    if clock is None:
        store = open_store(url)
    else:
        store = open_store(url, clock=clock if callable(clock) else lambda: clock)
    await store.init()
    return store


def lines_of(path: Path) -> list[bytes]:
    return [line for line in path.read_bytes().splitlines() if line.strip()]


async def decide_all(store: Store, lines: list[bytes], batch: int) -> list[tuple[str, bytes]]:
    """(kind, verdict bytes or dead-letter code) per line, through the engine."""
    engine = Engine(Decider(load_rules(str(EXAMPLES / "rules.yaml"))), store)
    records = [Record(line, {"line": n}) for n, line in enumerate(lines, 1)]
    out: list[tuple[str, bytes]] = []
    for start in range(0, len(records), batch):
        for result in await engine.process(records[start : start + batch]):
            if result.kind is OutcomeKind.DEAD_LETTER:
                out.append(("dead", str(result.error).encode()))
            else:
                assert result.verdict is not None
                out.append(("verdict", result.verdict))
    return out


async def test_a_dry_run_decides_as_a_replay_would_and_changes_nothing(store_url: str) -> None:
    """``DryRunStore`` over each backend: the verdicts the rest of a stream would get
    now, each batch seeing the earlier ones', with the store underneath untouched."""
    lines = generated_events(300, accounts=8, seed=5)
    first, rest = lines[:150], lines[150:]
    store = await opened(store_url)
    try:
        await decide_all(store, first, batch=50)
        everything = Keys(
            buckets=set(),
            accounts={f"acct-{n}" for n in range(8)},
            events={json.loads(line)["event_id"] for line in lines},
        )
        plans = Decider(load_rules(str(EXAMPLES / "rules.yaml")))
        for line in lines:
            event = parse_event(line)
            everything.buckets |= plans.keys([event], [plans.plan(event)]).buckets
        before = await store.load(everything)
        dry = await decide_all(DryRunStore(store), rest, batch=40)
        assert await store.load(everything) == before
        assert await decide_all(store, rest, batch=40) == dry  # stored this time
        assert await store.load(everything) != before
    finally:
        await store.close()


def record(event_id: str, version: int) -> EventRecord:
    return EventRecord(
        fingerprint="f",
        account_id="a",
        type=EventType.PAYMENT,
        accepted=True,
        seq=1,
        verdict=b"{}",
        occurred=1_770_000_000,
        version=version,
    )


async def test_example_gives_the_same_outputs_as_memory(store_url: str) -> None:
    lines = lines_of(EXAMPLES / "events.jsonl")
    expected = await decide_all(await opened("memory://"), lines, batch=4)
    store = await opened(store_url)
    try:
        assert await decide_all(store, lines, batch=4) == expected
    finally:
        await store.close()


async def test_generated_stream_matches_memory_and_resend_changes_nothing(
    store_url: str,
) -> None:
    # small accounts pool: limits bite, reversals and resends hit earlier batches
    lines = generated_events(600, accounts=15, seed=3)
    expected = await decide_all(await opened("memory://"), lines, batch=150)
    assert {kind for kind, _ in expected} == {"verdict"}
    verdicts = [json.loads(v) for _, v in expected]
    assert {v["decision"] for v in verdicts} == {"accept", "reject"}
    assert any(v["type"] == "reversal" and v["decision"] == "accept" for v in verdicts)
    store = await opened(store_url)
    try:
        assert await decide_all(store, lines, batch=150) == expected
        # the whole stream again (a backfill replay): identical verdicts, no state change
        keys = Keys(accounts={"acct-1", "acct-2"})
        before = await store.load(keys)
        assert await decide_all(store, lines, batch=150) == expected
        after = await store.load(keys)
        assert after.accounts == before.accounts
    finally:
        await store.close()


@pytest.mark.parametrize("seed", ORACLE_SEEDS)
async def test_the_oracle_cases_are_decided_as_the_model_says(
    store_url: str, seed: int, tmp_path: Path
) -> None:
    """The oracle's random cases (``tests/oracle``: zones around DST, ISO weeks and month
    ends, JPY and KWD amounts, scope values sent as numbers, reversals of every outcome,
    resends, invalid lines) through the engine on each backend, in batches of 9: every
    line as the reference model says, a resend's verdict byte for byte its first."""
    generated = oracle_case(seed)
    rules = loaded_oracle_rules(generated, tmp_path)
    engine = Engine(Decider(rules), store := await opened(with_retention(store_url)))
    try:
        records = [Record(line.encode(), {"line": n}) for n, line in oracle_nonblank(generated)]
        verdicts: list[bytes] = []
        letters: list[dict[str, Any]] = []
        for start in range(0, len(records), 9):
            sort_out(await engine.process(records[start : start + 9]), verdicts, letters)
    finally:
        await store.close()
    found = oracle_differences(seed, generated, verdicts, letters, rules.version)
    assert not found, f"{store_url}: {oracle_report(seed, found, len(generated.lines))}"


def loaded_oracle_rules(generated: Case, directory: Path) -> RuleSet:
    """The case's rules, read from a file in ``directory`` as a user's would be."""
    path = directory / "rules.yaml"
    path.write_text(generated.rules_text(), encoding="utf-8")
    return load_rules(str(path))


def sort_out(results: list[Result], verdicts: list[bytes], letters: list[dict[str, Any]]) -> None:
    """``results`` as ``limitflow replay`` writes them: each verdict's bytes to
    ``verdicts``, each dead letter to ``letters``."""
    for result in results:
        if result.kind is OutcomeKind.DEAD_LETTER:
            raw = result.record.raw.decode()
            error, detail = str(result.error), result.detail
            letters.append(
                {"source": result.record.source, "error": error, "raw": raw, "detail": detail}
            )
        else:
            assert result.verdict is not None
            verdicts.append(result.verdict)


def test_the_oracle_seeds_reach_every_outcome() -> None:
    assert not oracle_unreached(ORACLE_SEEDS)


@pytest.mark.parametrize("split", [False, True], ids=["commits", "split"])
@pytest.mark.parametrize("seed", expiry_seeds())
async def test_the_oracle_cases_expire_as_the_model_says(
    store_url: str, seed: int, split: bool, tmp_path: Path
) -> None:
    """Retention, on random cases: the store's clock moves between batches of 9, by
    minutes, hours or days, and the retentions are hours to days (``tests.oracle.generate.
    clock``), so that buckets expire and begin again with late payments, idempotency
    records expire (a resend is decided again, a reversal finds no original), records
    outlive their own retention for a bucket they counted in, and reversals find their
    payment's bucket expired or in a new life. Every line as the model says (README,
    *State stores*). The embedded stores' clock starts about the case's first event time,
    so that events come both before and after it; the servers' in 2100, after every
    event and after today, since their own TTL deletes by the wall clock.

    The model stores each batch at once; the engine commits a batch in parts where the
    store takes fewer records at once (DynamoDB: 100), each part on the batch's clock.
    ``split``: the store takes the fewest that every event of the case fits in (its
    rules, its account, its record and a reversed original's), so that many batches are
    committed in parts, and must still decide every line as the model does."""
    generated = oracle_case(seed)
    embedded = store_url.startswith(("memory:", "sqlite:"))
    plan = oracle_expiring(seed, generated, 9, far=not embedded)
    rules = loaded_oracle_rules(generated, tmp_path)
    now = [0]  # the store's clock: the batch's time
    store = await opened(with_retention(store_url, plan.clock.query), lambda: now[0])
    retention = store.retention
    assert (retention.bucket_seconds, retention.event_seconds) == plan.clock.retention
    if split:
        store.max_records_per_commit = widest(rules, generated) + 3
    engine = Engine(Decider(rules), store)
    verdicts: list[bytes] = []
    letters: list[dict[str, Any]] = []
    parted = 0  # batches committed in more than one part
    try:
        for now[0], batch in zip(plan.clock.times, plan.batches, strict=True):
            records = [Record(line.encode(), {"line": n}) for n, line in batch]
            commits = engine.stats.commits
            sort_out(await engine.process(records), verdicts, letters)
            parted += engine.stats.commits - commits > 1
    finally:
        await store.close()
    found = oracle_differences(seed, generated, verdicts, letters, rules.version, plan)
    split_option = " and split" if split else " and commits"
    alone = (
        f"LIMITFLOW_ORACLE_SEED={seed} .venv/bin/pytest tests/contract -k 'expire_as{split_option}'"
    )
    assert not found, f"{store_url}: {oracle_report(seed, found, len(generated.lines), alone)}"
    if split:
        assert parted, "no batch was committed in parts"  # 3 or more in 1,000 seeds


def widest(rules: RuleSet, generated: Case) -> int:
    """The most rules that apply to one event of ``generated``."""
    decider = Decider(rules)
    plans = []
    for _, line in oracle_nonblank(generated):
        with contextlib.suppress(EventRejected):
            plans.append(decider.plan(parse_event(line.encode())))
    return max(map(len, plans), default=0)


@pytest.mark.parametrize("far", [False, True], ids=["embedded", "servers"])
def test_the_expiry_seeds_reach_every_expiry(far: bool) -> None:
    for seed in EXPIRY_SEEDS:
        assert oracle_expiry_reached(seed, 9, far=far) == EXPIRIES, seed


def with_retention(url: str, retention: str = ORACLE_RETENTION) -> str:
    """``url`` with ``retention`` (by default the oracle tests' own, the defaults named:
    ``tests.unit.test_oracle.RETENTION``)."""
    return url + ("&" if "?" in url else "?") + retention


async def test_state_survives_reopening(store_url: str) -> None:
    if store_url.startswith("memory:"):
        pytest.skip("memory:// is not durable by design")
    lines = lines_of(EXAMPLES / "events.jsonl")
    expected = await decide_all(await opened("memory://"), lines, batch=100)
    first = await opened(store_url)
    await decide_all(first, lines[:5], batch=100)
    await first.close()
    second = await opened(store_url)
    try:
        assert await decide_all(second, lines[5:], batch=100) == expected[5:]
    finally:
        await second.close()


async def test_stale_write_is_refused_and_changes_nothing(store_url: str) -> None:
    store = await opened(store_url)
    try:
        await store.commit(
            Writes(
                buckets={"r|2026-01-01|a": Bucket(1, 100, version=1, period_end=1_900_000_000)},
                accounts={"a": Account(seq=1, version=1)},
                events={"e1": record("e1", 1)},
            )
        )
        # a zombie that read before that commit tries to create the same bucket again,
        # together with records that would otherwise be fine: all of it is refused
        zombie = Writes(
            buckets={
                "r|2026-01-01|a": Bucket(5, 500, version=1, period_end=1_900_000_000),
                "r|2026-01-01|b": Bucket(1, 10, version=1, period_end=1_900_000_000),
            },
            events={"e2": record("e2", 1)},
        )
        with pytest.raises(ConflictError):
            await store.commit(zombie)
        # and one that read version 1 but writes after someone else moved it to 2
        keys = Keys(buckets={"r|2026-01-01|a"})
        first = (await store.load(keys)).buckets["r|2026-01-01|a"]
        late = (await store.load(keys)).buckets["r|2026-01-01|a"]
        first.count, first.amount, first.version = 2, 200, 2
        await store.commit(Writes(buckets={"r|2026-01-01|a": first}))
        late.count, late.amount, late.version = 9, 900, 2
        with pytest.raises(ConflictError):
            await store.commit(Writes(buckets={"r|2026-01-01|a": late}))
        got = await store.load(
            Keys(buckets={"r|2026-01-01|a", "r|2026-01-01|b"}, events={"e1", "e2"})
        )
        assert set(got.buckets) == {"r|2026-01-01|a"}
        bucket = got.buckets["r|2026-01-01|a"]
        assert (bucket.count, bucket.amount, bucket.version) == (2, 200, 2)
        assert set(got.events) == {"e1"}
    finally:
        await store.close()


async def test_expired_records_read_as_absent_and_can_be_replaced(store_url: str) -> None:
    day = 86_400
    now = 1_800_000_000.0
    store = await opened(
        store_url + ("&" if "?" in store_url else "?") + "bucket_retention_days=1", clock=now
    )
    try:
        await store.commit(
            Writes(
                buckets={"r|d|a": Bucket(3, 300, version=1, period_end=int(now) + 60)},
                events={"e1": record("e1", 1)},
            )
        )
        fresh = await store.load(Keys(buckets={"r|d|a"}, events={"e1"}))
        assert fresh.buckets["r|d|a"].count == 3
        assert "e1" in fresh.events
    finally:
        await store.close()
    later = await opened(
        store_url + ("&" if "?" in store_url else "?") + "bucket_retention_days=1",
        clock=now + 2 * day,
    )
    if store_url.startswith("memory:"):
        later = store  # the same process-local state, read with a later clock
        later._clock = lambda: now + 2 * day
    try:
        stale = await later.load(Keys(buckets={"r|d|a"}, events={"e1"}))
        bucket = stale.buckets["r|d|a"]
        assert (bucket.count, bucket.amount, bucket.version) == (0, 0, 1)
        assert "e1" in stale.events  # event records live 400 days by default
        # replacing it is conditioned on the expired record, still stored, read as it is
        bucket.count, bucket.amount, bucket.version = 1, 5, 2
        await later.commit(Writes(buckets={"r|d|a": bucket}))
        again = await later.load(Keys(buckets={"r|d|a"}))
        assert again.buckets["r|d|a"].count == 1
        assert again.buckets["r|d|a"].expires_at is None  # lifetime buckets never expire
    finally:
        await later.close()


async def test_events_at_the_edges_of_time_are_stored_and_decided_again(store_url: str) -> None:
    # the last accepted event time plus 400 days of retention is past year 9999, which
    # MongoDB's driver cannot hold: expiry stops at 9999-12-31 in every store
    lines = [
        json.dumps(
            {
                "event_id": f"edge-{n}",
                "account_id": "a1",
                "amount": "1.00",
                "currency": "CNY",
                "occurred_at": at,
                "channel": "atm",
            }
        ).encode()
        for n, at in enumerate(["9999-12-30T12:00:00Z", "0001-01-02T00:00:00Z"])
    ]
    store = await opened(store_url)
    try:
        first = await decide_all(store, lines, batch=10)
        assert [kind for kind, _ in first] == ["verdict", "verdict"]
        assert await decide_all(store, lines, batch=10) == first  # duplicates, from the store
    finally:
        await store.close()


async def test_a_scope_value_too_long_for_a_key_is_a_dead_letter_everywhere(
    store_url: str,
) -> None:
    # 2,500 bytes: DynamoDB refuses keys over 2,048, which stopped `run` on every retry
    payment = {
        "event_id": "long",
        "account_id": "a1",
        "amount": "1.00",
        "currency": "CNY",
        "occurred_at": "2026-03-14T10:00:00Z",
        "merchant_id": "m" * 2500,
    }
    lines = [
        json.dumps(payment).encode(),
        json.dumps({**payment, "event_id": "ok", "merchant_id": "m1"}).encode(),
    ]
    store = await opened(store_url)
    try:
        out = await decide_all(store, lines, batch=10)
        assert [kind for kind, _ in out] == ["dead", "verdict"]
        assert out[0][1] == b"invalid_event"
    finally:
        await store.close()


def _wide_rules(count: int) -> bytes:
    """``count`` rules that all apply to a CNY payment, with the longest rule ids."""
    rules = [
        {
            "id": f"{n:04d}-" + "r" * 59,
            "scope": "merchant_id",
            "window": "day",
            "currency": "CNY",
            "max_count": 1_000,
            "max_amount": "9999999999999.99",
        }
        for n in range(count)
    ]
    return json.dumps({"rules": rules}).encode()


async def test_the_widest_event_a_store_allows_is_stored_reversed_and_resent(
    store_url: str,
) -> None:
    # every rule the store allows applies, each with a bucket key of MAX_KEY_BYTES: the
    # largest verdicts, records and commits limitflow can make must be stored, on retry
    # too; one rule more is a dead letter, never a store refusal that stops `run`
    store = await opened(store_url)
    try:
        limit = store.max_records_per_commit
        widest = MAX_APPLICABLE_RULES if limit is None else min(MAX_APPLICABLE_RULES, limit - 3)
        padding = MAX_KEY_BYTES - len("0000-" + "r" * 59 + "|2026-03-14|") - 1

        def payment(n: int) -> dict[str, object]:
            return {
                "event_id": f"p{n}",
                "account_id": "a1",
                "amount": "1.00",
                "currency": "CNY",
                "occurred_at": "2026-03-14T10:00:00Z",
                "merchant_id": str(n) + "m" * padding,
            }

        lines = [json.dumps(payment(n)).encode() for n in range(3)]
        lines.append(
            json.dumps(
                {
                    "event_id": "r0",
                    "type": "reversal",
                    "account_id": "a1",
                    "original_event_id": "p0",
                    "occurred_at": "2026-03-14T11:00:00Z",
                }
            ).encode()
        )
        engine = Engine(Decider(parse_rules(_wide_rules(widest))), store)
        assert engine.max_applicable == widest
        records = [Record(line, {"line": n}) for n, line in enumerate(lines, 1)]
        first = await engine.process(records)
        assert [r.decision for r in first] == ["accept"] * 4
        payment_verdict = json.loads(first[1].verdict or b"")
        assert len(payment_verdict["limits"]) == widest
        assert all(limit["count_used"] == 1 for limit in payment_verdict["limits"])
        again = await Engine(Decider(parse_rules(_wide_rules(widest))), store).process(records)
        assert [r.kind for r in again] == [OutcomeKind.DUPLICATE] * 4
        assert [r.verdict for r in again] == [r.verdict for r in first]

        wider = Engine(Decider(parse_rules(_wide_rules(widest + 1))), store)
        new = Record(json.dumps(payment(9)).encode(), {"line": 5})
        dead, resent = await wider.process([new, records[1]])
        assert dead.kind is OutcomeKind.DEAD_LETTER
        assert dead.detail is not None
        assert f"{widest + 1} rules apply to this event; at most {widest}" in dead.detail
        # one decided before the rules grew is still a duplicate with its verdict
        assert (resent.kind, resent.verdict) == (OutcomeKind.DUPLICATE, first[1].verdict)
    finally:
        await store.close()


async def test_init_is_idempotent(store_url: str) -> None:
    store = await opened(store_url)
    try:
        await store.init()
        await store.check()
    finally:
        await store.close()


# -- TTL deletion versus a writer that read before it (the "TTL ABA") -------------------
#
# MongoDB's TTL monitor, DynamoDB's TTL and sqlite's commits (a sweep) delete expired
# records late, at any moment; memory never does, but an operator may delete by hand. A
# record created again after such a deletion starts over at version 1, so a writer that
# read the old record must not be able to commit over the new one just because the
# version numbers coincide.

NOW = 1_900_000_000.0
"""Far ahead of the real clock, so a real TTL monitor never deletes these records."""
LATER = NOW + 3 * 86_400
SHORT = "bucket_retention_days=1&event_retention_days=1"
BUCKET = "r|d|a"


async def handles(url: str, *clocks: float) -> list[Store]:
    """Stores on the same data, each with its own expiry clock (one per writer)."""
    url += ("&" if "?" in url else "?") + SHORT
    stores = [await opened(url, clock) for clock in clocks]
    first = stores[0]
    for other in stores[1:]:
        if isinstance(first, MemoryStore) and isinstance(other, MemoryStore):
            other.data = first.data
    return stores


async def purge(store: Store, bucket: str | None, event: str) -> None:
    """Delete a bucket (unless None) and an event record behind every writer's back (TTL
    deletion)."""
    if isinstance(store, MemoryStore):
        if bucket is not None:
            del store.data.buckets[bucket]
        del store.data.events[event]
    elif isinstance(store, SqliteStore):
        with closing(sqlite3.connect(store.path, isolation_level=None)) as db:
            db.execute("DELETE FROM buckets WHERE key = ?", (bucket,))
            db.execute("DELETE FROM events WHERE id = ?", (event,))
    elif isinstance(store, MongoStore):
        mongo = store.client[store.database_name]
        if bucket is not None:
            assert (await mongo["buckets"].delete_one({"_id": bucket})).deleted_count == 1
        assert (await mongo["events"].delete_one({"_id": event})).deleted_count == 1
    else:
        assert isinstance(store, DynamoStore)
        client = await store._dynamodb()
        keys = [] if bucket is None else ["b#" + bucket]
        for pk in [*keys, "e#" + event]:
            old = await client.delete_item(
                TableName=store.table, Key={"pk": {"S": pk}}, ReturnValues="ALL_OLD"
            )
            assert old.get("Attributes")


def add_payment(
    state: WorkingState, event_id: str, verdict: bytes, at: float, account: str | None = None
) -> None:
    """What the decision core does for an accepted payment of 5 at time ``at``."""
    bucket = state.bucket_for_update(BUCKET, int(at) + 60)
    bucket.count += 1
    bucket.amount += 5
    if account is not None:
        state.account_for_update(account).seq += 1
    new = record(event_id, 0)
    new.verdict, new.buckets, new.occurred = verdict, (BUCKET,), int(at)
    state.put_event(event_id, new)


async def stored(store: Store) -> tuple[tuple[int, int, int], bytes, int | None]:
    """((count, amount, version) of the bucket, verdict of e1, seq of account a or None)."""
    got = await store.load(Keys(buckets={BUCKET}, events={"e1"}, accounts={"a"}))
    bucket = got.buckets[BUCKET]
    account = got.accounts.get("a")
    return (
        (bucket.count, bucket.amount, bucket.version),
        got.events["e1"].verdict,
        None if account is None else account.seq,
    )


async def test_expired_record_deleted_and_recreated_is_not_overwritten(store_url: str) -> None:
    """B reads expired records, TTL deletes them, A creates them again; B must lose.

    B's write replaces what it read (version 1); A's new records are also version 1.
    Without more than the version in B's condition, B silently overwrites A's payment
    (an increment lost) and re-decides an event A already published a verdict for.
    """
    early, b, a = await handles(store_url, NOW, LATER, LATER)
    try:
        state = WorkingState(Snapshot())
        add_payment(state, "e1", b'{"old":1}', NOW, account="a")
        await early.commit(state.take_writes())

        seen_by_b = await b.load(Keys(buckets={BUCKET}, events={"e1"}, accounts={"a"}))
        assert seen_by_b.buckets[BUCKET].count == 0 and "e1" not in seen_by_b.events
        await purge(early, BUCKET, "e1")
        seen_by_a = await a.load(Keys(buckets={BUCKET}, events={"e1"}))
        assert not seen_by_a.buckets and not seen_by_a.events
        state_a = WorkingState(seen_by_a)
        add_payment(state_a, "e1", b'{"A":1}', LATER)
        await a.commit(state_a.take_writes())

        # B's account write alone would succeed: the commit is refused as a whole
        state_b = WorkingState(seen_by_b)
        add_payment(state_b, "e1", b'{"B":1}', LATER, account="a")
        with pytest.raises(ConflictError):
            await b.commit(state_b.take_writes())
        assert await stored(a) == ((1, 5, 1), b'{"A":1}', 1)  # A's records; B stored nothing
    finally:
        for store in (early, b, a):
            await store.close()


async def test_live_record_deleted_and_recreated_to_the_same_version_is_not_overwritten(
    store_url: str,
) -> None:
    """B reads live records (bucket version 2, event version 1) just before they expire;
    they are deleted and created again, and reach the same versions before B commits."""
    early, b, a = await handles(store_url, NOW, NOW, LATER)
    try:
        for event_id in ("e0", "e1"):
            state = WorkingState(await early.load(Keys(buckets={BUCKET}, accounts={"a"})))
            add_payment(state, event_id, b'{"old":1}', NOW, account="a")
            await early.commit(state.take_writes())

        seen_by_b = await b.load(Keys(buckets={BUCKET}, events={"e1"}, accounts={"a"}))
        assert seen_by_b.buckets[BUCKET].version == 2 and seen_by_b.events["e1"].version == 1
        await purge(early, BUCKET, "e1")
        for event_id in ("e1", "e2"):  # e1 again: its idempotency record was deleted
            state = WorkingState(await a.load(Keys(buckets={BUCKET}, events={event_id})))
            add_payment(state, event_id, b'{"A":1}', LATER)
            await a.commit(state.take_writes())

        # B releases e1's payment (a reversal): bucket 2 -> 3, e1 1 -> 2, account 2 -> 3
        state_b = WorkingState(seen_by_b)
        original = seen_by_b.events["e1"]
        original.reversed = original.amount
        state_b.touch_event("e1")
        bucket = state_b.bucket_for_update(BUCKET, None)
        bucket.count, bucket.amount = bucket.count - 1, bucket.amount - 5
        state_b.account_for_update("a").seq += 1
        with pytest.raises(ConflictError):
            await b.commit(state_b.take_writes())
        assert await stored(a) == ((2, 10, 2), b'{"A":1}', 2)
    finally:
        for store in (early, b, a):
            await store.close()


async def test_absent_record_created_meanwhile_is_not_overwritten(store_url: str) -> None:
    """B reads nothing (never stored, or already deleted); A creates the records first."""
    b, a = await handles(store_url, LATER, LATER)
    try:
        seen_by_b = await b.load(Keys(buckets={BUCKET}, events={"e1"}, accounts={"a"}))
        assert not seen_by_b.buckets and not seen_by_b.events
        state_a = WorkingState(await a.load(Keys(buckets={BUCKET}, events={"e1"})))
        add_payment(state_a, "e1", b'{"A":1}', LATER)
        await a.commit(state_a.take_writes())

        state_b = WorkingState(seen_by_b)
        add_payment(state_b, "e1", b'{"B":1}', LATER, account="a")
        with pytest.raises(ConflictError):
            await b.commit(state_b.take_writes())
        assert await stored(a) == ((1, 5, 1), b'{"A":1}', None)
    finally:
        for store in (b, a):
            await store.close()


_LATE_RULES = b"""
rules:
  - id: day
    window: day
    currency: CNY
    max_count: 3
    max_amount: "100.00"
"""


def _event(event_id: str, amount: str, kind: str = "payment", original: str = "") -> bytes:
    doc = {"event_id": event_id, "type": kind, "account_id": "a", "currency": "CNY"}
    doc.update({"amount": amount, "occurred_at": "2030-03-17T10:00:00Z"})
    if original:
        doc["original_event_id"] = original
    return json.dumps(doc).encode()


@pytest.mark.parametrize("together", [False, True], ids=["batch-each", "one-batch"])
async def test_a_reversal_releases_nothing_from_a_bucket_that_expired_and_began_again(
    store_url: str, together: bool
) -> None:
    """p1 is counted, its day's bucket expires (a day's retention), a late payment of
    that day starts the bucket again, then p1 is reversed: the new bucket never held p1,
    so nothing is released from it, and the day's limit still holds against p3. (Before,
    the reversal took p1's 80.00 off the new bucket and p3 was accepted past the limit.)
    Another reversal, of the late payment, does release it."""
    clock = [NOW]  # 2030-03-17T17:46:40Z; the events are of that day, earlier
    store = open_store(store_url + ("&" if "?" in store_url else "?") + "bucket_retention_days=1")
    store._clock = lambda: clock[0]
    await store.init()
    engine = Engine(Decider(parse_rules(_LATE_RULES)), store)

    async def decide(*lines: bytes) -> list[dict[str, Any]]:
        out = []
        for group in [lines] if together else [[line] for line in lines]:
            results = await engine.process([Record(line, {"line": 0}) for line in group])
            out += [json.loads(r.verdict or b"null") for r in results]
        return out

    try:
        (p1,) = await decide(_event("p1", "80.00"))
        assert p1["decision"] == "accept"
        # the day's bucket has expired (a day past its period's end, which is taken as
        # 24 h after the day's local end: see handlers.periods.END_SLACK); event records
        # live on
        clock[0] = NOW + 5 * 86_400
        p2, r1, p3 = await decide(
            _event("p2", "60.00"),
            _event("r1", "80.00", "reversal", original="p1"),
            _event("p3", "50.00"),
        )
        assert (p2["decision"], r1["decision"]) == ("accept", "accept")
        assert r1["limits"][0]["amount_used"] == "60.00"  # p2's, unchanged
        assert p3["decision"] == "reject"
        assert p3["violations"] == [
            {
                "rule_id": "day",
                "metric": "amount",
                "period": "2030-03-17",
                "limit": "100.00",
                "used": "60.00",
            }
        ]
        r2, p4 = await decide(
            _event("r2", "60.00", "reversal", original="p2"), _event("p4", "90.00")
        )
        assert r2["decision"] == "accept" and r2["limits"][0]["amount_used"] == "0.00"
        assert p4["decision"] == "accept"
    finally:
        await store.close()


async def test_a_reversal_after_its_payments_buckets_expired_keeps_the_payment_known(
    store_url: str,
) -> None:
    """p1 is counted in its day's bucket, kept (README, *State stores*) a bucket
    retention (ten days) past that bucket's expiry, though events are kept one day. Its
    reversal comes once the bucket has expired, and releases from none: p1's record still
    stays known until then, and a resend of p1 gets its verdict again. (Before, the
    reversal stamped p1's record with its own day: the resend two days later was decided
    again, counted anew in the day it had been reversed from, with a new seq.)"""
    clock = [NOW]  # 2030-03-17T17:46:40Z; the events are of that day, earlier
    retention = "bucket_retention_days=10&event_retention_days=1"
    store = open_store(store_url + ("&" if "?" in store_url else "?") + retention)
    store._clock = lambda: clock[0]
    await store.init()
    engine = Engine(Decider(parse_rules(_LATE_RULES)), store)

    async def decide(line: bytes) -> dict[str, Any]:
        (result,) = await engine.process([Record(line, {"line": 0})])
        assert result.kind is not OutcomeKind.DEAD_LETTER, result.detail
        return {"kind": result.kind, **json.loads(result.verdict or b"null")}

    try:
        p1 = await decide(_event("p1", "80.00"))
        assert (p1["decision"], p1["seq"]) == ("accept", 1)
        # the day's bucket expires 2030-03-29T00:00Z (its period's end, taken as 24 h
        # after the day's end, + 10 days); p1's record ten days after that
        clock[0] = NOW + 12 * 86_400  # 2030-03-29T17:46:40Z
        r1 = await decide(_event("r1", "80.00", "reversal", original="p1"))
        assert (r1["decision"], r1["limits"][0]["amount_used"]) == ("accept", "0.00")
        clock[0] = NOW + 14 * 86_400  # past r1's own day, before p1's record's expiry
        again = await decide(_event("p1", "80.00"))
        assert (again["kind"], again["seq"]) == (OutcomeKind.DUPLICATE, 1)
    finally:
        await store.close()


_SHARED_RULES = b"""
rules:
  - {id: merchant, scope: merchant_id, window: month, currency: CNY, max_amount: "1000.00"}
  - {id: account, scope: account_id, window: month, currency: CNY, max_amount: "200.00"}
"""


def _shared(event_id: str, account: str, merchant: str, amount: str) -> Record:
    doc = {"event_id": event_id, "account_id": account, "merchant_id": merchant}
    doc.update({"amount": amount, "currency": "CNY", "occurred_at": "2030-03-17T10:00:00Z"})
    return Record(json.dumps(doc).encode(), {"line": 0})


async def test_a_reversal_of_a_payment_committed_while_its_batch_was_read_releases_it(
    store_url: str,
) -> None:
    """A store reads a batch's buckets, then its accounts and event records, not at one
    instant. Process B commits p (into merchant m's bucket, new) after A has read that
    bucket (a rejected payment of A's batch plans it) and before A reads p's record: A's
    reversal of p found p, released nothing from a bucket it read as never holding p,
    and wrote none. p was marked reversed and stayed counted in m's bucket for good."""
    a, b = await opened(store_url), await opened(store_url)
    if isinstance(a, MemoryStore) and isinstance(b, MemoryStore):
        b.data = a.data
    rules = parse_rules(_SHARED_RULES)
    engine_a, engine_b = Engine(Decider(rules), a), Engine(Decider(rules), b)
    read = a._read
    meanwhile: list[Callable[[], Any]] = []

    async def read_with_b_between(keys: Keys) -> Snapshot:
        # as the store reads them: the buckets, then (after B's commit) the rest
        snapshot = await read(Keys(buckets=keys.buckets))
        while meanwhile:
            await meanwhile.pop()()
        snapshot.merge(await read(Keys(accounts=keys.accounts, events=keys.events)))
        return snapshot

    try:
        # x has used up its account's month elsewhere: its payments at m are rejected,
        # and leave m's bucket as it was
        await engine_a.process([_shared("x0", "x", "elsewhere", "200.00")])
        a._read = read_with_b_between  # type: ignore[method-assign]
        meanwhile.append(lambda: engine_b.process([_shared("p", "y", "m", "150.00")]))
        reversal = {"event_id": "r", "type": "reversal", "account_id": "y"}
        reversal.update({"original_event_id": "p", "occurred_at": "2030-03-17T11:00:00Z"})
        x1, r = await engine_a.process(
            [_shared("x1", "x", "m", "50.00"), Record(json.dumps(reversal).encode(), {})]
        )
        assert not meanwhile  # B's commit came in between
        assert (x1.decision, r.decision) == (Decision.REJECT, Decision.ACCEPT)
        got = await b.load(Keys(buckets={"merchant|2030-03|m"}, events={"p"}))
        assert got.events["p"].reversed == 15_000
        held = got.buckets["merchant|2030-03|m"]
        assert (held.count, held.amount) == (0, 0)  # p released: it was 1, 15,000
    finally:
        await a.close()
        await b.close()


_KEPT_RULES = b"""
rules:
  - id: life
    window: lifetime
    currency: CNY
    max_count: 2
  - id: year
    window: year
    currency: CNY
    max_amount: "150.00"
"""
DAY = 86_400


@pytest.mark.parametrize("window", ["lifetime", "year"])
async def test_an_idempotency_record_outlives_the_buckets_it_counted_in(
    store_url: str, window: str
) -> None:
    """With records kept a day, a resend of p1 a day later was decided again and counted
    a second time in buckets that still held it: for good in the lifetime bucket, and
    until the year ends in the year's. A record now lives as long as its buckets (the
    lifetime's: for ever), and a reversal's as long as those it released from."""
    clock = [NOW]  # 2030-03-17; the events are of that day
    store = open_store(
        store_url + ("&" if "?" in store_url else "?") + "bucket_retention_days=1"
        "&event_retention_days=1"
    )
    store._clock = lambda: clock[0]
    await store.init()
    rules = _KEPT_RULES.replace(
        b"  - id: life" if window == "year" else b"  - id: year", b"  - id: x"
    )
    engine = Engine(Decider(parse_rules(rules)), store)

    async def decide(line: bytes) -> tuple[OutcomeKind, bytes]:
        (result,) = await engine.process([Record(line, {"line": 0})])
        assert result.verdict is not None
        return result.kind, result.verdict

    later = 400 * DAY if window == "lifetime" else 200 * DAY  # still 2030: the year lives
    try:
        kind, p1 = await decide(_event("p1", "80.00"))
        assert kind is OutcomeKind.VERDICT and json.loads(p1)["decision"] == "accept"
        clock[0] = NOW + later
        assert await decide(_event("p1", "80.00")) == (OutcomeKind.DUPLICATE, p1)
        kind, r1 = await decide(_event("r1", "30.00", "reversal", original="p1"))
        assert json.loads(r1)["decision"] == "accept"
        clock[0] = NOW + 2 * later if window == "lifetime" else NOW + later + 60 * DAY
        assert await decide(_event("r1", "30.00", "reversal", original="p1")) == (
            OutcomeKind.DUPLICATE,
            r1,
        )
        # 50.00 of p1 still counts: released once, counted once
        kind, p2 = await decide(_event("p2", "100.00"))
        limits = {x["rule_id"]: x for x in json.loads(p2)["limits"]}
        if window == "lifetime":
            assert json.loads(p2)["decision"] == "accept"
            assert limits["life"]["count_used"] == 2
        else:
            assert json.loads(p2)["decision"] == "accept"
            assert limits["year"]["amount_used"] == "150.00"
    finally:
        await store.close()


async def test_a_record_outlives_its_buckets_by_the_clock_difference_tolerated(
    store_url: str,
) -> None:
    """Writers' clocks may differ by less than the retention (``stores.base``). A record
    that expired with the bucket it counted in could be deleted (TTL, the sqlite sweep)
    on a clock 2 s ahead of a member's that still read the bucket live: a resend was
    decided anew and counted a second time. A record now outlives its buckets by the
    bucket retention, so a member whose clock is less than that behind the deleter's
    reads them expired as well, and the resend starts their new life."""
    writer, member = await handles(store_url, NOW, NOW)  # NOW is in the event's day
    rules = parse_rules(b"rules: [{id: day, window: day, currency: CNY, max_count: 5}]")
    try:
        (first,) = await Engine(Decider(rules), writer).process([Record(_event("p1", "1.00"), {})])
        assert first.verdict is not None and json.loads(first.verdict)["decision"] == "accept"
        held = await writer.load(Keys(buckets={"day|2030-03-17|a"}, events={"p1"}))
        bucket_until = held.buckets["day|2030-03-17|a"].expires_at
        record_until = held.events["p1"].expires_at
        assert bucket_until is not None and record_until is not None
        assert record_until >= bucket_until + DAY
        await purge(writer, None, "p1")  # by a deleter whose clock has reached it
        member._clock = lambda: record_until - DAY + 1  # behind it by less than a day
        (again,) = await Engine(Decider(rules), member).process([Record(_event("p1", "1.00"), {})])
        assert again.kind is OutcomeKind.VERDICT and again.verdict is not None
        (limit,) = json.loads(again.verdict)["limits"]
        assert limit["count_used"] == 1, "counted twice in the life that held it"
    finally:
        await writer.close()
        if member is not writer:
            await member.close()


async def forget_life(store: Store, bucket: str, event: str) -> None:
    """Take a bucket's life and an event record's list of lives away, as a version before
    they were kept stored them."""
    if isinstance(store, MemoryStore):  # in-process only: no earlier data to meet
        held = store.data.buckets[bucket]
        store.data.buckets[bucket] = held[:-8] + bytes(8)
        codec = store.data.codec
        assert codec is not None
        record = codec.unpack(store.data.events[event])
        record.born = ()
        store.data.events[event] = codec.pack(record)
    elif isinstance(store, SqliteStore):
        with closing(sqlite3.connect(store.path, isolation_level=None)) as db:
            db.execute("UPDATE buckets SET born = NULL WHERE key = ?", (bucket,))
            db.execute("UPDATE events SET born = NULL WHERE id = ?", (event,))
    elif isinstance(store, MongoStore):
        mongo = store.client[store.database_name]
        for name, key in (("buckets", bucket), ("events", event)):
            done = await mongo[name].update_one({"_id": key}, {"$unset": {"born": ""}})
            assert done.modified_count == 1
    else:
        assert isinstance(store, DynamoStore)
        client = await store._dynamodb()
        for pk in ("b#" + bucket, "e#" + event):
            await client.update_item(
                TableName=store.table,
                Key={"pk": {"S": pk}},
                UpdateExpression="REMOVE born",
                ConditionExpression="attribute_exists(born)",
            )


async def test_a_payment_stored_before_lives_were_kept_is_released_by_its_reversal(
    store_url: str,
) -> None:
    store = await opened(store_url)
    engine = Engine(Decider(parse_rules(_LATE_RULES)), store)
    try:
        await engine.process([Record(_event("p1", "80.00"), {"line": 1})])
        key = "day|2030-03-17|a"
        stored = await store.load(Keys(buckets={key}, events={"p1"}))
        assert stored.buckets[key].born > 0
        assert stored.events["p1"].born == (stored.buckets[key].born,)
        await forget_life(store, key, "p1")
        stored = await store.load(Keys(buckets={key}, events={"p1"}))
        assert (stored.buckets[key].born, stored.events["p1"].born) == (0, ())
        (r1,) = await engine.process(
            [Record(_event("r1", "80.00", "reversal", original="p1"), {"line": 2})]
        )
        assert r1.verdict is not None and json.loads(r1.verdict)["decision"] == "accept"
        after = (await store.load(Keys(buckets={key}))).buckets[key]
        assert (after.count, after.amount) == (0, 0)  # released, as before
        assert after.born > 0  # the bucket's life is known from its next write on
    finally:
        await store.close()


# -- what a rule's counters hold, kept for its id and window ------------------------------

_MEANING_RULES = """
rules:
  - {id: day, window: day, timezone: Asia/Shanghai, currency: CNY, max_amount: "100.00"}
  - {id: card, window: month, scope: [card_id, channel], max_count: 3}
  - {id: big, window: transaction, currency: CNY, max_amount: "50.00"}
"""
_KEEPS = "the store keeps its"
_NEW_YEAR = "  - {id: new, window: year, max_count: 1}\n"


def _meaning_rules_with(*changes: tuple[str, str], more: str = "") -> RuleSet:
    text = _MEANING_RULES
    for before, after in changes:
        assert before in text
        text = text.replace(before, after)
    return parse_rules(text + more)


async def test_a_rule_whose_counters_changed_meaning_is_refused_everywhere(
    store_url: str,
) -> None:
    first, second = await handles(store_url, NOW, NOW)
    try:
        await first.keep_rules(_meaning_rules_with())
        # limits and matches change in place; a rule added later is kept from then on
        limits = ('"100.00"', '"80.00"'), ("3}", "3, match: {channel: [atm]}}")
        await second.keep_rules(_meaning_rules_with(*limits, more=_NEW_YEAR))
        # so does a transaction rule, which keeps no counters, and a window: its periods
        # are named apart, and the meaning of the month's counters stays kept
        await first.keep_rules(
            _meaning_rules_with(('CNY, max_amount: "50', 'USD, max_amount: "50'))
        )
        await first.keep_rules(_meaning_rules_with(("window: month", "window: week")))
        for change, said in [
            (
                ("zone: Asia/Shanghai", "zone: UTC"),
                "rule 'day': {} day counters for timezone Asia/Shanghai (now UTC).",
            ),
            (
                ('CNY, max_amount: "100', 'USD, max_amount: "100'),
                "rule 'day': {} day counters for currency CNY (now USD).",
            ),
            (
                ("[card_id, channel]", "[channel, card_id]"),
                "rule 'card': {} month counters for scope [card_id, channel]"
                " (now [channel, card_id]).",
            ),
        ]:
            with pytest.raises(RuleChanged, match="^" + re.escape(said.format(_KEEPS))):
                await second.keep_rules(_meaning_rules_with(change))
        lifetime = "  - {id: new, window: lifetime, scope: card_id, max_count: 1}\n"
        await first.keep_rules(_meaning_rules_with(more=lifetime))  # a window new to 'new'
        both = (  # every changed rule, in one message
            f"rule 'day': {_KEEPS} day counters for timezone Asia/Shanghai (now UTC);"
            f" rule 'new': {_KEEPS} year counters for scope [account_id] (now [card_id])."
            " A rule's id names its counters: give a changed rule a new id, or change it back"
        )
        with pytest.raises(RuleChanged, match="^" + re.escape(both) + "$"):
            changed = ("zone: Asia/Shanghai", "zone: UTC")
            await first.keep_rules(
                _meaning_rules_with(
                    changed, more=_NEW_YEAR.replace("year,", "year, scope: card_id,")
                )
            )
    finally:
        for store in (first, second):
            await store.close()


async def test_a_refused_start_keeps_nothing_and_a_forgotten_rule_is_kept_again(
    store_url: str,
) -> None:
    (store,) = await handles(store_url, NOW)
    try:
        await store.keep_rules(_meaning_rules_with())
        # refused for 'day': the meaning of the file's new rule is not kept either, or the
        # file put right ('new' in another zone) would be refused for a rule never used
        with pytest.raises(RuleChanged, match="rule 'day'"):
            await store.keep_rules(
                _meaning_rules_with(("zone: Asia/Shanghai", "zone: UTC"), more=_NEW_YEAR)
            )
        tokyo = _NEW_YEAR.replace("year,", "year, timezone: Asia/Tokyo,")
        assert await store.keep_rules(_meaning_rules_with(more=tokyo)) == 2
        # forgotten (its counters expired, or its record damaged), a rule is kept anew
        assert await store.forget_rule("day") == 1
        assert await store.forget_rule("day") == 0
        assert (
            await store.keep_rules(
                _meaning_rules_with(("zone: Asia/Shanghai", "zone: UTC"), more=tokyo)
            )
            == 2
        )
        assert (
            await store.keep_rules(
                _meaning_rules_with(("zone: Asia/Shanghai", "zone: UTC"), more=tokyo)
            )
            == 3
        )
        with pytest.raises(RuleChanged, match="rule 'day'"):
            await store.keep_rules(_meaning_rules_with())
        assert await store.forget_rule("card") == 1  # its month's: every window of the id
    finally:
        await store.close()


async def test_stores_started_together_keep_one_meaning_for_a_rule(store_url: str) -> None:
    stores = await handles(store_url, *[NOW] * 6)
    zones = ["UTC", "Asia/Tokyo"] * 3
    try:
        outcomes = await asyncio.gather(
            *(
                store.keep_rules(
                    parse_rules(
                        f"rules:\n  - {{id: r, window: day, timezone: {zone}, max_count: 1}}\n"
                    )
                )
                for store, zone in zip(stores, zones, strict=True)
            ),
            return_exceptions=True,
        )
        taken = [isinstance(outcome, int) for outcome in outcomes]
        kept = {zone for zone, took in zip(zones, taken, strict=True) if took}
        assert len(kept) == 1, outcomes  # whichever came first, and the others agree
        refused = [o for o, took in zip(outcomes, taken, strict=True) if not took]
        assert len(refused) == 3 and all(isinstance(o, RuleChanged) for o in refused), outcomes
    finally:
        for store in stores:
            await store.close()


async def test_a_start_refused_because_another_came_first_keeps_nothing(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # both see nothing kept; the other start keeps 'day' in UTC between this start's
    # read and its write: this one is refused for 'day', and its 'card' (new to the store
    # too) is not kept, or the other's file, with 'card' by channel, would be refused
    this, other = await handles(store_url, NOW, NOW)
    utc_day = ("zone: Asia/Shanghai", "zone: UTC")
    by_channel = ("[card_id, channel]", "channel")
    read = this._read_meanings
    reads = 0

    async def read_then_other_starts(keys: list[str]) -> dict[str, str]:
        nonlocal reads
        kept = await read(keys)
        reads += 1
        if reads == 1:
            day_rule = _MEANING_RULES.replace(*utc_day).splitlines()[:3]
            await other.keep_rules(parse_rules("\n".join(day_rule)))
        return kept

    monkeypatch.setattr(this, "_read_meanings", read_then_other_starts)
    try:
        with pytest.raises(RuleChanged, match=r"^rule 'day': the store keeps its day counters"):
            await this.keep_rules(_meaning_rules_with())
        assert reads >= 2  # it compared again
        assert await other.keep_rules(_meaning_rules_with(utc_day, by_channel)) == 1
        assert await other.keep_rules(_meaning_rules_with(utc_day, by_channel)) == 2
    finally:
        for store in (this, other):
            await store.close()


async def test_more_new_rules_than_one_request_holds_are_kept(store_url: str) -> None:
    many = "".join(f"  - {{id: r{i}, window: day, max_count: 1}}\n" for i in range(130))
    (store,) = await handles(store_url, NOW)
    try:
        assert await store.keep_rules(parse_rules("rules:\n" + many)) == 0
        assert await store.keep_rules(parse_rules("rules:\n" + many)) == 130
        with pytest.raises(RuleChanged, match=r"^rule 'r129': "):
            tokyo = many.replace("r129, window: day,", "r129, window: day, timezone: Asia/Tokyo,")
            await store.keep_rules(parse_rules("rules:\n" + tokyo))
    finally:
        await store.close()


async def test_comparing_rules_with_a_store_writes_nothing(store_url: str) -> None:
    (store,) = await handles(store_url, NOW)
    try:
        rules = _meaning_rules_with()  # two rules keep counters, one is a transaction rule
        assert await store.keep_rules(rules, keep=False) == 0
        assert await store.keep_rules(rules) == 0  # how many were kept before
        assert await store.keep_rules(rules, keep=False) == 2
        with pytest.raises(RuleChanged, match="rule 'day'"):
            await store.keep_rules(
                _meaning_rules_with(("zone: Asia/Shanghai", "zone: UTC")), keep=False
            )
        more = _meaning_rules_with(more=_NEW_YEAR)
        assert await store.keep_rules(more, keep=False) == 2
        assert await store.keep_rules(more, keep=False) == 2  # still not kept
        assert await store.keep_rules(more) == 2
        assert await store.keep_rules(more) == 3
    finally:
        await store.close()


async def damage_meaning(store: Store, key: str) -> str:
    """Store a meaning that is not text under ``key``, as a hand edit would; what the
    refusal names."""
    if isinstance(store, MemoryStore):
        store.data.rules[key] = "[1]"
        return f"the meaning kept for {key!r} is not one limitflow writes"
    if isinstance(store, SqliteStore):
        with closing(sqlite3.connect(store.path, isolation_level=None)) as db:
            db.execute("UPDATE meta SET value = 7 WHERE name = ?", (f"rule:{key}",))
        return f"meta row 'rule:{key}' holds int"
    if isinstance(store, MongoStore):
        rules = store.client[store.database_name]["rules"]
        assert (await rules.update_one({"_id": key}, {"$set": {"meaning": 7}})).modified_count
        return f"rules document {key!r} holds no text meaning"
    assert isinstance(store, DynamoStore)
    client = await store._dynamodb()
    item = {"pk": {"S": f"r#{key}"}, "meaning": {"N": "7"}}
    await client.put_item(TableName=store.table, Item=item)
    return f"item 'r#{key}' holds no text meaning"


async def test_a_damaged_kept_meaning_is_refused_by_name_until_forgotten(store_url: str) -> None:
    (store,) = await handles(store_url, NOW)
    try:
        rules = _meaning_rules_with()
        await store.keep_rules(rules)
        said = await damage_meaning(store, "card:month")
        with pytest.raises(StoreRejected, match="^" + re.escape(said) + ".*forget-rule"):
            await store.keep_rules(rules)
        assert await store.forget_rule("card") == 1
        assert await store.keep_rules(rules) == 1  # kept anew, from the rules
        assert await store.keep_rules(rules, keep=False) == 2
    finally:
        await store.close()


async def test_a_rule_is_forgotten_only_once_its_counters_have_expired(store_url: str) -> None:
    now, later = await handles(store_url, NOW, LATER)  # retention of a day, 3 days apart
    try:
        rules = parse_rules(_LATE_RULES)
        await now.keep_rules(rules)
        await Engine(Decider(rules), now).process([Record(_event("p1", "80.00"), {"line": 1})])
        with pytest.raises(CountersLive, match=r"^rule 'day' has counters that have not expired"):
            await now.forget_rule("day")
        assert await now.forget_rule("da") == 0  # another id, whose name begins the same
        assert await later.forget_rule("day") == 1  # by then its counters have expired
        await now.keep_rules(rules)
        assert await now.forget_rule("day", force=True) == 1
        # forgotten already: nothing to refuse, though its counters live on
        assert await now.forget_rule("day") == 0
    finally:
        for store in (now, later):
            await store.close()
