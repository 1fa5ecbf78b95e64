"""DynamoStore against a real DynamoDB Local: commits, conflicts, errors, and the engine's
output compared byte for byte with ``memory://``, including several OS processes sharing
one merchant bucket."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import socket
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from handlers.decide import Decider
from handlers.state import Account, Bucket, EventRecord, Keys, Writes
from limitflow.errors import (
    ConflictError,
    StoreNotInitialized,
    StoreRejected,
    StoreUnavailable,
)
from schemas.events import EventType
from schemas.rules import load_rules, parse_rules
from stores.base import Retention
from stores.dynamo import DynamoStore
from stores.memory import MemoryStore
from streams.engine import Engine, Record
from streams.replay import replay
from tests.servers import dynamodb_local

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
FAKE_AWS = {
    "AWS_ACCESS_KEY_ID": "test",
    "AWS_SECRET_ACCESS_KEY": "test",
    "AWS_DEFAULT_REGION": "us-east-1",
}


# -- server -------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def endpoint_url() -> Iterator[str]:
    with dynamodb_local() as ddb:
        yield ddb.endpoint_url


@pytest.fixture(autouse=True)
def fake_aws(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in FAKE_AWS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_PROFILE", raising=False)


def _url(endpoint_url: str, prefix: str) -> str:
    return f"dynamodb://{prefix}?endpoint_url={endpoint_url}&region=us-east-1"


@pytest.fixture
def prefix() -> str:
    return f"t{uuid.uuid4().hex[:12]}"


@pytest.fixture
async def store(endpoint_url: str, prefix: str) -> AsyncIterator[DynamoStore]:
    s = DynamoStore.from_url(_url(endpoint_url, prefix))
    await s.init()
    try:
        yield s
    finally:
        await s.close()


def _event(version: int = 1, **kw: object) -> EventRecord:
    fields: dict[str, object] = {
        "fingerprint": "f" * 16,
        "account_id": "acct-1",
        "type": EventType.PAYMENT,
        "accepted": True,
        "seq": 1,
        "verdict": b'{"decision":"accept","b":"\x00\xff"}',
        "amount": 10**22 + 7,
        "currency": "CNY",
        "buckets": ("r1|2026-03-14|acct-1", "r2|2026-03|card|x"),
        "occurred": 1_773_450_000,
        "version": version,
    }
    fields.update(kw)
    return EventRecord(**fields)  # type: ignore[arg-type]


# -- records ------------------------------------------------------------------------------


async def test_check_before_init_then_init_is_idempotent(endpoint_url: str, prefix: str) -> None:
    s = DynamoStore.from_url(_url(endpoint_url, prefix) + "&bucket_retention_days=3")
    try:
        with pytest.raises(StoreNotInitialized):
            await s.check()
        with pytest.raises(StoreNotInitialized):
            await s.load(Keys(buckets={"x"}))
        await s.init()
        await s.init()
        await s.check()
        client = await s._dynamodb()
        ttl = await client.describe_time_to_live(TableName=s.table)
        assert ttl["TimeToLiveDescription"]["AttributeName"] == "expires_at"
        assert ttl["TimeToLiveDescription"]["TimeToLiveStatus"] in ("ENABLED", "ENABLING")
    finally:
        await s.close()


async def _table_without_limitflows_ttl(store: DynamoStore, ttl: str | None) -> Any:
    """The store's table as a `store init` cut short after CreateTable left it (``ttl``
    None), or as another tool made it, with TTL on another attribute."""
    client = await store._dynamodb()
    await client.create_table(
        TableName=store.table,
        AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
        BillingMode="PAY_PER_REQUEST",
    )
    if ttl is not None:
        await client.update_time_to_live(
            TableName=store.table,
            TimeToLiveSpecification={"Enabled": True, "AttributeName": ttl},
        )
    return client


async def test_a_table_whose_ttl_is_off_is_not_initialised(endpoint_url: str, prefix: str) -> None:
    # a `store init` stopped after CreateTable (the wait for the table can take minutes
    # on AWS): `check` passed, and no record was ever deleted from the table
    s = DynamoStore.from_url(_url(endpoint_url, prefix))
    try:
        await _table_without_limitflows_ttl(s, None)
        with pytest.raises(StoreNotInitialized, match="TTL"):
            await s.check()
        await s.init()
        await s.check()
    finally:
        await s.close()


async def test_init_refuses_a_table_whose_ttl_is_another_attribute(
    endpoint_url: str, prefix: str
) -> None:
    # `store init` said nothing and TTL stayed on `ttl`: limitflow's records never went
    s = DynamoStore.from_url(_url(endpoint_url, prefix))
    try:
        client = await _table_without_limitflows_ttl(s, "ttl")
        with pytest.raises(StoreRejected, match="ttl"):
            await s.init()
        with pytest.raises(StoreNotInitialized, match="TTL"):
            await s.check()
        ttl = await client.describe_time_to_live(TableName=s.table)
        assert ttl["TimeToLiveDescription"]["AttributeName"] == "ttl"
    finally:
        await s.close()


async def test_init_run_by_several_at_once_succeeds_for_each(endpoint_url: str) -> None:
    # each saw TTL off, then all but one were told "TimeToLive is already enabled"
    # (a ValidationException): `store init` failed in 3 of 11 rounds of 4 processes
    for round_ in range(5):
        prefix = f"race{round_}{uuid.uuid4().hex[:6]}"
        stores = [DynamoStore.from_url(_url(endpoint_url, prefix)) for _ in range(4)]
        try:
            await asyncio.gather(*(s.init() for s in stores))
            await stores[0].check()
        finally:
            await asyncio.gather(*(s.close() for s in stores))


async def test_records_round_trip_exactly_as_fresh_copies(store: DynamoStore) -> None:
    writes = Writes(
        buckets={
            "r1|2026-03-14|acct-1": Bucket(count=3, amount=2**70, version=1, period_end=1),
            "life|all|x\\|y": Bucket(count=1, amount=0, version=1),
        },
        accounts={"acct-1": Account(seq=41, version=1)},
        events={
            "evt-1": _event(),
            "evt-2": _event(currency=None, buckets=(), accepted=False, amount=0),
        },
    )
    await store.commit(writes)
    before = store.round_trips
    keys = Keys(
        buckets=set(writes.buckets) | {"absent"},
        accounts={"acct-1", "nobody"},
        events={"evt-1", "evt-2", "evt-3"},
    )
    first = await store.load(keys)
    assert store.round_trips == before + 2  # buckets and accounts, then event records
    assert first.buckets == writes.buckets
    assert first.buckets["life|all|x\\|y"].expires_at is None  # lifetime buckets never expire
    assert first.accounts == writes.accounts
    assert first.events == writes.events
    first.buckets["r1|2026-03-14|acct-1"].count += 100
    again = await store.load(keys)
    assert again.buckets["r1|2026-03-14|acct-1"].count == 3


async def test_reads_more_than_100_keys_in_several_requests(store: DynamoStore) -> None:
    for start in range(0, 250, 100):
        await store.commit(
            Writes(accounts={f"a{n}": Account(seq=n, version=1) for n in range(start, start + 100)})
        )
    before = store.round_trips
    snapshot = await store.load(Keys(accounts={f"a{n}" for n in range(300)}))
    assert {k: a.seq for k, a in snapshot.accounts.items()} == {f"a{n}": n for n in range(300)}
    assert store.round_trips - before == 3


class _ThrottledOnce:
    """The store's client, but its first ``BatchGetItem`` is refused as throttled (after
    botocore's own retries) and the others answer a little later: DynamoDB Local never
    throttles, so the fault is injected here."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.sent = 0
        self.forwarded = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.client, name)

    async def batch_get_item(self, **kw: Any) -> Any:
        from botocore.exceptions import ClientError  # type: ignore[import-untyped]

        self.sent += 1
        if self.sent == 1:
            raise ClientError(
                {
                    "Error": {"Code": "ProvisionedThroughputExceededException", "Message": "x"},
                    "ResponseMetadata": {"HTTPStatusCode": 400},
                },
                "BatchGetItem",
            )
        await asyncio.sleep(0.2)
        self.forwarded += 1
        return await self.client.batch_get_item(**kw)


