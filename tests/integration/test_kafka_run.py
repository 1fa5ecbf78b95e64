"""``limitflow run`` against a real Kafka-protocol broker (tansu), compared with replay.

Every test runs the real command as a subprocess, feeds it generated events (payments,
reversals, exact resends, an idempotency conflict and bad input), and checks that the
verdicts and dead letters on the topics equal what ``limitflow replay`` writes for the
same events, and that the SQLite counters equal replay's.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import json
import os
import random
import signal
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition  # type: ignore[import-untyped]
from aiokafka.admin import (  # type: ignore[import-untyped]
    AIOKafkaAdminClient,
    RecordsToDelete,
)
from aiokafka.protocol.group import LeaveGroupRequest  # type: ignore[import-untyped]

from handlers.state import Keys
from stores import open_store
from stores.verdict_codec import VerdictCodec, unpack_verdict
from streams.output import _stop_quietly
from tests.oracle.generate import case as oracle_case
from tests.servers import kafka_broker
from tests.unit.test_oracle import RETENTION as ORACLE_RETENTION
from tests.unit.test_oracle import dead_letters_of as oracle_dead_letters
from tests.unit.test_oracle import differences as oracle_differences
from tests.unit.test_oracle import nonblank as oracle_nonblank
from tests.unit.test_oracle import report as oracle_report
from tests.unit.test_oracle import write_rules as oracle_rules

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
RULES = str(REPO / "examples" / "rules.yaml")
PARTITIONS = 4
ORACLE_SEED = 107  # an oracle case with every outcome of a reversal, resends and bad lines

# -- brokers --------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def tansu() -> Iterator[Any]:
    with kafka_broker("tansu") as handle:
        yield handle


# -- events ---------------------------------------------------------------------------


def make_events(count: int, *, accounts: int = 12, seed: int = 1) -> list[bytes]:
    """Payments (CNY, some JPY, ATM), reversals, resends, a conflict and bad input.

    Every bucket of examples/rules.yaml must live on one input partition for Kafka's
    verdicts to equal replay's byte for byte: a verdict explains every applicable
    bucket, and a ``merchant_id`` bucket shared by accounts on different partitions
    is read in a different interleaving than a file's. So each merchant here belongs
    to one account (events are keyed by account_id).
    """
    rng = random.Random(seed)
    moment = datetime(2026, 3, 14, 1, 0, tzinfo=UTC)
    lines: list[bytes] = []
    sent: list[tuple[str, str]] = []
    for n in range(count):
        moment += timedelta(seconds=rng.randint(1, 40))
        account = f"acct-{rng.randrange(accounts)}"
        roll = rng.random()
        at = moment.isoformat().replace("+00:00", "Z")
        if roll < 0.05 and sent:
            original, owner = sent[rng.randrange(len(sent))]
            doc: dict[str, Any] = {
                "event_id": f"evt-{n}",
                "type": "reversal",
                "account_id": owner,
                "original_event_id": original,
                "occurred_at": at,
            }
        elif roll < 0.08 and lines:
            lines.append(lines[rng.randrange(len(lines))])  # an exact resend
            continue
        elif roll < 0.09:
            lines.append(rng.choice([b"{not json", b'{"event_id": "x"}', b"\xff\xfe", b"[]"]))
            continue
        else:
            currency = "JPY" if roll > 0.95 else "CNY"
            doc = {
                "event_id": f"evt-{n}",
                "account_id": account,
                "card_id": f"card-{account}-{rng.randrange(2)}",
                # merchants are per account (see make_events' docstring)
                "merchant_id": f"m-{account}-{rng.randrange(3)}",
                "amount": str(rng.randint(100, 20_000))
                if currency == "JPY"
                else f"{rng.randint(1, 200_000) / 100:.2f}",
                "currency": currency,
                "occurred_at": at,
                "channel": "atm" if rng.random() < 0.15 else "pos",
            }
            sent.append((doc["event_id"], account))
        lines.append(json.dumps(doc).encode())
    # same event_id, different content: an idempotency conflict on the same account
    if sent:  # the first payment's (the first line may be bad input, by the seed)
        first = next(
            doc
            for doc in (json.loads(line) for line in lines if line.startswith(b'{"event_id"'))
            if doc["event_id"] == sent[0][0]
        )
        first["amount"] = "1.23"
        lines.append(json.dumps(first).encode())
    return lines


def account_key(raw: bytes | None) -> bytes | None:
    with contextlib.suppress(ValueError, AttributeError, TypeError, RecursionError):
        value = json.loads(raw or b"").get("account_id")
        if isinstance(value, str):
            return value.encode()
    return None


# -- the command ----------------------------------------------------------------------


def limitflow(
    *argv: str, env: dict[str, str] | None = None, module: str = "limitflow", **kw: Any
) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", *module.split(), *argv],
        env={**os.environ, **(env or {})},
        cwd=REPO,
        **kw,
    )


@dataclass
class Setup:
    """One test's topics, group, store and runs."""

    bootstrap: str
    tmp: Path
    name: str
    partitions: int = PARTITIONS
    runs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    store_url: str | None = None
    """The store of every run; None: a sqlite file of its own."""
    security: list[str] = field(default_factory=list)
    """Flags of ``run`` and ``topics create`` for TLS and SASL (``--security-protocol``…)."""
    client: dict[str, Any] = field(default_factory=dict)
    """The same for the test's own aiokafka clients (``security_protocol``, ``ssl_context``…)."""

    @property
    def topics(self) -> tuple[str, str, str]:
        return f"{self.name}-events", f"{self.name}-verdicts", f"{self.name}-dead"

    @property
    def store(self) -> str:
        return self.store_url or f"sqlite:///{self.tmp / 'store.db'}"

    def topic_args(self) -> list[str]:
        events, verdicts, dead = self.topics
        return [
            "--bootstrap-servers",
            self.bootstrap,
            "--input-topic",
            events,
            "--output-topic",
            verdicts,
            "--dead-letter-topic",
            dead,
            *self.security,
        ]

    def create_topics(self) -> None:
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "limitflow",
                "topics",
                "create",
                *self.topic_args(),
                "--partitions",
                str(self.partitions),
            ],
            cwd=REPO,
            capture_output=True,
            check=False,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr.decode()

    def run(
        self,
        *extra: str,
        group: str | None = None,
        store: str | None = None,
        env: dict[str, str] | None = None,
        module: str = "limitflow",
        rules: str = RULES,
    ) -> subprocess.Popen[bytes]:
        """``limitflow run`` on this set-up (``module``: ``python -m`` what, and its
        first arguments: a script that runs it with a fault injected)."""
        index = len(self.runs)
        with open(self.tmp / f"run-{index}.log", "wb") as log:
            proc = limitflow(
                "run",
                *self.topic_args(),
                "--rules",
                rules,
                "--store",
                store or self.store,
                "--group-id",
                group or f"{self.name}-group",
                "--session-timeout-ms",
                "6000",
                "--retry-initial-ms",
                "100",
                "--retry-max-ms",
                "2000",
                *extra,
                env=env,
                module=module,
                stdout=log,
                stderr=log,
            )
        self.runs.append(proc)
        return proc

    def log(self, index: int) -> str:
        return (self.tmp / f"run-{index}.log").read_text(errors="replace")

    def stop(self, proc: subprocess.Popen[bytes], timeout: float = 60) -> int:
        proc.send_signal(signal.SIGTERM)
        return proc.wait(timeout)

    def kill_all(self) -> None:
        for proc in self.runs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


@pytest.fixture
def setup(tansu: Any, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Setup]:
    name = request.node.name.replace("_", "-").replace("[", "-").replace("]", "")[:40]
    made = Setup(tansu.bootstrap_servers, tmp_path, f"{name}-{random.randrange(10**6)}")
    made.create_topics()
    yield made
    made.kill_all()


async def produce(
    bootstrap: str, topic: str, lines: Sequence[bytes | None], **client: Any
) -> list[str]:
    """Send ``lines`` in order, keyed by account_id; their ``topic:partition:offset``.
    None sends a record with no value (a tombstone), keyed ``gone``. ``client``: more
    arguments of the producer (TLS, SASL)."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5, **client)
    await producer.start()
    try:
        futures = [
            # a tombstone has a key (aiokafka sends no record with neither)
            await producer.send(topic, raw, key=b"gone" if raw is None else account_key(raw))
            for raw in lines
        ]
        metas = [await f for f in futures]
    finally:
        await producer.stop()
    return [f"{m.topic}:{m.partition}:{m.offset}" for m in metas]


@dataclass
class Seen:
    """What was read back from an output or dead-letter topic."""

    by_source: dict[str, list[bytes]] = field(default_factory=dict)
    records: list[Any] = field(default_factory=list)


async def read_topic(
    bootstrap: str,
    topic: str,
    *,
    isolation: str = "read_uncommitted",
    until: int | None = None,
    records: int | None = None,
    timeout: float = 60,
    idle: float = 2.0,
    client: dict[str, Any] | None = None,
) -> Seen:
    """Every record of ``topic`` from the start, until ``until`` distinct sources (or idle).
    ``client``: more arguments of the consumer (TLS, SASL)."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        isolation_level=isolation,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        **(client or {}),
    )
    await consumer.start()
    seen = Seen()
    try:
        parts: set[int] = set()
        for _ in range(50):
            if topic in await consumer.topics():
                parts = consumer.partitions_for_topic(topic) or set()
                break
            await asyncio.sleep(0.1)
        assert parts, f"topic {topic} not found"
        consumer.assign([TopicPartition(topic, p) for p in parts])
        await consumer.seek_to_beginning()
        deadline = time.monotonic() + timeout
        quiet_since = time.monotonic()
        while time.monotonic() < deadline:
            batch = await consumer.getmany(timeout_ms=300)
            for fetched in batch.values():
                for r in fetched:
                    source = dict(r.headers)["source"].decode()
                    seen.by_source.setdefault(source, []).append(r.value)
                    seen.records.append(r)
            if batch:
                quiet_since = time.monotonic()
            elif records is not None:
                if len(seen.records) >= records:
                    break
            elif until is not None and len(seen.by_source) >= until:
                if time.monotonic() - quiet_since > 0.5:
                    break
            elif until is None and time.monotonic() - quiet_since > idle:
                break
    finally:
        await consumer.stop()
    return seen


