"""The faust app against a real broker: its verdicts equal ``limitflow replay``'s.

Starts tansu (``tests.servers.kafka_broker``), runs ``faust -A streams.faust_app worker``
as a subprocess configured through ``LIMITFLOW_*`` variables, and reads the output and
dead-letter topics with aiokafka. The input topic has one partition, so the app sees the
events in file order, as replay does (rules scoped by merchant or card cross accounts, so
a verdict depends on the order across accounts too).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import closing
from pathlib import Path

import pytest
from aiokafka import (  # type: ignore[import-untyped]
    AIOKafkaConsumer,
    AIOKafkaProducer,
    TopicPartition,
)
from aiokafka.admin import (  # type: ignore[import-untyped]
    AIOKafkaAdminClient,
    NewTopic,
    RecordsToDelete,
)

from benchmarks.generate import events as generated_events
from tests.faust_worker import faust_worker
from tests.integration.test_kafka_run import (
    ORACLE_SEED,
    Setup,
    _rows,
    check_against_replay,
    counters,
    make_events,
)
from tests.integration.test_kafka_run import produce as produce_keyed
from tests.oracle.generate import case as oracle_case
from tests.servers import KafkaBroker, free_port, kafka_broker
from tests.unit.test_oracle import RETENTION as ORACLE_RETENTION
from tests.unit.test_oracle import dead_letters_of as oracle_dead_letters
from tests.unit.test_oracle import differences as oracle_differences
from tests.unit.test_oracle import nonblank as oracle_nonblank
from tests.unit.test_oracle import report as oracle_report
from tests.unit.test_oracle import write_rules as oracle_rules

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.integration

RULES = ROOT / "examples" / "rules.yaml"
BAD_INPUT = [b"{not json", b'{"event_id": "bad-1", "account_id": "a"}', b"\xff\xfe binary"]


@pytest.fixture(scope="module")
def kafka() -> Iterator[KafkaBroker]:
    with kafka_broker("tansu") as broker:
        yield broker


class Topics:
    def __init__(self) -> None:
        tag = uuid.uuid4().hex[:8]
        self.input = f"events-{tag}"
        self.output = f"verdicts-{tag}"
        self.dead = f"dead-{tag}"


async def made_topics(kafka: KafkaBroker) -> Topics:
    """A test's own three topics, the input of one partition."""
    names = Topics()
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka.bootstrap_servers)
    await admin.start()
    try:
        await admin.create_topics(
            [
                NewTopic(names.input, 1, 1),
                NewTopic(names.output, 3, 1),
                NewTopic(names.dead, 1, 1),
            ]
        )
    finally:
        await admin.close()
    return names


@pytest.fixture
async def topics(kafka: KafkaBroker) -> AsyncIterator[Topics]:
    yield await made_topics(kafka)


def input_lines() -> list[bytes]:
    sample = [line for line in (ROOT / "examples" / "events.jsonl").read_bytes().splitlines()]
    return [line for line in sample if line.strip()] + generated_events(1_500, accounts=150)


def replay(
    lines: list[bytes], tmp_path: Path, store: str = "memory://"
) -> tuple[list[bytes], list[dict[str, object]]]:
    """Verdict lines and dead letters of ``limitflow replay`` on ``lines``."""
    source = tmp_path / "events.jsonl"
    source.write_bytes(b"\n".join(lines) + b"\n")
    verdicts, dead = tmp_path / "verdicts.jsonl", tmp_path / "dead.jsonl"
    subprocess.run(
        [
            *[sys.executable, "-m", "limitflow", "replay"],
            *["--rules", str(RULES), "--input", str(source)],
            *["--output", str(verdicts), "--dead-letter", str(dead), "--store", store],
        ],
        check=True,
        cwd=ROOT,
        capture_output=True,
    )
    return verdicts.read_bytes().splitlines(), [
        json.loads(line) for line in dead.read_bytes().splitlines()
    ]


def per_account(verdicts: list[bytes]) -> dict[str, list[bytes]]:
    """Each account's verdicts, in the order given."""
    by_account: dict[str, list[bytes]] = {}
    for value in verdicts:
        by_account.setdefault(json.loads(value)["account_id"], []).append(value)
    return by_account


async def produce(kafka: KafkaBroker, topic: str, lines: Sequence[bytes | None]) -> None:
    """None: a record with no value (a tombstone), keyed ``gone``."""
    producer = AIOKafkaProducer(bootstrap_servers=kafka.bootstrap_servers, linger_ms=5)
    await producer.start()
    try:
        for line in lines:
            await producer.send(topic, line, key=b"gone" if line is None else None)
        await producer.flush()
    finally:
        await producer.stop()


class Worker:
    """``faust -A streams.faust_app worker`` as a subprocess."""

    def __init__(
        self,
        kafka: KafkaBroker,
        topics: Topics,
        store: str,
        group: str,
        log: Path,
        batch_size: str = "500",
        wrap: tuple[str, ...] = (),
        web: bool = False,
        **settings: str,
    ):
        """``wrap``: run the worker by ``python -m`` a script that injects a fault;
        ``web``: with faust's web server."""
        argv, env = faust_worker(
            kafka.bootstrap_servers,
            (topics.input, topics.output, topics.dead),
            group,
            store,
            batch_size=batch_size,
            **settings,
        )
        if web:
            argv.remove("--without-web")
        if wrap:
            argv = [sys.executable, "-m", *wrap, "faust", *argv[1:]]
        self.log = log
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(
                argv,
                cwd=ROOT,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def stop(self) -> int:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                return self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
        return self.proc.wait(10)

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)