async def test_a_failed_read_leaves_none_of_its_requests_running(store: DynamoStore) -> None:
    # one of a batch's concurrent BatchGetItems throttled: the batch fails (retried whole
    # by the consumer), so the others are of no use. They were left running, each with
    # its own retries, and every retry of the batch sent a full set more at a table that
    # was throttling already
    throttled = _ThrottledOnce(await store._dynamodb())
    store._client = throttled
    with pytest.raises(StoreUnavailable):
        await store.load(Keys(accounts={f"a{n}" for n in range(500)}))
    await asyncio.sleep(0.5)
    assert throttled.sent == 5
    assert throttled.forwarded == 0


async def test_stale_writes_conflict_and_change_nothing(
    store: DynamoStore, caplog: pytest.LogCaptureFixture
) -> None:
    await store.commit(Writes(buckets={"b": Bucket(count=1, amount=5, version=1)}))
    # a zombie that read before the first commit: its create of the same key must fail
    with caplog.at_level("INFO", "limitflow.stores.dynamo"), pytest.raises(ConflictError):
        await store.commit(Writes(buckets={"b": Bucket(count=1, amount=9, version=1)}))
    assert "conflict on a record: stored version 1" in caplog.text  # from the failed condition
    await store.commit(Writes(buckets={"b": Bucket(count=2, amount=10, version=2)}))
    # a zombie that read version 1 and a fresh record: neither may be stored
    stale = Writes(
        buckets={"b": Bucket(count=2, amount=99, version=2)},
        accounts={"new": Account(seq=1, version=1)},
    )
    with pytest.raises(ConflictError):
        await store.commit(stale)
    # skipping a version is a conflict too
    with pytest.raises(ConflictError):
        await store.commit(Writes(buckets={"b": Bucket(count=9, amount=9, version=4)}))
    snapshot = await store.load(Keys(buckets={"b"}, accounts={"new"}))
    assert snapshot.buckets["b"].amount == 10 and snapshot.buckets["b"].version == 2
    assert snapshot.accounts == {}