def replay(
    lines: list[bytes], tmp: Path
) -> tuple[list[bytes | None], list[dict[str, Any] | None], str]:
    """What ``limitflow replay`` gives, per input line: verdict bytes or dead letter."""
    source = tmp / "replay-events.jsonl"
    source.write_bytes(b"".join(raw + b"\n" for raw in lines))
    store = tmp / "replay.db"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "limitflow",
            "replay",
            "--rules",
            RULES,
            "--input",
            str(source),
            "--output",
            str(tmp / "replay-verdicts.jsonl"),
            "--dead-letter",
            str(tmp / "replay-dead.jsonl"),
            "--store",
            f"sqlite:///{store}",
        ],
        cwd=REPO,
        capture_output=True,
        check=False,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr.decode()
    verdicts = (tmp / "replay-verdicts.jsonl").read_bytes().splitlines()
    dead = {
        json.loads(x)["source"]["line"]: json.loads(x)
        for x in (tmp / "replay-dead.jsonl").read_bytes().splitlines()
    }
    per_line_v: list[bytes | None] = []
    per_line_d: list[dict[str, Any] | None] = []
    it = iter(verdicts)
    for number in range(1, len(lines) + 1):
        if number in dead:
            per_line_v.append(None)
            per_line_d.append(dead[number])
        else:
            per_line_v.append(next(it))
            per_line_d.append(None)
    assert next(it, None) is None
    return per_line_v, per_line_d, str(store)


def counters(path: str) -> dict[str, Any]:
    """The store's counters, without versions and expiry (batching changes those), and
    each record's verdict as published (each file compresses them against a dictionary
    of its own, made from the first verdicts it stored)."""
    db = sqlite3.connect(path.removeprefix("sqlite:///"))
    try:
        found = db.execute("SELECT value FROM meta WHERE name = 'verdict_dictionary'").fetchone()
        codec = None if found is None else VerdictCodec(bytes(found[0]))
        events = db.execute("SELECT id, accepted, seq, verdict, reversed FROM events")
        return {
            "buckets": sorted(db.execute("SELECT key, count, amount FROM buckets")),
            "accounts": sorted(db.execute("SELECT id, seq FROM accounts")),
            "events": sorted(
                (key, accepted, seq, unpack_verdict(verdict, codec), released)
                for key, accepted, seq, verdict, released in events
            ),
        }
    finally:
        db.close()


async def store_counters(url: str, like: dict[str, Any]) -> dict[str, Any]:
    """The counters of any store, in ``counters()``'s shape, read through the store for
    the keys of ``like`` (the counters of replay's store)."""
    store = open_store(url)
    try:
        got = await store.load(
            Keys(
                buckets={key for key, _, _ in like["buckets"]},
                accounts={key for key, _ in like["accounts"]},
                events={key for key, *_ in like["events"]},
            )
        )
    finally:
        await store.close()
    return {
        "buckets": sorted((key, b.count, b.amount) for key, b in got.buckets.items()),
        "accounts": sorted((key, a.seq) for key, a in got.accounts.items()),
        "events": sorted(
            (key, int(r.accepted), r.seq, r.verdict, r.reversed) for key, r in got.events.items()
        ),
    }


async def read_verdicts(
    s: Setup, until: int, *, isolation: str, exactly_once: bool, timeout: float
) -> Seen:
    """The output topic's records, until ``until`` distinct sources. noida defect: a
    read_committed reader that fetched while a transaction was open (a killed run's, or
    a running one's) can take the same producer id's later committed batches for
    aborted ones and never return them; a reader started afterwards reads them all, so
    an exactly-once read left short is made once more."""
    read = functools.partial(
        read_topic,
        s.bootstrap,
        s.topics[1],
        isolation=isolation,
        until=until,
        timeout=timeout,
        client=s.client,
    )
    verdicts = await read()
    if exactly_once and len(verdicts.by_source) < until:
        verdicts = await read()
    return verdicts


async def check_against_replay(
    s: Setup,
    lines: list[bytes],
    sources: list[str],
    *,
    isolation: str = "read_uncommitted",
    exactly_once: bool = False,
    timeout: float = 120,
) -> tuple[Seen, Seen]:
    """The topics hold replay's verdicts and dead letters, one distinct value per input."""
    expected_v, expected_d, replay_store = replay(lines, s.tmp)
    dead_topic = s.topics[2]
    n_verdicts = sum(v is not None for v in expected_v)
    verdicts = await read_verdicts(
        s, n_verdicts, isolation=isolation, exactly_once=exactly_once, timeout=timeout
    )
    dead = await read_topic(
        s.bootstrap,
        dead_topic,
        isolation=isolation,
        until=len(lines) - n_verdicts,
        timeout=30,
        client=s.client,
    )
    for source, want_v, want_d in zip(sources, expected_v, expected_d, strict=True):
        if want_v is not None:
            got = verdicts.by_source.get(source)
            assert got, (
                f"no verdict for {source} ({json.loads(want_v)['event_id']}); "
                f"read {len(verdicts.by_source)} of {n_verdicts}: "
                f"{sorted(verdicts.by_source)[:3]}"
            )
            assert set(got) == {want_v}, f"{source}: {got} != {want_v!r}"
            if exactly_once:
                assert len(got) == 1, f"{source} published {len(got)} times"
        else:
            assert want_d is not None
            got_d = dead.by_source.get(source)
            assert got_d, f"no dead letter for {source}"
            letter = json.loads(got_d[0])
            topic, partition, offset = source.rsplit(":", 2)
            assert letter["source"] == {
                "topic": topic,
                "partition": int(partition),
                "offset": int(offset),
            }
            for name in ("error", "detail", "raw", "raw_base64", "event_id"):
                assert letter.get(name) == want_d.get(name), name
            if exactly_once:
                assert len(got_d) == 1
    assert set(sources) <= set(verdicts.by_source) | set(dead.by_source)
    # keyed by account, event_id header, and each account's new verdicts in seq order
    # 1, 2, 3… (a resend or a redelivered copy repeats an earlier verdict and seq)
    seen_ids: set[str] = set()
    last_seq: dict[str, int] = {}
    for r in sorted(verdicts.records, key=lambda r: (r.partition, r.offset)):
        doc = json.loads(r.value)
        assert r.key == doc["account_id"].encode()
        assert dict(r.headers)["event_id"] == doc["event_id"].encode()
        if doc["event_id"] in seen_ids:
            continue
        seen_ids.add(doc["event_id"])
        assert doc["seq"] == last_seq.get(doc["account_id"], 0) + 1, doc
        last_seq[doc["account_id"]] = doc["seq"]
    want = counters(replay_store)
    if s.store.startswith("sqlite:"):
        assert counters(s.store) == want
    else:
        assert await store_counters(s.store, want) == want
    return verdicts, dead