async def in_transactions(
    kafka: KafkaBroker, topic: str, transactions: Sequence[tuple[Sequence[bytes], bool]]
) -> None:
    """Send each list of records to ``topic`` in a Kafka transaction of its own, one after
    another, committed where its flag is true and aborted where it is false."""
    upstream = AIOKafkaProducer(
        bootstrap_servers=kafka.bootstrap_servers, transactional_id=f"up-{topic}"
    )
    await upstream.start()
    try:
        for records, commit in transactions:
            await upstream.begin_transaction()
            for raw in records:
                await upstream.send_and_wait(topic, raw)
            await (upstream.commit_transaction() if commit else upstream.abort_transaction())
    finally:
        await upstream.stop()


async def read_until(
    kafka: KafkaBroker, topics: Topics, verdicts: int, dead: int, worker: Worker, timeout: float
) -> tuple[list[tuple[bytes | None, bytes, dict[str, bytes]]], list[dict[str, object]]]:
    """Records of the output and dead-letter topics until there are that many of each."""
    consumer = AIOKafkaConsumer(
        topics.output,
        topics.dead,
        bootstrap_servers=kafka.bootstrap_servers,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    await consumer.start()
    out: list[tuple[bytes | None, bytes, dict[str, bytes]]] = []
    letters: list[dict[str, object]] = []
    deadline = time.monotonic() + timeout
    try:
        while len(out) < verdicts or len(letters) < dead:
            if worker.proc.poll() is not None:
                pytest.fail(f"worker exited {worker.proc.returncode}:\n{worker.log.read_text()}")
            if time.monotonic() > deadline:
                pytest.fail(
                    f"{len(out)}/{verdicts} verdicts, {len(letters)}/{dead} dead letters "
                    f"after {timeout}s; worker log:\n{worker.log.read_text()[-5000:]}"
                )
            batches = await consumer.getmany(timeout_ms=500)
            for tp, records in batches.items():
                for record in records:
                    assert record.value is not None
                    if tp.topic == topics.output:
                        out.append((record.key, record.value, dict(record.headers)))
                    else:
                        letters.append(json.loads(record.value))
        # nothing more than expected: no verdict is published twice in a clean run
        await asyncio.sleep(1)
        extra = await consumer.getmany(timeout_ms=500)
        assert not any(extra.values())
    finally:
        await consumer.stop()
    return out, letters


async def test_verdicts_equal_replay_and_topic_replay_repeats_them(
    kafka: KafkaBroker, topics: Topics, tmp_path: Path
) -> None:
    lines = input_lines()
    lines = lines[:700] + BAD_INPUT + lines[700:]
    expected, expected_dead = replay(lines, tmp_path)
    assert len(expected_dead) >= len(BAD_INPUT)  # examples/events.jsonl has some too
    # and a tombstone, which a file cannot hold: a dead letter that says what it was
    await produce(kafka, topics.input, [*lines, None])
    tombstone: dict[str, object] = {
        "error": "invalid_json",
        "detail": "null record (no value: a tombstone): no JSON document",
        "raw": "",
        "source": {"line": len(lines) + 1},
    }
    expected_dead.append(tombstone)

    store = f"sqlite:///{tmp_path / 'faust.db'}"
    worker = Worker(kafka, topics, store, f"g-{uuid.uuid4().hex[:6]}", tmp_path / "w1.log")
    try:
        out, letters = await read_until(
            kafka, topics, len(expected), len(expected_dead), worker, 120
        )
    finally:
        assert worker.stop() == 0, (tmp_path / "w1.log").read_text()[-3000:]

    assert sorted(value for _, value, _ in out) == sorted(expected)
    for key, value, headers in out:
        verdict = json.loads(value)
        assert key == verdict["account_id"].encode()
        assert headers["event_id"] == verdict["event_id"].encode()
        assert headers["source"].decode().startswith(f"{topics.input}:0:")  # as from run
    assert len({headers["source"] for _, _, headers in out}) == len(out)
    # one input partition: each account's verdicts come out in input order
    assert per_account([value for _, value, _ in out]) == per_account(expected)

    # dead letters: the same errors, details and original bytes, in input order
    def without_source(letter: dict[str, object]) -> dict[str, object]:
        return {k: v for k, v in letter.items() if k != "source"}

    assert [without_source(d) for d in letters] == [without_source(d) for d in expected_dead]
    # record N of the topic is line N + 1 of the file (no blank lines)
    offsets = {d["source"]["line"] - 1 for d in expected_dead}  # type: ignore[index]
    assert {d["source"]["offset"] for d in letters} == offsets  # type: ignore[index]
    assert all(d["source"]["topic"] == topics.input for d in letters)  # type: ignore[index]

    # the same topic read again from offset 0 by a new group, on the same store: every
    # event is recognised, and the verdicts published again are identical
    again = Worker(kafka, topics, store, f"g-{uuid.uuid4().hex[:6]}", tmp_path / "w2.log")
    try:
        out2, letters2 = await read_until(
            kafka, topics, 2 * len(expected), 2 * len(expected_dead), again, 120
        )
    finally:
        assert again.stop() == 0, (tmp_path / "w2.log").read_text()[-3000:]
    assert sorted(value for _, value, _ in out2) == sorted(expected * 2)
    assert len(letters2) == 2 * len(expected_dead)


async def test_an_oracle_case_is_decided_as_the_model_says(
    kafka: KafkaBroker, topics: Topics, tmp_path: Path
) -> None:
    """The oracle case that ``run`` is checked on (``test_kafka_run``), through the faust
    app in batches of 9: each record's verdict or dead letter as the reference model
    says, and no verdict twice."""
    generated = oracle_case(ORACLE_SEED)
    rules, version = oracle_rules(tmp_path, generated)
    sent = oracle_nonblank(generated)
    n_dead = oracle_dead_letters(generated)
    await produce(kafka, topics.input, [line.encode() for _, line in sent])
    store = f"sqlite:///{tmp_path / 'faust.db'}?{ORACLE_RETENTION}"
    group = f"g-{uuid.uuid4().hex[:6]}"
    worker = Worker(kafka, topics, store, group, tmp_path / "w.log", "9", rules=str(rules))
    try:
        out, letters = await read_until(kafka, topics, len(sent) - n_dead, n_dead, worker, 120)
    finally:
        assert worker.stop() == 0, (tmp_path / "w.log").read_text()[-3000:]
    # the input's one partition: the record at offset k is line sent[k]
    by_offset = {int(headers["source"].rsplit(b":", 1)[1]): value for _, value, headers in out}
    for letter in letters:
        letter["source"] = {"line": sent[letter["source"]["offset"]][0]}  # type: ignore[index]
    decided = [by_offset[offset] for offset in sorted(by_offset)]
    found = oracle_differences(ORACLE_SEED, generated, decided, letters, version)
    assert not found, oracle_report(ORACLE_SEED, found, len(generated.lines))


async def test_kill_9_mid_stream_then_restart_loses_and_double_counts_nothing(
    kafka: KafkaBroker, topics: Topics, tmp_path: Path
) -> None:
    """A worker killed with SIGKILL mid-stream, then started again in its group: every
    event gets the verdict replay gives it (one published twice, identical both times),
    every bad record its dead letter, and the store holds exactly replay's counters."""
    sample = (ROOT / "examples" / "events.jsonl").read_bytes().splitlines()
    lines = [line for line in sample if line.strip()] + generated_events(6_000, accounts=300)
    lines = lines[:700] + BAD_INPUT + lines[700:]
    replayed = f"sqlite:///{tmp_path / 'replay.db'}"
    expected, expected_dead = replay(lines, tmp_path, replayed)
    await produce(kafka, topics.input, lines)
    store = f"sqlite:///{tmp_path / 'faust.db'}"
    group = f"g-{uuid.uuid4().hex[:6]}"
    first = Worker(kafka, topics, store, group, tmp_path / "w1.log", batch_size="20")
    probe = AIOKafkaConsumer(bootstrap_servers=kafka.bootstrap_servers, group_id=group)
    await probe.start()
    try:
        # killed once it has committed some offsets: the restart resumes from them, and
        # what came after them is delivered again
        deadline = time.monotonic() + 90
        while not await probe.committed(TopicPartition(topics.input, 0)):
            assert first.proc.poll() is None, first.log.read_text()[-3000:]
            assert time.monotonic() < deadline, first.log.read_text()[-3000:]
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.1)
    finally:
        first.kill()
        await probe.stop()
    decided = _rows(store)
    assert 0 < decided < len(counters(replayed)["events"]), "killed too late to be mid-stream"

    again = Worker(kafka, topics, store, group, tmp_path / "w2.log", batch_size="20")
    consumer = AIOKafkaConsumer(
        topics.output,
        topics.dead,
        bootstrap_servers=kafka.bootstrap_servers,
        auto_offset_reset="earliest",
    )
    await consumer.start()
    by_source: dict[bytes, set[bytes]] = {}
    letters: dict[int, set[bytes]] = {}
    try:
        deadline = time.monotonic() + 120
        while len(by_source) < len(expected) or len(letters) < len(expected_dead):
            assert again.proc.poll() is None, again.log.read_text()[-3000:]
            assert time.monotonic() < deadline, (
                f"{len(by_source)}/{len(expected)} verdicts, {len(letters)}/"
                f"{len(expected_dead)} dead letters; {again.log.read_text()[-3000:]}"
            )
            for tp, records in (await consumer.getmany(timeout_ms=500)).items():
                for record in records:
                    assert record.value is not None
                    if tp.topic == topics.output:
                        source = dict(record.headers)["source"]
                        by_source.setdefault(source, set()).add(record.value)
                    else:
                        offset = json.loads(record.value)["source"]["offset"]
                        letters.setdefault(offset, set()).add(record.value)
    finally:
        await consumer.stop()
        assert again.stop() == 0, again.log.read_text()[-3000:]
    # an event decided before the kill and published again after it: the same bytes
    assert all(len(values) == 1 for values in by_source.values())
    assert all(len(values) == 1 for values in letters.values())
    assert sorted(value for (value,) in by_source.values()) == sorted(expected)
    assert sorted(letters) == sorted(d["source"]["line"] - 1 for d in expected_dead)  # type: ignore[index]
    # and nothing was counted twice or lost
    assert counters(store) == counters(replayed)