async def test_expired_event_record_is_replaced_under_its_version(
    endpoint_url: str, prefix: str
) -> None:
    # far ahead of the real clock: DynamoDB Local's own TTL deletion removes items whose
    # expires_at is past in real time, and did, at random, between the commit and the load
    now = [1_900_000_000.0]
    s = DynamoStore.from_url(_url(endpoint_url, prefix))
    s._clock = lambda: now[0]
    s.retention = Retention(event_seconds=60)
    try:
        await s.init()
        await s.commit(Writes(events={"evt-1": _event()}))
        now[0] += 3600  # past expiry, but DynamoDB's TTL deletion has not run
        snapshot = await s.load(Keys(events={"evt-1"}))
        assert snapshot.events == {}
        expired = snapshot.expired_events["evt-1"]
        assert (expired.version, expired.expires_at) == (1, 1_900_000_060)
        with pytest.raises(ConflictError):  # still a create of an existing key
            await s.commit(Writes(events={"evt-1": _event(version=1)}))
        with pytest.raises(ConflictError):  # version 1, but not the expiry read
            await s.commit(Writes(events={"evt-1": _event(version=2, seq=2)}))
        await s.commit(
            Writes(events={"evt-1": _event(version=2, seq=2, expires_at=expired.expires_at)})
        )
        assert (await s.load(Keys(events={"evt-1"}))).events["evt-1"].seq == 2
    finally:
        await s.close()


@pytest.mark.parametrize("edit", [{"count": "-3"}, {"amount": "-300"}, {"amount": "1.5"}])
async def test_a_bucket_edited_by_hand_into_what_no_bucket_holds_is_refused(
    store: DynamoStore, edit: dict[str, str]
) -> None:
    # a negative count or amount left more room than the limit
    await store.commit(Writes(buckets={"b": Bucket(count=1, amount=100, version=1)}))
    client = await store._dynamodb()
    names = {f"#{name}": name for name in edit}
    await client.update_item(
        TableName=store.table,
        Key={"pk": {"S": "b#b"}},
        UpdateExpression="SET " + ", ".join(f"#{name} = :{name}" for name in edit),
        ExpressionAttributeNames=names,
        ExpressionAttributeValues={f":{name}": {"N": value} for name, value in edit.items()},
    )
    with pytest.raises(StoreRejected):
        await store.load(Keys(buckets={"b"}))