def wait_for(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def http_get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def readyz(port: int) -> tuple[int, dict[str, Any]]:
    """/readyz's status and body; (0, {}) while nothing listens on ``port`` yet."""
    try:
        status, body = http_get(port, "/readyz")
    except OSError:
        return 0, {}
    return status, json.loads(body)


# -- tests ------------------------------------------------------------------------------


async def test_verdicts_and_dead_letters_equal_replay(setup: Setup) -> None:
    lines = make_events(600)
    sources = await produce(setup.bootstrap, setup.topics[0], lines)
    port = _free_port()
    # options from the environment too: the flag-less ones here come from LIMITFLOW_*
    proc = setup.run("--http-port", str(port), env={"LIMITFLOW_BATCH_SIZE": "100"})
    await check_against_replay(setup, lines, sources)
    status, body = http_get(port, "/readyz")
    assert status == 200, body
    assert http_get(port, "/healthz")[0] == 200
    status, metrics = http_get(port, "/metrics")
    assert status == 200
    assert f"limitflow_events_total {float(len(lines))}" in metrics
    assert 'limitflow_dead_letters_total{error="invalid_json"}' in metrics
    assert (
        'limitflow_verdicts_total{decision="reject",duplicate="false",reason="limit_exceeded"}'
        in metrics
    )
    assert "limitflow_consumer_lag{" in metrics
    assert "limitflow_store_expired_deleted_total 0.0" in metrics  # nothing expired yet
    assert setup.stop(proc) == 0
    logs = [json.loads(x) for x in setup.log(0).splitlines() if x.startswith("{")]
    assert any(x["msg"] == "partitions assigned" for x in logs)


async def test_an_oracle_case_through_run_is_decided_as_the_model_says(
    tansu: Any, tmp_path: Path
) -> None:
    """One of the oracle's random cases (``tests/oracle``: DST zones, JPY and KWD amounts,
    numeric scope values, reversals of every outcome, resends reformatted or changed,
    invalid lines) sent to a topic of one partition, so that every account's events
    keep the file's order, and decided by ``run`` in batches of 9: each record's
    verdict or dead letter as the reference model says."""
    await oracle_case_through_run(tansu.bootstrap_servers, tmp_path)


async def test_an_oracle_case_through_run_exactly_once_is_decided_as_the_model_says(
    noida: Any, tmp_path: Path
) -> None:
    """The same on noida, in a Kafka transaction a batch: a ``read_committed`` reader sees
    the model's verdict or dead letter of each record, once."""
    await oracle_case_through_run(noida.bootstrap_servers, tmp_path, exactly_once=True)


async def test_an_oracle_case_through_run_in_python_alone_is_decided_as_the_model_says(
    tansu: Any, tmp_path: Path
) -> None:
    """The same by ``run`` as installed without a C compiler (``tests.without_extensions``:
    every compiled twin refused at import, Kafka's partitioner among them)."""
    await oracle_case_through_run(tansu.bootstrap_servers, tmp_path, compiled=False)


async def oracle_case_through_run(
    bootstrap: str, tmp_path: Path, *, exactly_once: bool = False, compiled: bool = True
) -> None:
    generated = oracle_case(ORACLE_SEED)
    s = Setup(bootstrap, tmp_path, f"oracle-{random.randrange(10**6)}", 1)
    s.create_topics()
    rules, version = oracle_rules(tmp_path, generated)
    sent = oracle_nonblank(generated)
    sources = await produce(s.bootstrap, s.topics[0], [line.encode() for _, line in sent])
    store = f"sqlite:///{tmp_path / 'store.db'}?{ORACLE_RETENTION}"
    guarantee = "exactly-once" if exactly_once else "at-least-once"
    isolation = "read_committed" if exactly_once else "read_uncommitted"
    try:
        module = "limitflow" if compiled else "tests.without_extensions"
        options = ("--guarantee", guarantee, "--batch-size", "9")
        proc = s.run(*options, rules=str(rules), store=store, module=module)
        # how many of each to wait for (a product that differs is reported below)
        n_dead = oracle_dead_letters(generated)
        verdicts = await read_verdicts(
            s, len(sent) - n_dead, isolation=isolation, exactly_once=exactly_once, timeout=60
        )
        dead = await read_topic(
            s.bootstrap, s.topics[2], isolation=isolation, until=n_dead, timeout=10
        )
        assert s.stop(proc) == 0, s.log(0)
        assert compiled or s.log(0).splitlines()[-1] == "compiled:", s.log(0)[-2000:]
    finally:
        s.kill_all()
    decided: list[bytes] = []
    letters: list[dict[str, Any]] = []
    for (number, _), source in zip(sent, sources, strict=True):
        copies = verdicts.by_source.get(source, []) + dead.by_source.get(source, [])
        assert copies and len(set(copies)) == 1, f"line {number} ({source}): {copies}"
        assert len(copies) == 1 or not exactly_once, f"line {number}: {len(copies)} copies"
        if source in verdicts.by_source:
            decided.append(copies[0])
        else:
            letters.append({**json.loads(copies[0]), "source": {"line": number}})
    found = oracle_differences(ORACLE_SEED, generated, decided, letters, version)
    assert not found, oracle_report(ORACLE_SEED, found, len(generated.lines))


async def test_kill_9_mid_stream_then_restart_loses_and_double_counts_nothing(setup: Setup) -> None:
    lines = make_events(1500, seed=2)
    sources = await produce(setup.bootstrap, setup.topics[0], lines)
    first = setup.run("--batch-size", "20")
    wait_for(lambda: _rows(setup.store) > 0, 60, "the first verdicts")
    time.sleep(0.5)
    first.kill()
    first.wait()
    decided_before = _rows(setup.store)
    assert decided_before < len(lines), "killed too late to be mid-stream"
    setup.run("--batch-size", "20")
    await check_against_replay(setup, lines, sources)


async def test_topic_replayed_from_zero_under_a_new_group_changes_nothing(setup: Setup) -> None:
    lines = make_events(400, seed=3)
    sources = await produce(setup.bootstrap, setup.topics[0], lines)
    proc = setup.run()
    first, _ = await check_against_replay(setup, lines, sources)
    assert setup.stop(proc) == 0
    before = counters(setup.store)
    proc = setup.run(group=f"{setup.name}-backfill")
    _, verdict_topic, _ = setup.topics
    again = await read_topic(
        setup.bootstrap, verdict_topic, records=len(first.records) * 2, timeout=90
    )
    # each input now has two published copies, byte for byte identical
    assert {s: set(v) for s, v in again.by_source.items()} == {
        s: set(v) for s, v in first.by_source.items()
    }
    assert all(len(v) == 2 for v in again.by_source.values())
    assert setup.stop(proc) == 0
    assert counters(setup.store) == before


def _assigned(setup: Setup, index: int) -> bool:
    """Whether run ``index`` has logged an assignment of some partitions."""
    return any(
        json.loads(x).get("msg") == "partitions assigned" and json.loads(x)["partitions"]
        for x in setup.log(index).splitlines()
        if x.startswith("{")
    )


async def test_two_consumers_in_one_group_split_the_work(setup: Setup) -> None:
    lines = make_events(1200, seed=4)
    a = setup.run("--batch-size", "50")
    b = setup.run("--batch-size", "50")
    wait_for(lambda: _assigned(setup, 0) and _assigned(setup, 1), 60, "both to get partitions")
    sources = await produce(setup.bootstrap, setup.topics[0], lines)
    await check_against_replay(setup, lines, sources)
    assert setup.stop(a) == 0
    assert setup.stop(b) == 0


async def test_a_member_given_an_empty_assignment_joins_again_and_decides(setup: Setup) -> None:
    """A SyncGroup response with empty assignment bytes (see ``tests.blank_assignment``)
    made aiokafka fail to decode it and ``run`` exit 1. The join is tried again: alone in
    its group, the member then gets every partition."""
    lines = make_events(600, seed=9)
    a = setup.run("--batch-size", "50", module="tests.blank_assignment limitflow")
    wait_for(
        lambda: "no assignment" in setup.log(0) or a.poll() is not None,
        60,
        "the member to be given empty assignment bytes",
    )
    assert a.poll() is None, setup.log(0)
    assert "blanking the assignment of join 1" in setup.log(0)
    sources = await produce(setup.bootstrap, setup.topics[0], lines)
    await check_against_replay(setup, lines, sources)
    assert "joining the group again in 1s" in setup.log(0)
    assert setup.stop(a) == 0, setup.log(0)


async def test_a_member_given_an_empty_assignment_in_a_rebalance_joins_again(
    setup: Setup,
) -> None:
    """The same on a rebalance: a member that held every partition is given empty bytes
    when a second member joins, and neither keeps its old partitions nor leaves its share
    without an owner: it joins again, and the two split the work."""
    lines = make_events(1200, seed=10)
    a = setup.run(
        "--batch-size", "50", module="tests.blank_assignment limitflow", env={"BLANK_JOIN": "2"}
    )
    wait_for(lambda: _assigned(setup, 0), 60, "the first member to get every partition")
    sources = await produce(setup.bootstrap, setup.topics[0], lines[:600])
    b = setup.run("--batch-size", "50")
    wait_for(
        lambda: "sent no assignment" in setup.log(0) or a.poll() is not None,
        60,
        "the first member to be given empty assignment bytes",
    )
    assert a.poll() is None, setup.log(0)
    wait_for(lambda: _assigned(setup, 1), 60, "the second member to get partitions")
    sources += await produce(setup.bootstrap, setup.topics[0], lines[600:])
    await check_against_replay(setup, lines, sources)
    assigned = [
        json.loads(x)["partitions"]
        for x in setup.log(0).splitlines()
        if x.startswith("{") and json.loads(x).get("msg") == "partitions assigned"
    ]
    assert len(assigned) >= 2 and 0 < len(assigned[-1]) < PARTITIONS, setup.log(0)
    assert setup.stop(a) == 0, setup.log(0)
    assert setup.stop(b) == 0, setup.log(1)


def test_a_stop_while_waiting_to_join_again_ends_at_once(setup: Setup) -> None:
    """Each join brings an empty assignment: the pauses between them grow (1, 2, 4, 8 s
    …), and a stop during one is heeded at once (aiokafka's close waits for the
    coordination task, in which the pause is)."""
    a = setup.run(module="tests.blank_assignment limitflow", env={"BLANK_JOIN": "every"})
    wait_for(lambda: "joining the group again in 8s" in setup.log(0), 90, "an 8 s pause")
    time.sleep(0.5)
    started = time.monotonic()
    assert setup.stop(a, timeout=30) == 0, setup.log(0)
    assert time.monotonic() - started < 6, setup.log(0)  # not the 8 s pause, nor 16 s
    assert "joining the group again in 16s" not in setup.log(0)


async def test_bad_input_only_goes_to_the_dead_letter_topic(setup: Setup) -> None:
    deep = b'{"event_id": "deep", "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    huge = b'{"event_id": "huge", "x": 1e99999999999999999999}'  # no Decimal holds it
    lines = [b"{oops", b"", b"\xff\x00", json.dumps({"event_id": "e1"}).encode(), deep, huge]
    sources = await produce(setup.bootstrap, setup.topics[0], [*lines, None])
    proc = setup.run()
    await check_against_replay(setup, lines[:1] + lines[2:], sources[:1] + sources[2:6])
    # an empty value and a null one (a tombstone) are dead letters too, which a file
    # cannot express; each says which it was
    letters = await read_topic(setup.bootstrap, setup.topics[2], until=7)
    empty = json.loads(letters.by_source[sources[1]][0])
    null = json.loads(letters.by_source[sources[6]][0])
    assert (empty["error"], empty["raw"], empty["detail"]) == (
        "invalid_json",
        "",
        "empty record: no JSON document",
    )
    assert (null["error"], null["raw"]) == ("invalid_json", "")
    assert null["detail"] == "null record (no value: a tombstone): no JSON document"
    assert setup.stop(proc) == 0


def _rows(store: str) -> int:
    path = store.removeprefix("sqlite:///")
    if not os.path.exists(path):
        return 0
    db = sqlite3.connect(path)
    try:
        return int(db.execute("SELECT count(*) FROM events").fetchone()[0])
    except sqlite3.OperationalError:
        return 0
    finally:
        db.close()


# -- outages --------------------------------------------------------------------------


class FlakyStore:
    """Wraps a real store; every call raises StoreUnavailable while ``down`` is set."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.down = False
        self.refused = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def _check(self) -> None:
        from limitflow.errors import StoreUnavailable

        if self.down:
            self.refused += 1
            raise StoreUnavailable("test outage: store refusing")

    async def load(self, keys: Any) -> Any:
        self._check()
        return await self.inner.load(keys)

    async def commit(self, writes: Any) -> None:
        self._check()
        await self.inner.commit(writes)


def _total_lag(metrics: str) -> float:
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith("limitflow_consumer_lag{")
    )


@contextlib.asynccontextmanager
async def serving_on_a_down_store(
    setup: Setup, port: int, **more: object
) -> AsyncIterator[FlakyStore]:
    """``serve`` (run's loop, in this process) on ``setup``'s topics and a store that
    refuses every request until its ``down`` is set False; stopped by SIGTERM after."""
    from limitflow.run_cli import serve
    from limitflow.settings import load_run_settings
    from schemas.rules import load_rules
    from stores import open_store

    events, verdicts, dead = setup.topics
    settings = load_run_settings(
        {
            "bootstrap_servers": setup.bootstrap,
            "input_topic": events,
            "output_topic": verdicts,
            "dead_letter_topic": dead,
            "group_id": f"{setup.name}-g",
            "rules": RULES,
            "store": setup.store,
            "http_port": port,
            "session_timeout_ms": 6000,
            "retry_initial_ms": 100,
            "retry_max_ms": 500,
            **more,
        },
        {},
    )
    inner = open_store(setup.store)
    await inner.init()
    store = FlakyStore(inner)
    store.down = True
    task = asyncio.create_task(serve(settings, load_rules(RULES), store))
    try:
        yield store
    finally:
        if not task.done():  # else serve() put the default action back: it would end pytest
            os.kill(os.getpid(), signal.SIGTERM)  # serve() installed its handler on this loop
        assert await asyncio.wait_for(task, 60) == 0
        await inner.close()


async def test_store_outage_pauses_then_resumes_without_loss(setup: Setup) -> None:
    lines = make_events(700, seed=5)
    sources = await produce(setup.bootstrap, setup.topics[0], lines[:500])
    port = _free_port()
    async with serving_on_a_down_store(setup, port, batch_size=100) as store:
        deadline = time.monotonic() + 60
        while store.refused < 5 and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        assert store.refused >= 5, "the consumer never reached the store"
        status, body = await asyncio.to_thread(http_get, port, "/readyz")
        assert status == 503 and json.loads(body)["state"] == "waiting", body
        assert (await asyncio.to_thread(http_get, port, "/healthz"))[0] == 200
        metrics = (await asyncio.to_thread(http_get, port, "/metrics"))[1]
        assert 'limitflow_retries_total{stage="decide"}' in metrics
        # the backlog shows as lag while the store is down, and grows with new events
        # (it read 0 throughout: lag was updated only between committed batches)
        before = _total_lag(metrics)
        assert before > 0, metrics
        sources += await produce(setup.bootstrap, setup.topics[0], lines[500:])
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            metrics = (await asyncio.to_thread(http_get, port, "/metrics"))[1]
            if _total_lag(metrics) > before:
                break
            await asyncio.sleep(0.5)
        assert _total_lag(metrics) > before, metrics
        assert _rows(setup.store) == 0
        store.down = False
        await check_against_replay(setup, lines, sources)
        assert (await asyncio.to_thread(http_get, port, "/readyz"))[0] == 200


async def produce_to(bootstrap: str, topic: str, partition: int, lines: Sequence[bytes]) -> None:
    """Send ``lines`` to ``partition`` of ``topic``, whatever their keys."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
    await producer.start()
    try:
        for raw in lines:
            await producer.send_and_wait(topic, raw, partition=partition)
    finally:
        await producer.stop()


def _lag_of(metrics: str, partition: int) -> float | None:
    prefix = f'limitflow_consumer_lag{{partition="{partition}"}} '
    for line in metrics.splitlines():
        if line.startswith(prefix):
            return float(line.removeprefix(prefix))
    return None


async def test_a_store_outage_shows_the_lag_of_partitions_outside_the_batch_in_hand(
    setup: Setup,
) -> None:
    # while the batch in hand waited on the store, only the lag of the partitions it came
    # from was asked of the brokers: the others, paused and not fetched, kept the lag they
    # had before the outage (0), however many events waited on them
    port = _free_port()
    events = setup.topics[0]
    async with serving_on_a_down_store(setup, port) as store:
        deadline = time.monotonic() + 60
        while (await asyncio.to_thread(readyz, port))[0] != 200:
            assert time.monotonic() < deadline, "never ready"
            await asyncio.sleep(0.2)
        await produce_to(setup.bootstrap, events, 0, [_pay(0)])  # the batch in hand
        deadline = time.monotonic() + 30
        while store.refused < 3:
            assert time.monotonic() < deadline, "the consumer never reached the store"
            await asyncio.sleep(0.2)
        for partition in (1, 2, 3):
            await produce_to(
                setup.bootstrap, events, partition, [_pay(partition * 100 + n) for n in range(20)]
            )
        deadline = time.monotonic() + 15
        while True:
            metrics = (await asyncio.to_thread(http_get, port, "/metrics"))[1]
            lags = [_lag_of(metrics, partition) for partition in (1, 2, 3)]
            if lags == [20, 20, 20] or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.5)
        assert lags == [20, 20, 20], metrics
        store.down = False


@pytest.fixture
def noida(tmp_path: Path) -> Iterator[Any]:
    with kafka_broker("noida") as handle:
        yield handle


@pytest.fixture
def on_noida(noida: Any, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Setup]:
    """A set-up on a noida broker of its own, its topics not made yet; its runs killed
    after the test."""
    name = request.node.name.replace("_", "-").replace("[", "-").replace("]", "")[:40]
    made = Setup(noida.bootstrap_servers, tmp_path, f"{name}-{random.randrange(10**6)}")
    yield made
    made.kill_all()


async def test_a_producer_stopped_on_a_hung_broker_leaves_no_socket_or_task(
    noida: Any, tmp_path: Path
) -> None:
    # under exactly-once, a transaction cut short by an outage discards its producer;
    # stop() waited for the batches in hand, gave up after its bound, and left the
    # sender, the client's connections and its metadata task running for good: two
    # sockets and four tasks more after every such outage of a long run
    s = Setup(noida.bootstrap_servers, tmp_path, f"hung-{random.randrange(10**6)}")
    s.create_topics()
    before = asyncio.all_tasks()
    producer = AIOKafkaProducer(
        bootstrap_servers=s.bootstrap, transactional_id=s.name, request_timeout_ms=3000
    )
    await producer.start()
    try:
        await producer.begin_transaction()
        for _ in range(5):
            await producer.send(s.topics[1], b"verdict")
        os.kill(_pid(noida), signal.SIGSTOP)  # a hung broker: nothing answers
        await asyncio.sleep(0.5)
        await _stop_quietly(producer, 2.0)
    finally:
        os.kill(_pid(noida), signal.SIGCONT)
    await asyncio.sleep(0.1)
    assert [t for t in asyncio.all_tasks() - before if not t.done()] == []
    assert [c for c in producer.client._conns.values() if c.connected()] == []


def _pid(handle: Any) -> int:
    pid = handle.pid if hasattr(handle, "pid") else handle.proc.pid
    assert isinstance(pid, int)
    return pid


async def group_members(bootstrap: str, group: str) -> list[Any]:
    """The members of ``group`` (DescribeGroups), as the broker has them."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        (described,) = await admin.describe_consumer_groups([group])
        ((error, _, _, _, _, members),) = described.groups
        assert error == 0, f"DescribeGroups {group}: error {error}"
        return list(members)
    finally:
        await admin.close()


async def evict_members(bootstrap: str, group: str) -> None:
    """Remove every member of ``group`` (LeaveGroup on their behalf), as a session timeout
    would once they are dead."""
    members = await group_members(bootstrap, group)
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        coordinator = admin._client.get_random_node()  # single-node broker
        for member in members:
            response = await admin._client.send(coordinator, LeaveGroupRequest(group, member[0]))
            assert response.error_code == 0, f"LeaveGroup {member[0]}: {response}"
    finally:
        await admin.close()


def _pay(n: int) -> bytes:
    """Payment ``p{n}`` of 1.00 CNY of ``acct-1``, all in one day."""
    return json.dumps(
        {
            "event_id": f"p{n}",
            "account_id": "acct-1",
            "amount": "1.00",
            "currency": "CNY",
            "occurred_at": "2026-03-14T01:00:00Z",
        }
    ).encode()


async def test_records_deleted_before_they_were_decided_are_said_and_counted(
    on_noida: Setup,
) -> None:
    # a member stopped for longer than the input's retention came back to a committed
    # offset the broker no longer held: aiokafka said so at INFO, which the log left out,
    # and reading went on from the earliest offset kept, records skipped without a word
    # (tansu has no DeleteRecords)
    s = on_noida
    s.partitions = 1
    s.create_topics()

    await produce(s.bootstrap, s.topics[0], [_pay(n) for n in range(10)])
    first = s.run()
    wait_for(lambda: _rows(s.store) == 10, 60, "the first ten decided")
    assert s.stop(first) == 0
    await produce(s.bootstrap, s.topics[0], [_pay(n) for n in range(10, 20)])
    admin = AIOKafkaAdminClient(bootstrap_servers=s.bootstrap)
    await admin.start()
    try:
        await admin.delete_records({TopicPartition(s.topics[0], 0): RecordsToDelete(15)})
    finally:
        await admin.close()
    port = _free_port()
    second = s.run("--http-port", str(port))
    wait_for(lambda: _rows(s.store) == 15, 60, "the records kept decided")
    _, metrics = http_get(port, "/metrics")
    assert 'limitflow_offset_resets_total{partition="0"} 1.0' in metrics
    assert s.stop(second) == 0
    warnings = [
        x
        for x in map(json.loads, filter(lambda x: x.startswith("{"), s.log(1).splitlines()))
        if x["level"] == "warning" and "out of range" in x["msg"]
    ]
    assert len(warnings) == 1, s.log(1)
    assert warnings[0]["logger"] == "limitflow.consumer"
    assert f"input partition {s.topics[0]}:0: offset 10 is out of range" in warnings[0]["msg"]
    verdicts = await read_topic(s.bootstrap, s.topics[1], until=15)
    decided = {json.loads(v)["event_id"] for vs in verdicts.by_source.values() for v in vs}
    assert decided == {f"p{n}" for n in (*range(10), *range(15, 20))}


@pytest.mark.parametrize("guarantee", ["at-least-once", "exactly-once"])
async def test_input_written_in_transactions_is_committed_past_its_markers(
    on_noida: Setup, guarantee: str
) -> None:
    # a batch committed the offset after its last record; the marker that ended the
    # upstream transaction after it stayed uncommitted, and the lag (limitflow's, and
    # any tool's reading the group's offsets) stayed at 1 a partition for good
    s = on_noida
    s.partitions = 2
    s.create_topics()
    lines = make_events(30, accounts=4, seed=11)
    upstream = AIOKafkaProducer(
        bootstrap_servers=s.bootstrap, transactional_id=f"upstream-{s.name}", acks="all"
    )
    await upstream.start()
    sources: list[str] = []
    try:
        for start in range(0, len(lines), 10):
            async with upstream.transaction():
                sent = [
                    await upstream.send(s.topics[0], raw, key=account_key(raw))
                    for raw in lines[start : start + 10]
                ]
            sources += [f"{m.topic}:{m.partition}:{m.offset}" for m in [await f for f in sent]]
    finally:
        await upstream.stop()
    port = _free_port()
    proc = s.run("--http-port", str(port), "--guarantee", guarantee)
    inputs = [TopicPartition(s.topics[0], p) for p in range(2)]
    reader = AIOKafkaConsumer(bootstrap_servers=s.bootstrap, group_id=f"{s.name}-group")
    await reader.start()
    try:
        ends = await reader.end_offsets(inputs)
        deadline = time.monotonic() + 60
        committed: dict[TopicPartition, int | None] = {}
        while time.monotonic() < deadline:
            committed = {tp: await reader.committed(tp) for tp in inputs}
            if committed == ends:
                break
            await asyncio.sleep(0.5)
        assert committed == ends  # the markers' offsets included
    finally:
        await reader.stop()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        metrics = (await asyncio.to_thread(http_get, port, "/metrics"))[1]
        lags = [x for x in metrics.splitlines() if x.startswith("limitflow_consumer_lag{")]
        if len(lags) == 2 and all(x.endswith(" 0.0") for x in lags):
            break
        await asyncio.sleep(0.5)
    assert len(lags) == 2 and all(x.endswith(" 0.0") for x in lags), lags
    exactly_once = guarantee == "exactly-once"
    isolation = "read_committed" if exactly_once else "read_uncommitted"
    await check_against_replay(s, lines, sources, isolation=isolation, exactly_once=exactly_once)
    assert s.stop(proc) == 0


@pytest.mark.parametrize("guarantee", ["at-least-once", "exactly-once"])
async def test_input_of_aborted_transactions_alone_is_committed_past_them(
    on_noida: Setup, guarantee: str
) -> None:
    # a partition no batch came from (all its input aborted, or, after a restart, only
    # markers past the group's offset) was taken to be read from the group's offset:
    # nothing of it was committed, and the group's lag stayed at its aborted records
    s = on_noida
    s.partitions = 2
    s.create_topics()
    upstream = AIOKafkaProducer(
        bootstrap_servers=s.bootstrap, transactional_id=f"upstream-{s.name}", acks="all"
    )
    await upstream.start()
    try:
        for partition, abort in ((0, False), (1, True)):
            await upstream.begin_transaction()
            sent = [
                await upstream.send(s.topics[0], _pay(n), partition=partition)
                for n in range(partition * 3, partition * 3 + 3)
            ]
            for future in sent:
                await future
            await (upstream.abort_transaction() if abort else upstream.commit_transaction())
    finally:
        await upstream.stop()
    proc = s.run("--guarantee", guarantee)
    inputs = [TopicPartition(s.topics[0], p) for p in range(2)]
    reader = AIOKafkaConsumer(bootstrap_servers=s.bootstrap, group_id=f"{s.name}-group")
    await reader.start()
    try:
        ends = await reader.end_offsets(inputs)
        deadline = time.monotonic() + 30
        committed: dict[TopicPartition, int | None] = {}
        while time.monotonic() < deadline:
            committed = {tp: await reader.committed(tp) for tp in inputs}
            if committed == ends:
                break
            await asyncio.sleep(0.5)
        assert committed == ends  # 4 each: the aborted records and the markers
    finally:
        await reader.stop()
    assert _rows(s.store) == 3
    assert s.stop(proc) == 0


async def test_a_quiet_partition_is_committed_past_its_marker_while_another_is_busy(
    on_noida: Setup,
) -> None:
    # markers were looked for only when a poll brought nothing: ~40 events a second on
    # one partition kept the marker of a quiet one uncommitted, its lag at 1, for as long
    s = on_noida
    s.partitions = 2
    s.create_topics()
    upstream = AIOKafkaProducer(
        bootstrap_servers=s.bootstrap, transactional_id=f"upstream-{s.name}", acks="all"
    )
    await upstream.start()
    try:
        async with upstream.transaction():
            await (await upstream.send(s.topics[0], _pay(0), partition=1))
    finally:
        await upstream.stop()
    proc = s.run()
    quiet = TopicPartition(s.topics[0], 1)
    producer = AIOKafkaProducer(bootstrap_servers=s.bootstrap, acks="all")
    reader = AIOKafkaConsumer(bootstrap_servers=s.bootstrap, group_id=f"{s.name}-group")
    await producer.start()
    await reader.start()
    try:
        committed = None
        deadline = time.monotonic() + 20
        n = 1
        while time.monotonic() < deadline:  # traffic on partition 0 all along
            await producer.send_and_wait(s.topics[0], _pay(n), partition=0)
            n += 1
            await asyncio.sleep(0.02)
            if n % 50 == 0 and (committed := await reader.committed(quiet)) == 2:
                break
        assert committed == 2  # past the marker, while partition 0 was still busy
    finally:
        await reader.stop()
        await producer.stop()
    assert s.stop(proc) == 0


@pytest.mark.parametrize("outage", ["frozen", "restarted"])
async def test_broker_outage_and_return_loses_nothing(
    noida: Any, tmp_path: Path, outage: str
) -> None:
    s = Setup(noida.bootstrap_servers, tmp_path, f"outage-{random.randrange(10**6)}")
    s.create_topics()
    try:
        lines = make_events(600, seed=6)
        half = len(lines) // 2
        sources = await produce(s.bootstrap, s.topics[0], lines[:half])
        proc = s.run("--batch-size", "50", "--request-timeout-ms", "3000")
        wait_for(lambda: _rows(s.store) > 0, 60, "the first verdicts")
        if outage == "frozen":  # a hung broker: connections stay open, nothing answers
            os.kill(_pid(noida), signal.SIGSTOP)
            time.sleep(8)
            assert proc.poll() is None, "limitflow run died with its broker"
            os.kill(_pid(noida), signal.SIGCONT)
        else:
            noida.stop()
            time.sleep(4)
            assert proc.poll() is None, "limitflow run died with its broker"
            noida.start()
        sources += await produce(s.bootstrap, s.topics[0], lines[half:])
        try:
            await check_against_replay(s, lines, sources)
        except AssertionError as exc:
            if outage == "restarted":
                # decisions are all in the store (counters are compared last, so check)
                _, _, replay_store = replay(lines, s.tmp)
                assert counters(s.store) == counters(replay_store)
                pytest.xfail(
                    "noida defect: records acknowledged with acks=all just before a "
                    f"SIGTERM are gone after restart, so verdicts vanish or reorder ({exc})"
                )
            raise
        assert s.stop(proc) == 0
    finally:
        s.kill_all()


async def test_exactly_once_a_partition_fenced_mid_stream_publishes_no_verdict_twice(
    noida: Any, tmp_path: Path
) -> None:
    # A batch spans several input partitions, each committed in a transaction of its own.
    # When one partition's producer is fenced (its new owner took over), the partitions
    # whose transactions had committed must not be read again: they were sent back to the
    # batch's start, and their verdicts went out twice to read_committed readers (this
    # test failed in 3 of 4 runs before the fix; the unit tests in
    # test_consumer.py and test_output.py check the two halves of the fix every time).
    # The fencing is done by hand, with the partition's transactional id, as a member
    # that took it over would.
    s = Setup(noida.bootstrap_servers, tmp_path, f"eos-{random.randrange(10**6)}")
    s.create_topics()
    try:
        lines = make_events(6000, accounts=40, seed=5)
        sources = await produce(s.bootstrap, s.topics[0], lines)
        proc = s.run("--guarantee", "exactly-once", "--batch-size", "100")
        wait_for(lambda: _rows(s.store) > 0, 120, "progress")
        fenced = f"limitflow:{s.name}-group:{s.topics[0]}:1"
        deadline = time.monotonic() + 180
        while _rows(s.store) < len(lines) * 3 // 4:  # fenced again and again, mid-stream
            assert proc.poll() is None, s.log(0)[-3000:]
            assert time.monotonic() < deadline, s.log(0)[-3000:]
            intruder = AIOKafkaProducer(
                bootstrap_servers=s.bootstrap, transactional_id=fenced, enable_idempotence=True
            )
            await intruder.start()
            await intruder.stop()
            await asyncio.sleep(0.1)
        await check_against_replay(
            s, lines, sources, isolation="read_committed", exactly_once=True, timeout=120
        )
        assert "batch abandoned" in s.log(0), "no transaction was fenced: nothing was tested"
        assert s.stop(proc) == 0
    finally:
        s.kill_all()


async def test_exactly_once_a_member_dropped_from_its_group_while_running_publishes_once(
    noida: Any, tmp_path: Path
) -> None:
    # A member whose session ended while it ran (noida never ends one: removed here as
    # Kafka's session timeout does) still takes its partitions for its own until its next
    # heartbeat, or until the new owner fences its producer: it rejoins then. The one that
    # found the other had committed past its batch went on from its own position and
    # published those verdicts again (a chaos test read 84-658 of 20,000 twice, 3 of 3).
    s = Setup(noida.bootstrap_servers, tmp_path, f"zombie-{random.randrange(10**6)}")
    s.create_topics()
    try:
        lines = make_events(6000, accounts=40, seed=8)
        sources = await produce(s.bootstrap, s.topics[0], lines)
        # a heartbeat every 20 s (a third of the session timeout): the first member stays
        # unaware of its removal while the second starts and takes its partitions over,
        # however slowly the machine runs (with 2 s, it could rejoin before any fence)
        first = s.run(
            "--guarantee", "exactly-once", "--batch-size", "7", "--session-timeout-ms", "60000"
        )
        wait_for(lambda: _rows(s.store) > 600, 120, "progress")
        await evict_members(s.bootstrap, f"{s.name}-group")  # it runs on, not knowing
        second = s.run("--guarantee", "exactly-once", "--batch-size", "7")
        wait_for(lambda: '"partitions assigned", "partitions": ["' in s.log(1), 60, "takeover")
        await check_against_replay(  # 5,000+ events in batches of 7: slow in a slow hour
            s, lines, sources, isolation="read_committed", exactly_once=True, timeout=120
        )
        assert "batch abandoned" in s.log(0), "the first member was never fenced"
        # fenced, it rejoins at once, each partition abandoned once at most (it went on
        # until its next heartbeat: 17 batches abandoned by each member in 20 s)
        assert "rejoining the group" in s.log(0)
        for index in (0, 1):
            assert s.log(index).count("batch abandoned") <= PARTITIONS, s.log(index)[-3000:]
        for proc in (first, second):
            assert s.stop(proc) == 0
    finally:
        s.kill_all()


async def test_exactly_once_survives_kill_9_mid_transaction(noida: Any, tmp_path: Path) -> None:
    s = Setup(noida.bootstrap_servers, tmp_path, f"eos-{random.randrange(10**6)}")
    s.create_topics()
    try:
        lines = make_events(1500, seed=7)
        sources = await produce(s.bootstrap, s.topics[0], lines)
        for _ in range(2):  # kill twice: the odds of landing inside a transaction add up
            proc = s.run("--guarantee", "exactly-once", "--batch-size", "10")
            before = _rows(s.store)
            wait_for(lambda b=before: _rows(s.store) > b + 50, 90, "progress")
            proc.kill()
            proc.wait()
            # noida defect: it never expires a dead member's session (the member stays
            # group leader and every later SyncGroup fails "group rebalance"), so a
            # restart in the same group would never get partitions. Do what Kafka's
            # session timeout does: remove the dead member. Its open transaction stays
            # open until the next run's producer (same transactional id) aborts it.
            await evict_members(s.bootstrap, f"{s.name}-group")
        assert _rows(s.store) < len(lines), "killed too late to be mid-stream"
        proc = s.run("--guarantee", "exactly-once", "--batch-size", "10")
        # read once the new run has fenced the killed one (see check_against_replay)
        wait_for(lambda: '"partitions assigned", "partitions": ["' in s.log(2), 60, "takeover")
        await check_against_replay(
            s, lines, sources, isolation="read_committed", exactly_once=True, timeout=40
        )
        assert s.stop(proc) == 0
        uncommitted = await read_topic(s.bootstrap, s.topics[1])
        committed = await read_topic(s.bootstrap, s.topics[1], isolation="read_committed")
        # what a read_uncommitted reader sees beyond that is aborted or replayed work
        assert len(uncommitted.records) >= len(committed.records)
    finally:
        s.kill_all()


async def test_a_dead_letter_larger_than_a_kafka_message_does_not_stop_run(
    noida: Any, tmp_path: Path
) -> None:
    # noida refuses records over ~1 MB, as Apache Kafka does (tansu takes any size).
    # 900 KB of quotes fits as input and is ~1.8 MB once JSON-escaped into `raw`:
    # refused on every retry, that dead letter stopped `limitflow run`.
    s = Setup(noida.bootstrap_servers, tmp_path, f"huge-{random.randrange(10**6)}")
    s.create_topics()
    try:
        huge = b'"' * 900_000
        ok = json.dumps(
            {
                "event_id": "after-huge",
                "account_id": "a1",
                "amount": "1.00",
                "currency": "CNY",
                "occurred_at": "2026-03-14T10:00:00Z",
            }
        ).encode()
        sources = await produce(s.bootstrap, s.topics[0], [huge, ok])
        proc = s.run()
        verdicts = await read_topic(s.bootstrap, s.topics[1], until=1)
        letters = await read_topic(s.bootstrap, s.topics[2], until=1)
        assert proc.poll() is None, s.log(0)[-3000:]
        assert list(verdicts.by_source) == [sources[1]]
        (letter,) = letters.by_source[sources[0]]
        doc = json.loads(letter)
        assert doc["error"] == "invalid_json" and "too large to repeat" in doc["detail"]
        assert "raw" not in doc or doc["raw"] is None
        assert (doc["raw_size"], doc["raw_sha256"]) == (len(huge), hashlib.sha256(huge).hexdigest())
        assert doc["source"]["offset"] == int(sources[0].rsplit(":", 1)[1])
        assert s.stop(proc) == 0
    finally:
        s.kill_all()


async def test_topics_made_for_a_larger_max_message_bytes_take_what_run_publishes(
    on_noida: Setup,
) -> None:
    # `topics create --max-message-bytes 3000000` took the flag and made topics of the
    # brokers' ~1 MB: run, with the same flag, published a dead letter of ~1.8 MB
    # (900 KB of quotes, JSON-escaped into `raw`) that they refused on every retry, exit 4
    s = on_noida
    s.security = ["--max-message-bytes", "3000000", "--compression", "none"]  # both commands
    s.create_topics()
    huge = b'"' * 900_000
    (source,) = await produce(s.bootstrap, s.topics[0], [huge])
    proc = s.run()
    letters = await read_topic(s.bootstrap, s.topics[2], until=1)
    assert proc.poll() is None, s.log(0)[-3000:]
    (letter,) = letters.by_source[source]
    assert json.loads(letter)["raw"] == huge.decode()  # whole: within --max-message-bytes
    assert s.stop(proc) == 0


def test_topics_create_says_when_a_topic_is_too_small_for_max_message_bytes(
    on_noida: Setup,
) -> None:
    # topics made with the brokers' ~1 MB were only said to exist when asked for again
    # with --max-message-bytes 3000000: run, with the same flag, stopped (exit 4) at the
    # first verdict or dead letter over 1 MB, with nothing said before
    s = on_noida
    s.create_topics()

    def create(*extra: str) -> tuple[list[str], str]:
        done = subprocess.run(
            [
                *(sys.executable, "-m", "limitflow", "topics", "create", *s.topic_args()),
                *("--partitions", str(s.partitions), *extra),
            ],
            cwd=REPO,
            capture_output=True,
            check=True,
            timeout=60,
        )
        return done.stdout.decode().splitlines(), done.stderr.decode()

    events, verdicts, dead = s.topics
    assert create()[0] == [f"{name}: exists" for name in s.topics]  # 1048588: enough
    said, logged = create("--max-message-bytes", "3000000")
    small = "exists, max.message.bytes 1048588 (run publishes up to 3048588)"
    # the input topic takes what its producers send: run publishes nothing to it
    assert said == [f"{events}: exists", f"{verdicts}: {small}", f"{dead}: {small}"]
    for name in (verdicts, dead):
        assert f"topic {name} exists with max.message.bytes 1048588" in logged


async def test_exactly_once_an_output_topic_made_again_mid_run_is_waited_for(
    on_noida: Setup,
) -> None:
    # the transactional producer's next batch to the new topic is refused with
    # OutOfOrderSequenceNumber (the broker knows no sequence of it there), fatal to that
    # producer only: `run` exited 4, for good, where at-least-once waits for the topic
    from aiokafka.admin import NewTopic

    s = on_noida
    s.partitions = 1
    s.create_topics()

    proc = s.run("--guarantee", "exactly-once")
    await produce(s.bootstrap, s.topics[0], [_pay(0)])
    await read_topic(s.bootstrap, s.topics[1], until=1)
    admin = AIOKafkaAdminClient(bootstrap_servers=s.bootstrap)
    await admin.start()
    try:
        await admin.delete_topics([s.topics[1]])
        await asyncio.sleep(1)
        (source,) = await produce(s.bootstrap, s.topics[0], [_pay(1)])
        await asyncio.sleep(3)
        if s.topics[1] not in await admin.list_topics():
            await admin.create_topics([NewTopic(s.topics[1], 1, 1)])
    finally:
        await admin.close()
    verdicts = await read_topic(s.bootstrap, s.topics[1], isolation="read_committed", until=1)
    assert proc.poll() is None, s.log(0)[-3000:]
    assert list(verdicts.by_source) == [source]
    assert s.stop(proc) == 0


async def test_exactly_once_a_transactional_id_the_coordinator_forgot_is_mapped_again(
    noida: Any, tmp_path: Path
) -> None:
    # A partition quiet for longer than transactional.id.expiration.ms: its producer's
    # next AddPartitionsToTxn is answered INVALID_PRODUCER_ID_MAPPING (one answer rewritten
    # so: see tests.expired_producer_id), which stops that producer only. `run` exited 4.
    s = Setup(noida.bootstrap_servers, tmp_path, f"expired-{random.randrange(10**6)}")
    s.create_topics()
    try:
        lines = make_events(600, seed=12)
        sources = await produce(s.bootstrap, s.topics[0], lines)
        proc = s.run(
            "--guarantee",
            "exactly-once",
            "--batch-size",
            "50",
            module="tests.expired_producer_id limitflow",
        )
        wait_for(lambda: "INVALID_PRODUCER_ID_MAPPING" in s.log(0), 60, "the expired id")
        wait_for(lambda: "publish recovered" in s.log(0) or proc.poll() is not None, 60, "a retry")
        assert proc.poll() is None, s.log(0)[-3000:]
        await check_against_replay(
            s, lines, sources, isolation="read_committed", exactly_once=True, timeout=60
        )
        assert "transactional id expired" in s.log(0)
        assert s.stop(proc) == 0
    finally:
        s.kill_all()


async def test_exactly_once_a_coordinator_lookup_cut_short_is_an_outage_not_a_refusal(
    noida: Any, tmp_path: Path
) -> None:
    # A transactional producer's FindCoordinator whose connection closed mid-request (a
    # broker restarting) fails its start, or stops its sender, with a bare KafkaError
    # (see tests.dropped_lookup): taken for a refusal, `run` exited for good, saying that
    # the brokers do not implement transactions.
    s = Setup(noida.bootstrap_servers, tmp_path, f"lookup-{random.randrange(10**6)}")
    s.create_topics()
    try:
        lines = make_events(300, seed=13)
        sources = await produce(s.bootstrap, s.topics[0], lines)
        proc = s.run("--guarantee", "exactly-once", module="tests.dropped_lookup limitflow")
        wait_for(lambda: "dropping a transaction" in s.log(0), 60, "the dropped lookup")
        wait_for(lambda: "assign recovered" in s.log(0) or proc.poll() is not None, 60, "a retry")
        assert proc.poll() is None, s.log(0)[-3000:]
        await check_against_replay(
            s, lines, sources, isolation="read_committed", exactly_once=True, timeout=60
        )
        assert s.stop(proc) == 0
    finally:
        s.kill_all()


async def test_topics_the_broker_refuses_to_create_stop_run_in_one_line(
    noida: Any, tmp_path: Path
) -> None:
    # a replication factor the one broker cannot give: a TopicError traceback, exit 1
    s = Setup(noida.bootstrap_servers, tmp_path, f"rf-{random.randrange(10**6)}")
    proc = s.run("--create-topics", "--replication-factor", "3")
    assert proc.wait(60) == 4
    out = s.log(0)
    assert "Traceback" not in out
    assert out.strip().splitlines()[-1].startswith("limitflow: cannot create topics: ")


def test_a_session_timeout_the_brokers_refuse_stops_run_in_one_line(on_noida: Setup) -> None:
    # noida refuses a session below its group.min.session.timeout.ms, as Apache Kafka
    # does: run ended with aiokafka's InvalidSessionTimeoutError traceback, exit 1
    on_noida.create_topics()
    proc = on_noida.run("--session-timeout-ms", "1")
    assert proc.wait(60) == 4
    out = on_noida.log(0)
    assert "Traceback" not in out
    last = out.strip().splitlines()[-1]
    assert last.startswith("limitflow: kafka: Kafka refused the group's session timeout")
    assert "LIMITFLOW_SESSION_TIMEOUT_MS" in last


def test_exactly_once_on_brokers_without_transactions_says_so_in_one_line(setup: Setup) -> None:
    # tansu answers InitProducerId with UnknownError: run said only
    # "limitflow: kafka: Kafka refused: UnknownError()"
    setup.create_topics()
    proc = setup.run("--guarantee", "exactly-once")
    assert proc.wait(60) == 4
    out = setup.log(0)
    assert "Traceback" not in out
    last = out.strip().splitlines()[-1]
    assert last.startswith("limitflow: kafka: the brokers refused a transactional producer (")
    assert "exactly-once needs brokers that implement Kafka transactions" in last


def test_a_stop_before_kafka_is_reachable_exits_0_at_once(tmp_path: Path) -> None:
    # was: "kafka failed for good", exit 4, after the retry wait in hand (up to 30 s)
    s = Setup(f"127.0.0.1:{_free_port()}", tmp_path, "unreachable")
    proc = s.run("--retry-initial-ms", "20000", "--retry-max-ms", "20000")
    wait_for(lambda: "cannot reach Kafka" in s.log(0), 30, "a failed connection")
    started = time.monotonic()
    assert s.stop(proc, timeout=10) == 0, s.log(0)[-2000:]
    assert time.monotonic() - started < 5
    assert "failed for good" not in s.log(0)


def test_kafka_unreachable_at_start_shows_on_readyz_and_in_the_metrics(tmp_path: Path) -> None:
    # /readyz said "starting", waiting on nothing, and no retry was counted, for as long
    # as a wrong --bootstrap-servers kept the consumer from ever reaching Kafka: an alert
    # on the waiting state or on retries never fired
    bootstrap = f"127.0.0.1:{_free_port()}"
    s = Setup(bootstrap, tmp_path, "unreachable")
    port = _free_port()
    proc = s.run("--http-port", str(port), "--retry-initial-ms", "100", "--retry-max-ms", "200")
    try:
        wait_for(lambda: readyz(port)[1].get("state") == "waiting", 30, "/readyz to show it")
        assert readyz(port) == (
            503,
            {
                "state": "waiting",
                "waiting_on": "kafka",
                "assigned": [],
                "seconds_since_last_batch": None,
            },
        )
        _, metrics = http_get(port, "/metrics")
        assert 'limitflow_retries_total{stage="start"}' in metrics
        assert 'limitflow_consumer_state{state="waiting"} 1.0' in metrics
        assert f"cannot reach Kafka at {bootstrap}" in s.log(0)
        # the settings in force are logged before the wait (they came only once consuming)
        logs = [json.loads(x) for x in s.log(0).splitlines() if x.startswith("{")]
        starting = next(x for x in logs if x["msg"] == "starting")
        assert (starting["group_id"], starting["bootstrap_servers"]) == (
            "unreachable-group",
            bootstrap,
        )
    finally:
        assert s.stop(proc, timeout=10) == 0


async def test_a_second_signal_while_closing_does_not_cut_the_close_short(
    noida: Any, tmp_path: Path
) -> None:
    # the handlers were removed before the clients closed: a second Ctrl-C then raised
    # KeyboardInterrupt (exit 130), and the member never left its group. The member's
    # leave is held 3 s (tests/slow_leave.py) to signal into the close every time: a
    # frozen broker did so only mostly (aiokafka skips the leave when it has given the
    # coordinator up, and the close then ends at once: CI, 3 tries of 3)
    s = Setup(noida.bootstrap_servers, tmp_path, f"sig-{random.randrange(10**6)}")
    s.create_topics()
    group = f"{s.name}-group"
    proc = s.run(module="tests.slow_leave limitflow")
    try:
        wait_for(lambda: "partitions assigned" in s.log(0), 60, "an assignment")
        assert len(await group_members(s.bootstrap, group)) == 1
        proc.send_signal(signal.SIGINT)
        wait_for(lambda: "leaving the group" in s.log(0), 30, "the close")
        proc.send_signal(signal.SIGINT)
        assert proc.wait(60) == 0, s.log(0)[-2000:]
    finally:
        s.kill_all()
    log = s.log(0)
    assert "already closing" in log.split("leaving the group", 1)[1], log[-2000:]
    assert await group_members(s.bootstrap, group) == []  # it left


async def test_a_sqlite_file_locked_by_another_process_is_an_outage_not_a_freeze(
    setup: Setup,
) -> None:
    # SQLite waited up to 30 s for the lock inside the call, holding the event loop: no
    # answer on /healthz, no heartbeat, no log line until the wait ended
    port = _free_port()
    proc = setup.run("--http-port", str(port), env={"LIMITFLOW_BATCH_SIZE": "100"})
    wait_for(lambda: "partitions assigned" in setup.log(0), 60, "an assignment")
    path = setup.store[len("sqlite:///") :]
    lines = make_events(300, seed=11)
    holder = sqlite3.connect(path, isolation_level=None)
    try:
        holder.execute("BEGIN EXCLUSIVE")
        sources = await produce(setup.bootstrap, setup.topics[0], lines)
        wait_for(lambda: "decide failed" in setup.log(0), 10, "the outage to be logged")
        started = time.monotonic()
        assert (await asyncio.to_thread(http_get, port, "/healthz"))[0] == 200
        assert time.monotonic() - started < 3
        status, body = await asyncio.to_thread(http_get, port, "/readyz")
        assert status == 503 and json.loads(body)["waiting_on"] == "decide", body
        assert proc.poll() is None
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    await check_against_replay(setup, lines, sources)
    assert setup.stop(proc) == 0


def test_ready_only_once_the_group_has_assigned_partitions(setup: Setup) -> None:
    # /readyz said 200 ("running", nothing assigned) before the member had joined
    port = _free_port()
    proc = setup.run("--http-port", str(port))
    answers: list[tuple[int, dict[str, Any]]] = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not any(status == 200 for status, _ in answers):
        try:
            status, body = http_get(port, "/readyz")
        except OSError:  # not listening yet
            time.sleep(0.05)
            continue
        answers.append((status, json.loads(body)))
        time.sleep(0.05)
    assert answers and answers[-1][0] == 200, answers[-3:]
    for status, answer in answers:
        if status == 200:
            assert answer["state"] == "running" and answer["assigned"], answer
        else:
            assert answer["state"] == "starting", answer
    assert setup.stop(proc) == 0


def test_an_idle_consumer_shows_a_broker_outage_and_still_stops_cleanly(tmp_path: Path) -> None:
    # aiokafka's getmany swallows fetch errors: /readyz said 200 through a whole outage,
    # and a SIGTERM then ended in a CancelledError traceback and exit 1
    with kafka_broker("tansu") as broker:
        s = Setup(broker.bootstrap_servers, tmp_path, f"idle-{random.randrange(10**6)}")
        s.create_topics()
        port = _free_port()
        proc = s.run("--http-port", str(port))
        try:
            wait_for(lambda: readyz(port)[0] == 200, 60, "ready")
            broker.kill()
            wait_for(lambda: readyz(port)[0] == 503, 20, "/readyz to show the outage")
            assert readyz(port)[1]["waiting_on"] == "fetch"
            _, metrics = http_get(port, "/metrics")
            assert 'limitflow_retries_total{stage="fetch"}' in metrics
            # which brokers: the line said only "brokers do not answer"
            assert f"brokers at {broker.bootstrap_servers} do not answer" in s.log(0)
            time.sleep(5)  # aiokafka logged ~100 ERROR lines a second of it
            assert s.stop(proc) == 0
            assert "Traceback" not in s.log(0), s.log(0)[-2000:]
            aiokafka = [line for line in s.log(0).splitlines() if '"logger": "aiokafka' in line]
            assert len(aiokafka) < 20, aiokafka[-5:]
        finally:
            s.kill_all()


def test_a_stop_while_joining_a_group_whose_brokers_went_away_is_heeded(tmp_path: Path) -> None:
    # aiokafka's getmany waits for the assignment whatever its timeout, for as long as
    # the join takes: B, joining when the broker died, ignored its SIGTERM (a reviewer
    # killed it after 90 s)
    with kafka_broker("tansu") as broker:
        s = Setup(broker.bootstrap_servers, tmp_path, f"join-{random.randrange(10**6)}")
        s.create_topics()
        try:
            a = s.run("--shutdown-grace-ms", "5000")
            wait_for(lambda: '"partitions assigned"' in s.log(0), 60, "A to get partitions")
            b = s.run("--shutdown-grace-ms", "5000")
            # A's rebalance starts once B has asked to join
            wait_for(lambda: "partitions revoked" in s.log(0), 30, "B to join")
            time.sleep(0.3)
            broker.kill()
            time.sleep(2)
            assert s.stop(b, timeout=20) == 0, s.log(1)[-2000:]
            assert s.stop(a, timeout=20) == 0
        finally:
            s.kill_all()


async def _deciding_a_backlog(
    noida: Any,
    tmp_path: Path,
    name: str,
    guarantee: str,
    *,
    request_timeout_ms: int,
    grace_ms: int,
) -> tuple[Setup, subprocess.Popen[bytes], int]:
    """``run`` on noida with an ops port, deciding a backlog of 1,500 events 5 at a time
    (a batch is always in hand): its setup, process and ops port."""
    s = Setup(noida.bootstrap_servers, tmp_path, f"{name}-{random.randrange(10**6)}")
    s.create_topics()
    try:
        await produce(s.bootstrap, s.topics[0], make_events(1500, seed=9))
        port = _free_port()
        proc = s.run(
            *("--guarantee", guarantee, "--batch-size", "5", "--http-port", str(port)),
            *("--request-timeout-ms", str(request_timeout_ms)),
            *("--shutdown-grace-ms", str(grace_ms)),
        )
        wait_for(lambda: _rows(s.store) > 20, 90, "progress")
    except BaseException:
        s.kill_all()
        raise
    return s, proc, port


@pytest.mark.parametrize("outage", ["stopped", "frozen"])
@pytest.mark.parametrize("guarantee", ["at-least-once", "exactly-once"])
async def test_a_stop_during_a_broker_outage_ends_within_the_grace(
    noida: Any, tmp_path: Path, guarantee: str, outage: str
) -> None:
    # aiokafka retries an offset commit, and a transaction's requests, without end while
    # the brokers are gone: the batch never failed, so neither the grace period nor a
    # second signal applied, and run exited only when the broker came back
    s, proc, port = await _deciding_a_backlog(
        noida, tmp_path, "stop", guarantee, request_timeout_ms=3000, grace_ms=5000
    )
    try:
        if outage == "frozen":  # connections stay open, nothing answers
            os.kill(_pid(noida), signal.SIGSTOP)
        else:
            noida.stop()
        try:
            wait_for(lambda: http_get(port, "/readyz")[0] == 503, 20, "/readyz to show it")
            stopped_at = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(45) == 0, s.log(0)[-3000:]
            assert time.monotonic() - stopped_at < 45
            assert "Traceback" not in s.log(0), s.log(0)
        finally:
            if outage == "frozen":
                os.kill(_pid(noida), signal.SIGCONT)
            else:
                noida.start()
    finally:
        s.kill_all()


@pytest.mark.parametrize("guarantee", ["at-least-once", "exactly-once"])
async def test_brokers_frozen_under_a_batch_show_at_once_and_a_stop_keeps_its_grace(
    noida: Any, tmp_path: Path, guarantee: str
) -> None:
    # with the default request timeout (30 s), a publish to brokers that went quiet
    # waited it out before it failed: /readyz said ready for those 30 s, and a SIGTERM
    # with a 3 s grace ended after ~60 s (the request in flight, then the clients' close)
    s, proc, port = await _deciding_a_backlog(
        noida, tmp_path, "frozen", guarantee, request_timeout_ms=30000, grace_ms=3000
    )
    try:
        os.kill(_pid(noida), signal.SIGSTOP)  # connections stay open, nothing answers
        try:
            frozen_at = time.monotonic()
            wait_for(lambda: readyz(port)[0] == 503, 15, "/readyz to show it")
            assert time.monotonic() - frozen_at < 12  # ~5 s, not the 30 s timeout
            assert readyz(port)[1]["waiting_on"] == "publish"
            stopped_at = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(60) == 0, s.log(0)[-3000:]
            # 3 s of grace, then each client's close (2 s at least): not the 30 s timeout
            assert time.monotonic() - stopped_at < 20, s.log(0)[-3000:]
            log = s.log(0)
            assert "publish: no answer after 5s; still waiting" in log
            assert "stop grace period expired while waiting on publish" in log
            assert "Traceback" not in log
            assert "Task was destroyed" not in log and "never retrieved" not in log
        finally:
            os.kill(_pid(noida), signal.SIGCONT)
    finally:
        s.kill_all()


async def test_partitions_added_to_the_input_topic_are_read_within_a_minute(
    noida: Any, tmp_path: Path
) -> None:
    # they are assigned at the consumer's next metadata refresh: with aiokafka's default
    # (5 minutes) their events waited that long, /readyz saying running all the while.
    # On noida: tansu does not implement CreatePartitions.
    from aiokafka.admin import NewPartitions

    s = Setup(noida.bootstrap_servers, tmp_path, f"grow-{random.randrange(10**6)}", partitions=2)
    s.create_topics()
    proc = s.run()
    try:
        wait_for(lambda: _assigned(s, 0), 60, "an assignment")
        admin = AIOKafkaAdminClient(bootstrap_servers=s.bootstrap)
        await admin.start()
        try:
            await admin.create_partitions({s.topics[0]: NewPartitions(total_count=4)})
        finally:
            await admin.close()
        producer = AIOKafkaProducer(bootstrap_servers=s.bootstrap)
        await producer.start()
        try:
            for partition in range(4):
                event = {
                    "event_id": f"e{partition}",
                    "account_id": f"a{partition}",
                    "amount": "1.00",
                    "currency": "CNY",
                    "occurred_at": "2026-03-14T10:00:00Z",
                }
                await producer.send_and_wait(
                    s.topics[0], json.dumps(event).encode(), partition=partition
                )
        finally:
            await producer.stop()
        wait_for(lambda: _rows(s.store) == 4, 60, "the events of the new partitions decided")
        assert s.stop(proc) == 0
    finally:
        s.kill_all()


def test_topics_create_says_when_a_topic_exists_with_another_partition_count(
    setup: Setup,
) -> None:
    # "exists" was all it said: an input topic of fewer partitions than planned caps how
    # many members share the work, and nothing told the operator
    said: list[str] = []  # each run's stderr

    def create(partitions: int) -> list[str]:
        done = subprocess.run(
            [
                *(sys.executable, "-m", "limitflow", "topics", "create"),
                *(*setup.topic_args(), "--partitions", str(partitions)),
            ],
            cwd=REPO,
            capture_output=True,
            check=True,
            timeout=60,
        )
        said.append(done.stderr.decode())
        return done.stdout.decode().splitlines()

    names = setup.topics
    assert create(PARTITIONS) == [f"{name}: exists" for name in names]
    assert create(PARTITIONS + 2) == [
        f"{name}: exists, kept with {PARTITIONS} partitions (not {PARTITIONS + 2})"
        for name in names
    ]
    # the warnings on stderr name their topics: three times the same line, it said
    for name in names:
        assert f"topic {name} exists with {PARTITIONS} partitions, not {PARTITIONS + 2}" in said[-1]


async def test_the_last_line_gives_every_count_also_those_at_zero(setup: Setup) -> None:
    # "ran for" left out the kinds that did not occur: a dashboard reading
    # dead_letters from it found no field, not 0
    lines = [
        json.dumps(
            {
                "event_id": f"z{n}",
                "account_id": "acct-z",
                "amount": "1.00",
                "currency": "CNY",
                "occurred_at": "2026-03-14T01:00:00Z",
            }
        ).encode()
        for n in range(3)
    ]
    await produce(setup.bootstrap, setup.topics[0], lines)
    proc = setup.run()
    wait_for(lambda: _rows(setup.store) == 3, 60, "three verdicts")
    assert setup.stop(proc) == 0
    logs = [json.loads(x) for x in setup.log(0).splitlines() if x.startswith("{")]
    ran = next(x for x in logs if x["msg"].startswith("ran for"))
    assert (ran["verdicts"], ran["duplicates"], ran["dead_letters"]) == (3, 0, 0), ran