async def test_a_second_worker_joining_mid_stream_splits_the_work(
    kafka: KafkaBroker, tmp_path: Path
) -> None:
    """A second worker of the group started mid-stream on the same store, as a team
    scales a faust app out: the partitions are split between the two (a rebalance while
    the first is deciding), and together they publish replay's verdicts and dead
    letters, one distinct value per input record, and leave replay's counters."""
    setup = Setup(kafka.bootstrap_servers, tmp_path, f"faust2-{uuid.uuid4().hex[:6]}")
    setup.create_topics()  # 4 input partitions
    group = f"g-{uuid.uuid4().hex[:6]}"
    names = Topics()
    names.input, names.output, names.dead = setup.topics
    lines = make_events(2_000, seed=41)
    half = len(lines) // 2
    workers = [Worker(kafka, names, setup.store, group, tmp_path / "w1.log", batch_size="20")]
    try:
        sources = await produce_keyed(setup.bootstrap, names.input, lines[:half])
        wait_for_log(workers[0], f"| {names.input} | {{0-3}}", 90)
        while _rows(setup.store) < 100:  # deciding
            await asyncio.sleep(0.05)
        workers.append(
            Worker(kafka, names, setup.store, group, tmp_path / "w2.log", batch_size="20")
        )
        wait_for_log(workers[1], f"| {names.input} | {{", 90)  # given some partitions
        sources += await produce_keyed(setup.bootstrap, names.input, lines[half:])
        await check_against_replay(setup, lines, sources)
    finally:
        for worker in workers:
            assert worker.stop() == 0, worker.log.read_text()[-3000:]
    # the first gave some partitions up to the second
    assert f"| {names.input} | {{0-3}}" in workers[0].log.read_text()
    assert workers[0].log.read_text().count("Setting newly assigned partitions") >= 2