async def test_driver_errors_are_translated(endpoint_url: str, store: DynamoStore) -> None:
    too_long = "k" * 3000  # a partition key is at most 2048 bytes
    with pytest.raises(StoreRejected) as rejected:
        await store.commit(Writes(buckets={too_long: Bucket(count=1, version=1)}))
    assert rejected.value.__cause__ is not None
    down = DynamoStore.from_url(_url(f"http://127.0.0.1:{_free_port()}", "x"))
    try:
        with pytest.raises(StoreUnavailable) as unavailable:
            await down.load(Keys(accounts={"a"}))
        assert unavailable.value.retriable and unavailable.value.__cause__ is not None
    finally:
        await down.close()


async def test_credentials_that_cannot_be_fetched_are_an_outage(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # a container's credential endpoint that did not answer (a blip at the hourly
    # refresh of temporary credentials) was a refusal for good, which ended `run`
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    port = _free_port()
    monkeypatch.setenv("AWS_CONTAINER_CREDENTIALS_FULL_URI", f"http://127.0.0.1:{port}/creds")
    store = DynamoStore.from_url(_url(f"http://127.0.0.1:{port}", "x"))
    try:
        with pytest.raises(StoreUnavailable) as unavailable:
            await store.load(Keys(accounts={"a"}))
        assert unavailable.value.retriable
        assert "could not be fetched" in str(unavailable.value)
    finally:
        await store.close()


# -- the engine, byte for byte against memory:// -------------------------------------------


def _generated() -> bytes:
    from benchmarks.generate import events as generate_events

    lines = generate_events(1_500, accounts=60, seed=11)
    assert sum(b'"reversal"' in line for line in lines) > 10
    assert len(set(lines)) < len(lines)  # resent duplicates
    return b"\n".join(lines) + b"\nnot json\n"


async def _replay(store: DynamoStore | MemoryStore, data: bytes, batch: int) -> tuple[bytes, ...]:
    engine = Engine(Decider(load_rules(str(REPO / "examples" / "rules.yaml"))), store)
    verdicts, dead = io.BytesIO(), io.BytesIO()
    await replay(engine, io.BytesIO(data), verdicts, dead, batch_size=batch)
    assert engine.stats.conflicts == 0
    return verdicts.getvalue(), dead.getvalue(), str(engine.stats.commits).encode()


@pytest.mark.parametrize("source", ["examples", "generated"])
async def test_engine_output_matches_memory_byte_for_byte(store: DynamoStore, source: str) -> None:
    data = (REPO / "examples" / "events.jsonl").read_bytes() if source == "examples" else None
    data = data if data is not None else _generated()
    batch = 700  # > 100 records per batch: each batch commits in several transactions
    ours = await _replay(store, data, batch)
    memory = MemoryStore()
    expected = await _replay(memory, data, batch)
    assert ours[:2] == expected[:2]
    if source == "generated":
        assert int(ours[2]) > 3 * len(range(0, data.count(b"\n"), batch))
        # replaying again: every event is now a duplicate with its stored verdict
        again = await _replay(store, data, batch)
        assert again[0] == ours[0] and again[1] == ours[1]


# -- several processes on one merchant bucket ----------------------------------------------

RULES = """
rules:
  - id: merchant-day
    scope: merchant_id
    window: day
    timezone: UTC
    currency: CNY
    max_count: 40
    max_amount: "100000.00"
"""


def test_processes_sharing_a_merchant_bucket_never_pass_the_limit(
    endpoint_url: str, prefix: str, tmp_path: Path
) -> None:
    import asyncio

    url = _url(endpoint_url, prefix)
    env = {**os.environ, **FAKE_AWS}
    subprocess.run(
        [sys.executable, "-m", "limitflow", "store", "init", "--store", url],
        check=True,
        env=env,
        cwd=REPO,
        capture_output=True,
    )
    (tmp_path / "rules.yaml").write_text(RULES)
    amounts: dict[str, int] = {}
    workers = 4
    for w in range(workers):
        lines = []
        for n in range(30):
            event_id = f"w{w}-{n}"
            amounts[event_id] = 100 * (w + 1) + n  # minor units
            lines.append(
                json.dumps(
                    {
                        "event_id": event_id,
                        "account_id": f"acct-{w}-{n}",
                        "merchant_id": "m-shared",
                        "amount": f"{amounts[event_id] / 100:.2f}",
                        "currency": "CNY",
                        "occurred_at": f"2026-03-14T10:{n:02d}:00Z",
                    }
                )
            )
        (tmp_path / f"in{w}.jsonl").write_text("\n".join(lines) + "\n")
    processes = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "limitflow",
                "replay",
                "--rules",
                str(tmp_path / "rules.yaml"),
                "--input",
                str(tmp_path / f"in{w}.jsonl"),
                "--output",
                str(tmp_path / f"out{w}.jsonl"),
                "--dead-letter",
                str(tmp_path / f"dead{w}.jsonl"),
                "--store",
                url,
                "--batch-size",
                "3",
            ],
            env=env,
            cwd=REPO,
            stderr=subprocess.PIPE,
        )
        for w in range(workers)
    ]
    try:
        for process in processes:
            _, err = process.communicate(timeout=300)
            assert process.returncode == 0, err.decode()
    finally:  # the others too, when one failed
        for process in processes:
            process.kill()
            process.communicate()
    accepted: list[str] = []
    for w in range(workers):
        for line in (tmp_path / f"out{w}.jsonl").read_bytes().splitlines():
            verdict = json.loads(line)
            if verdict["decision"] == "accept":
                accepted.append(verdict["event_id"])
    assert len(accepted) == 40  # every event fits the amount: the count is what binds
    assert len({a.split("-")[0] for a in accepted}) > 1  # the processes really shared it

    async def stored() -> Bucket:
        s = DynamoStore.from_url(url)
        try:
            key = "merchant-day|2026-03-14|m-shared"
            return (await s.load(Keys(buckets={key}))).buckets[key]
        finally:
            await s.close()

    bucket = asyncio.run(stored())
    assert bucket.count == len(accepted)
    assert bucket.amount == sum(amounts[a] for a in accepted)