async def test_a_worker_given_an_empty_assignment_joins_again_and_decides(
    kafka: KafkaBroker, topics: Topics, tmp_path: Path
) -> None:
    """A SyncGroup response with empty assignment bytes (see ``tests.blank_assignment``)
    made aiokafka's coordination fail and left the worker in no group. The join is tried
    again: alone in its group, the worker then gets the partition."""
    lines = input_lines()[:400]
    expected, expected_dead = replay(lines, tmp_path)
    store = f"sqlite:///{tmp_path / 'faust.db'}"
    group = f"g-{uuid.uuid4().hex[:6]}"
    blank = Worker(
        kafka, topics, store, group, tmp_path / "w1.log", wrap=("tests.blank_assignment",)
    )
    try:
        deadline = time.monotonic() + 90
        while "sent no assignment" not in blank.log.read_text(errors="replace"):
            assert blank.proc.poll() is None, blank.log.read_text()[-5000:]
            assert time.monotonic() < deadline, blank.log.read_text()[-5000:]
            await asyncio.sleep(0.2)
        assert "blanking the assignment of join 1" in blank.log.read_text()
        await produce(kafka, topics.input, lines)
        out, letters = await read_until(
            kafka, topics, len(expected), len(expected_dead), blank, 120
        )
    finally:
        assert blank.stop() == 0, blank.log.read_text()[-3000:]
    assert sorted(value for _, value, _ in out) == sorted(expected)
    assert len(letters) == len(expected_dead)


def _meanings_kept(path: Path) -> bool:
    """Whether the sqlite store at ``path`` holds rule meanings yet."""
    if not path.exists():
        return False
    try:
        with closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=0.1)) as db:
            (kept,) = db.execute("SELECT count(*) FROM meta WHERE name LIKE 'rule:%'").fetchone()
    except sqlite3.Error:  # not made yet, or locked by the worker's start
        return False
    return bool(kept)


async def test_a_stop_while_the_store_is_locked_ends_and_loses_nothing(
    kafka: KafkaBroker, topics: Topics, tmp_path: Path
) -> None:
    # faust's stop waits until every event it handed out is acked, and the batch the
    # outage held up is left unacked on purpose: the worker never finished stopping
    lines = input_lines()[:400]
    expected, _ = replay(lines, tmp_path)
    await produce(kafka, topics.input, lines)
    store = f"sqlite:///{tmp_path / 'faust.db'}"
    group = f"g-{uuid.uuid4().hex[:6]}"
    worker = Worker(kafka, topics, store, group, tmp_path / "w1.log", batch_size="10")
    holder: sqlite3.Connection | None = None
    try:
        deadline = time.monotonic() + 60
        while "batch of" not in worker.log.read_text() and time.monotonic() < deadline:
            # once the worker's start has kept the rules' meanings (its only write before
            # the agent's first batch): a lock taken before made the start itself fail
            if holder is None and _meanings_kept(tmp_path / "faust.db"):
                holder = sqlite3.connect(tmp_path / "faust.db", isolation_level=None, timeout=30)
                holder.execute("BEGIN EXCLUSIVE")
            await asyncio.sleep(0.1)
        assert "batch of" in worker.log.read_text(), worker.log.read_text()[-3000:]
        os.killpg(worker.proc.pid, signal.SIGTERM)
        assert worker.proc.wait(30) == 0, worker.log.read_text()[-3000:]
    finally:
        worker.kill()
        if holder is not None:
            holder.execute("ROLLBACK")
            holder.close()
    again = Worker(kafka, topics, store, group, tmp_path / "w2.log")
    try:
        consumer = AIOKafkaConsumer(
            topics.output, bootstrap_servers=kafka.bootstrap_servers, auto_offset_reset="earliest"
        )
        await consumer.start()
        seen: set[bytes] = set()
        deadline = time.monotonic() + 120
        try:
            while len(seen) < len(set(expected)) and time.monotonic() < deadline:
                for records in (await consumer.getmany(timeout_ms=500)).values():
                    seen.update(r.value for r in records if r.value is not None)
        finally:
            await consumer.stop()
        # redelivered and deduplicated: every verdict, each as replay gives it
        assert seen == set(expected)
    finally:
        assert again.stop() == 0, (tmp_path / "w2.log").read_text()[-3000:]


async def test_events_of_an_aborted_upstream_transaction_are_not_decided(
    tmp_path: Path,
) -> None:
    """faust's consumer reads read_uncommitted unless faust itself is in a transaction:
    a payment whose upstream transaction aborted, a payment that never happened, was
    counted, and the real one after it rejected (``run`` reads read_committed). On noida,
    whose transactions abort as Kafka's do (tansu's aborted records reach every reader)."""
    payment = json.loads(
        next(line for line in input_lines() if b'"type"' not in line or b"payment" in line)
    )
    aborted = {**payment, "event_id": "never-happened", "amount": "2900.00", "currency": "CNY"}
    committed = {**aborted, "event_id": "happened"}
    lines = [json.dumps(committed).encode()]
    expected, _ = replay(lines, tmp_path)
    with kafka_broker("noida") as noida:
        names = await made_topics(noida)
        await in_transactions(
            noida, names.input, [([json.dumps(aborted).encode()], False), (lines, True)]
        )
        store = f"sqlite:///{tmp_path / 'faust.db'}"
        worker = Worker(noida, names, store, f"g-{uuid.uuid4().hex[:6]}", tmp_path / "w.log")
        try:
            out, letters = await read_until(noida, names, 1, 0, worker, 120)
        finally:
            assert worker.stop() == 0, (tmp_path / "w.log").read_text()[-3000:]
    assert [value for _, value, _ in out] == expected  # accepted, seq 1: nothing before it
    assert letters == []


async def test_a_batch_wait_of_0_decides_at_once_and_stops(
    kafka: KafkaBroker, topics: Topics, tmp_path: Path
) -> None:
    # faust reads a take's `within` of 0 as no bound: with fewer events than a batch
    # holds, nothing was decided, and SIGTERM waited for ever on the events held
    lines = input_lines()[:50]
    expected, expected_dead = replay(lines, tmp_path)
    await produce(kafka, topics.input, lines)
    store = f"sqlite:///{tmp_path / 'faust.db'}"
    worker = Worker(
        kafka, topics, store, f"g-{uuid.uuid4().hex[:6]}", tmp_path / "w.log", batch_wait_ms="0"
    )
    try:
        out, letters = await read_until(
            kafka, topics, len(expected), len(expected_dead), worker, 60
        )
    finally:
        assert worker.stop() == 0, (tmp_path / "w.log").read_text()[-3000:]
    assert sorted(value for _, value, _ in out) == sorted(expected)
    assert sorted(str(x["error"]) for x in letters) == sorted(
        str(x["error"]) for x in expected_dead
    )


async def test_input_written_in_transactions_from_offset_0_keeps_its_offsets_committed(
    tmp_path: Path,
) -> None:
    """faust notes a gap in a partition's offsets only after a truthy read offset: after
    an event at offset 0, the marker and aborted records a read_committed consumer
    skips were never noted, and the group's offset stayed at 1 for good (a restart then
    decided everything since again). On noida, whose transactions work. (faust moves a
    committed offset past about one such gap a commit, every second: a few events.)"""
    lines = input_lines()[:12]
    expected, expected_dead = replay(lines, tmp_path)
    with kafka_broker("noida") as noida:
        names = await made_topics(noida)
        await in_transactions(
            noida,
            names.input,
            [
                ([lines[0]], True),  # the event at offset 0, its marker at 1
                ([b'{"event_id": "never-happened"}'], False),  # offset 2 aborted, marker 3
                *(([line], True) for line in lines[1:]),  # a record, a marker, ...
            ],
        )
        group = f"g-{uuid.uuid4().hex[:6]}"
        store = f"sqlite:///{tmp_path / 'faust.db'}"
        worker = Worker(noida, names, store, group, tmp_path / "w.log")
        probe = AIOKafkaConsumer(bootstrap_servers=noida.bootstrap_servers, group_id=group)
        await probe.start()
        try:
            out, letters = await read_until(
                noida, names, len(expected), len(expected_dead), worker, 120
            )
            tp = TopicPartition(names.input, 0)
            last = (await probe.end_offsets([tp]))[tp] - 1  # the last transaction's marker
            deadline = time.monotonic() + 60
            committed = None
            while time.monotonic() < deadline:
                committed = await probe.committed(tp)
                if committed is not None and committed >= last:
                    break
                await asyncio.sleep(0.5)
            assert committed is not None and committed >= last, (committed, last)
        finally:
            await probe.stop()
            assert worker.stop() == 0, (tmp_path / "w.log").read_text()[-3000:]
    assert sorted(value for _, value, _ in out) == sorted(expected)
    assert sorted(str(x["error"]) for x in letters) == sorted(
        str(x["error"]) for x in expected_dead
    )