async def test_a_reversal_reads_its_original_after_its_account(
    endpoint_url: str, prefix: str
) -> None:
    """A batch's keys took concurrent ``BatchGetItem``s of any kind: the request with a
    reversal's original could be answered before another process committed the payment,
    and the one with the account after. The reversal was then committed "original not
    found" with the seq after the payment's, and the payment stayed counted. Read after
    the accounts, the original is found, or the account's write conflicts."""
    a = DynamoStore.from_url(_url(endpoint_url, prefix))
    b = DynamoStore.from_url(_url(endpoint_url, prefix))
    await a.init()
    rules = parse_rules(
        'rules: [{id: m, scope: merchant_id, window: month, currency: CNY, max_amount: "1000.00"}]'
    )
    engine_a, engine_b = Engine(Decider(rules), a), Engine(Decider(rules), b)

    def record(**fields: object) -> Record:
        fields.update(currency="CNY", occurred_at="2026-03-14T09:00:00Z")
        return Record(json.dumps(fields).encode(), {"line": 0})

    payment = record(event_id="p", account_id="y", merchant_id="m", amount="150.00")
    # other accounts' payments at one merchant: 198 accounts and a bucket, with y's
    # account 200 keys, two whole requests apart from the event records'
    others = [
        record(event_id=f"o{n}", account_id=f"o{n}", merchant_id="o", amount="1.00")
        for n in range(198)
    ]
    committed = asyncio.Event()
    batch_get = a._batch_get

    async def answered_in_that_order(client: Any, pks: list[str]) -> list[Any]:
        if "a#y" in pks and "e#p" not in pks:  # the account's request: answered after
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(committed.wait(), 2)
        found = await batch_get(client, pks)
        if "e#p" in pks and not committed.is_set():  # the original's: answered before
            await engine_b.process([payment])
            committed.set()
        return found

    a._batch_get = answered_in_that_order  # type: ignore[method-assign]
    try:
        reversal = record(event_id="r", type="reversal", account_id="y", original_event_id="p")
        results = await engine_a.process([*others, reversal])
        assert committed.is_set()
        verdict = json.loads(results[-1].verdict or b"{}")
        assert (verdict["decision"], verdict["seq"]) == ("accept", 2), verdict
    finally:
        await a.close()
        await b.close()