async def test_records_deleted_before_they_were_decided_are_said(tmp_path: Path) -> None:
    """A worker stopped for longer than the input's retention came back to a committed
    offset the brokers no longer held: aiokafka said so at INFO, which ``-l warn``
    hid, and reading went on from the earliest offset kept, records skipped without a
    word. On noida (tansu has no DeleteRecords)."""
    lines = input_lines()[13:33]  # generated events, all valid
    kept = [*lines[:10], *lines[15:]]
    expected, _ = replay(kept, tmp_path)
    with kafka_broker("noida") as noida:
        names = await made_topics(noida)
        group = f"g-{uuid.uuid4().hex[:6]}"
        store = f"sqlite:///{tmp_path / 'faust.db'}"
        await produce(noida, names.input, lines[:10])
        first = Worker(noida, names, store, group, tmp_path / "w1.log", log_level="warn")
        try:
            await read_until(noida, names, 10, 0, first, 120)
        finally:
            assert first.stop() == 0, (tmp_path / "w1.log").read_text()[-3000:]
        tp = TopicPartition(names.input, 0)
        admin = AIOKafkaAdminClient(bootstrap_servers=noida.bootstrap_servers)
        await admin.start()
        probe = AIOKafkaConsumer(bootstrap_servers=noida.bootstrap_servers, group_id=group)
        await probe.start()
        try:
            assert await probe.committed(tp) == 10
            await produce(noida, names.input, lines[10:])
            await admin.delete_records({tp: RecordsToDelete(15)})
        finally:
            await probe.stop()
            await admin.close()
        second = Worker(noida, names, store, group, tmp_path / "w2.log", log_level="warn")
        try:
            out, _ = await read_until(noida, names, len(expected), 0, second, 120)
        finally:
            assert second.stop() == 0, (tmp_path / "w2.log").read_text()[-3000:]
    assert sorted(value for _, value, _ in out) == sorted(expected)
    said = [
        line for line in (tmp_path / "w2.log").read_text().splitlines() if "out of range" in line
    ]
    # (once or twice: faust may fetch from its own note of offset 10 again, and
    # aiokafka then resets, and says so, again)
    assert said, (tmp_path / "w2.log").read_text()[-3000:]
    for line in said:
        assert "WARNING" in line
        assert f"input partition {names.input}:0: offset 10 is out of range" in line


async def test_a_stop_while_the_brokers_are_down_ends(tmp_path: Path) -> None:
    # faust's shutdown commits first, and aiokafka retried that commit until the brokers
    # came back; then the consumer thread died of the fetcher's CancelledError
    with kafka_broker("tansu") as broker:
        names = Topics()
        admin = AIOKafkaAdminClient(bootstrap_servers=broker.bootstrap_servers)
        await admin.start()
        try:
            await admin.create_topics(
                [NewTopic(name, 1, 1) for name in (names.input, names.output, names.dead)]
            )
        finally:
            await admin.close()
        await produce(broker, names.input, input_lines()[:400])
        store = f"sqlite:///{tmp_path / 'faust.db'}"
        worker = Worker(
            broker,
            names,
            store,
            f"g-{uuid.uuid4().hex[:6]}",
            tmp_path / "w.log",
            batch_size="10",
            request_timeout_ms="3000",
        )
        try:
            # started, its handlers in place: the store's file came ~0.1 s before faust's
            # SIGTERM handler, and a slow second after it could still be in the start
            wait_for_log(worker, "[^Worker]: Ready", 60)
            time.sleep(1)  # consuming
            broker.stop()
            await asyncio.sleep(2)
            os.killpg(worker.proc.pid, signal.SIGTERM)
            assert worker.proc.wait(30) == 0, worker.log.read_text()[-3000:]
        finally:
            worker.kill()


def wait_for_log(worker: Worker, text: str, timeout: float) -> None:
    """Until the worker's log holds ``text``; fails if the worker exits first."""
    deadline = time.monotonic() + timeout
    while text not in worker.log.read_text():
        if worker.proc.poll() is not None:
            pytest.fail(f"worker exited {worker.proc.returncode}:\n{worker.log.read_text()}")
        if time.monotonic() > deadline:
            pytest.fail(f"no {text!r} after {timeout}s:\n{worker.log.read_text()[-3000:]}")
        time.sleep(0.1)


async def test_a_worker_started_before_its_broker_waits_for_it_then_decides(
    tmp_path: Path,
) -> None:
    # faust's producer, started first, raised "Unable to bootstrap" and the worker exited
    # 1 at once: a worker started before its broker (compose, a restart loop) was gone
    with kafka_broker("tansu") as broker:
        broker.stop()  # its port stays reserved for the start below
        names = Topics()
        worker = Worker(
            broker,
            names,
            f"sqlite:///{tmp_path / 'faust.db'}",
            f"g-{uuid.uuid4().hex[:6]}",
            tmp_path / "w.log",
            retry_initial_ms="100",
            retry_max_ms="1000",
        )
        try:
            wait_for_log(worker, f"cannot reach Kafka at {broker.bootstrap_servers}", 30)
            await asyncio.sleep(3)
            assert worker.proc.poll() is None, worker.log.read_text()[-3000:]
            assert "waiting for it, next try in" in worker.log.read_text()

            broker.start()
            admin = AIOKafkaAdminClient(bootstrap_servers=broker.bootstrap_servers)
            await admin.start()
            try:
                # the worker declares it too once it is up: whichever comes first (the
                # other's answer is an error code in the response, not raised)
                await admin.create_topics([NewTopic(names.input, 1, 1)])
            finally:
                await admin.close()
            lines = generated_events(300, accounts=50)
            await produce(broker, names.input, list(lines))
            out, _ = await read_until(broker, names, len(lines), 0, worker, 60)
            assert f"Kafka at {broker.bootstrap_servers} answers" in worker.log.read_text()
        finally:
            assert worker.stop() == 0, worker.log.read_text()[-3000:]
    # one verdict per event (the partitions are the worker's or the test's: no order)
    assert sorted(headers["event_id"] for _, _, headers in out) == sorted(
        json.loads(line)["event_id"].encode() for line in lines
    )


def test_a_stop_during_the_start_exits_0(
    kafka: KafkaBroker, topics: Topics, tmp_path: Path
) -> None:
    """SIGTERM a few milliseconds into the start (found by a chaos soak): the stop stopped
    faust's producer before the app's task that declares the topics ran, and the worker
    exited 1 with NotReady('Producer service not yet started'), about one start in
    three, though it had consumed nothing."""
    store = f"sqlite:///{tmp_path / 'faust.db'}"
    for attempt, delay in enumerate([0.005, 0.01, 0.015] * 3):
        worker = Worker(kafka, topics, store, f"g-{attempt}", tmp_path / f"w{attempt}.log")
        try:
            while b"[^Worker]: Starting..." not in worker.log.read_bytes():
                assert worker.proc.poll() is None, worker.log.read_text()[-3000:]
                time.sleep(0.002)
            time.sleep(delay)
            os.killpg(worker.proc.pid, signal.SIGTERM)
            assert worker.proc.wait(30) == 0, worker.log.read_text()[-3000:]
        finally:
            worker.kill()
        assert "Traceback" not in worker.log.read_text()


def test_a_stop_while_the_consumer_thread_starts_exits_0(
    kafka: KafkaBroker, topics: Topics, tmp_path: Path
) -> None:
    """SIGTERM while faust's consumer thread is starting (found by a chaos soak, and once
    by CI in the test above): mode's stop of a thread service did nothing before the
    thread had started it, the thread then ran for ever, and the worker never exited.
    ``tests.slow_consumer_thread`` holds the thread 1 s before it starts its service."""
    worker = Worker(
        kafka,
        topics,
        f"sqlite:///{tmp_path / 'faust.db'}",
        f"g-{uuid.uuid4().hex[:6]}",
        tmp_path / "w.log",
        wrap=("tests.slow_consumer_thread",),
    )
    try:
        wait_for_log(worker, "consumer thread starting", 60)
        os.killpg(worker.proc.pid, signal.SIGTERM)
        assert worker.proc.wait(30) == 0, worker.log.read_text()[-3000:]
    finally:
        worker.kill()
    assert "Traceback" not in worker.log.read_text()


def test_a_stop_while_waiting_for_the_broker_exits_0_at_once(tmp_path: Path) -> None:
    # nothing listens on the port, and the next try is 20 s away
    nowhere = KafkaBroker("none")
    nowhere.bootstrap_servers = f"127.0.0.1:{free_port()}"
    worker = Worker(
        nowhere,
        Topics(),
        f"sqlite:///{tmp_path / 'faust.db'}",
        f"g-{uuid.uuid4().hex[:6]}",
        tmp_path / "w.log",
        retry_initial_ms="20000",
    )
    try:
        wait_for_log(worker, f"cannot reach Kafka at {nowhere.bootstrap_servers}", 30)
        started = time.monotonic()
        os.killpg(worker.proc.pid, signal.SIGTERM)
        assert worker.proc.wait(30) == 0, worker.log.read_text()[-3000:]
        assert time.monotonic() - started < 10
        assert "nothing was consumed" in worker.log.read_text()
    finally:
        worker.kill()


async def test_a_rule_whose_counters_would_change_meaning_stops_the_worker(
    kafka: KafkaBroker, topics: Topics, tmp_path: Path
) -> None:
    from schemas.rules import load_rules, parse_rules
    from stores.sqlite import SqliteStore

    path = tmp_path / "faust.db"
    kept = SqliteStore(str(path))  # as a worker on the rules before their edit left it
    await kept.init()
    await kept.keep_rules(parse_rules(RULES.read_text().replace("Asia/Shanghai", "Asia/Tokyo")))
    await kept.close()
    load_rules(str(RULES))  # the rules file itself is valid
    await produce(kafka, topics.input, input_lines()[:20])
    worker = Worker(
        kafka, topics, f"sqlite:///{path}", f"g-{uuid.uuid4().hex[:6]}", tmp_path / "w.log"
    )
    try:
        code = worker.proc.wait(120)
    finally:
        worker.kill()
    log = worker.log.read_text()
    assert code == 2, log[-3000:]
    first = log.splitlines()[0]  # one line, as `limitflow run` says it, and no traceback
    assert first.startswith("limitflow: rules: rule 'acct-day-cny': the store keeps its day")
    assert "counters for timezone Asia/Tokyo (now Asia/Shanghai)" in first
    assert "Traceback" not in log
    consumer = AIOKafkaConsumer(
        topics.output, bootstrap_servers=kafka.bootstrap_servers, auto_offset_reset="earliest"
    )
    await consumer.start()
    try:  # nothing was decided
        assert not any((await consumer.getmany(timeout_ms=2000)).values())
    finally:
        await consumer.stop()


async def test_a_session_timeout_the_brokers_refuse_stops_the_worker(tmp_path: Path) -> None:
    # noida refuses a session below its group.min.session.timeout.ms, as Apache Kafka
    # does: aiokafka logged one line and held the error for a getmany that faust never
    # makes; the worker stayed up for ever, in no group, deciding nothing
    with kafka_broker("noida") as noida:
        topics = await made_topics(noida)
        worker = Worker(
            noida,
            topics,
            f"sqlite:///{tmp_path / 'faust.db'}",
            f"g-{uuid.uuid4().hex[:6]}",
            tmp_path / "w.log",
            session_timeout_ms="1",
        )
        try:
            code = worker.proc.wait(60)
        finally:
            worker.kill()
    log = worker.log.read_text()
    assert code != 0, log[-3000:]
    assert "kafka failed for good: Kafka refused the group's session timeout" in log


async def test_topics_the_app_makes_take_a_larger_max_message_bytes(tmp_path: Path) -> None:
    # with LIMITFLOW_MAX_MESSAGE_BYTES=3000000 the app declared its topics with the
    # brokers' ~1 MB: a dead letter of ~1.8 MB (900 KB of quotes, JSON-escaped) was
    # refused, and the worker crashed on it at every start
    with kafka_broker("noida") as noida:
        topics = Topics()  # made by the app
        worker = Worker(
            noida,
            topics,
            f"sqlite:///{tmp_path / 'faust.db'}",
            f"g-{uuid.uuid4().hex[:6]}",
            tmp_path / "w.log",
            max_message_bytes="3000000",
            compression="none",
        )
        try:
            admin = AIOKafkaAdminClient(bootstrap_servers=noida.bootstrap_servers)
            await admin.start()
            try:
                deadline = time.monotonic() + 60
                while topics.dead not in await admin.list_topics():
                    assert time.monotonic() < deadline, worker.log.read_text()[-3000:]
                    await asyncio.sleep(0.5)
            finally:
                await admin.close()
            huge = b'"' * 900_000
            await produce(noida, topics.input, [huge])
            consumer = AIOKafkaConsumer(
                topics.dead,
                bootstrap_servers=noida.bootstrap_servers,
                auto_offset_reset="earliest",
                fetch_max_bytes=10_000_000,
            )
            await consumer.start()
            try:
                letters: list[bytes] = []
                deadline = time.monotonic() + 60
                while not letters:
                    assert worker.proc.poll() is None, worker.log.read_text()[-3000:]
                    assert time.monotonic() < deadline, worker.log.read_text()[-3000:]
                    for records in (await consumer.getmany(timeout_ms=500)).values():
                        letters += [r.value for r in records]
            finally:
                await consumer.stop()
            assert json.loads(letters[0])["raw"] == huge.decode()
            assert worker.stop() == 0
        finally:
            worker.kill()


async def test_a_session_timeout_over_90_s_is_taken(
    kafka: KafkaBroker, topics: Topics, tmp_path: Path
) -> None:
    # faust refuses a session longer than its request timeout (90 s): with
    # LIMITFLOW_SESSION_TIMEOUT_MS=100000 the consumer thread crashed at start (exit 1)
    worker = Worker(
        kafka,
        topics,
        f"sqlite:///{tmp_path / 'faust.db'}",
        f"g-{uuid.uuid4().hex[:6]}",
        tmp_path / "w.log",
        session_timeout_ms="100000",
    )
    try:
        deadline = time.monotonic() + 60
        while "Executing _on_partitions_assigned" not in worker.log.read_text():
            assert worker.proc.poll() is None, worker.log.read_text()[-3000:]
            assert time.monotonic() < deadline, worker.log.read_text()[-3000:]
            await asyncio.sleep(0.5)
        assert worker.stop() == 0, worker.log.read_text()[-3000:]
        assert "ImproperlyConfigured" not in worker.log.read_text()
    finally:
        worker.kill()


def _this_hosts_address() -> str | None:
    """An address of this host other than loopback (the one its default route leaves
    by), or None."""
    with closing(socket.socket(socket.AF_INET, socket.SOCK_DGRAM)) as probe:
        try:
            probe.connect(("192.0.2.1", 9))  # no packet is sent: a route is chosen
        except OSError:
            return None
        address = str(probe.getsockname()[0])
    return None if address.startswith("127.") or address == "0.0.0.0" else address


def _answers(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=2):
            return True
    except OSError:
        return False


def test_the_web_server_listens_on_this_host_alone(
    kafka: KafkaBroker, topics: Topics, tmp_path: Path
) -> None:
    # faust's own default web_bind, 0.0.0.0, showed the worker's stats pages to every
    # network the host is on, where `run`'s ops endpoint listens on 127.0.0.1
    outside = _this_hosts_address()
    if outside is None:
        pytest.skip("this host has no address but loopback")
    port = free_port()
    worker = Worker(
        kafka,
        topics,
        f"sqlite:///{tmp_path / 'faust.db'}",
        f"g-{uuid.uuid4().hex[:6]}",
        tmp_path / "w.log",
        web=True,
        web_port=str(port),
    )
    try:
        deadline = time.monotonic() + 60
        while not _answers("127.0.0.1", port):
            assert worker.proc.poll() is None, worker.log.read_text()[-3000:]
            assert time.monotonic() < deadline, worker.log.read_text()[-3000:]
            time.sleep(0.2)
        assert not _answers(outside, port), f"faust's web server answers on {outside}"
    finally:
        assert worker.stop() == 0, worker.log.read_text()[-3000:]
