"""Chaos soak: ``limitflow run`` workers killed and rebalanced mid-stream, checked
against ``limitflow replay`` of the same events.

Starts a tansu broker, a 6-partition input topic and one ``limitflow run`` worker
(with ``--runtime faust``, faust workers of the faust app instead, started as the
integration tests start them)
(at-least-once; every worker shares one store: a sqlite file, or with --store a
DynamoDB Local or MongoDB store started for the soak), then produces the integration
suite's events (``make_events``: payments, reversals, resends, bad input and one
idempotency conflict, keyed by account_id) at a steady rate. Meanwhile it disrupts the
workers at seeded random moments, printing each disruption as it happens:

  kill9-A               kill -9 the primary worker A, restart it 0-1 s later
  kill9-A-restart-later the same, restart it 3-8 s later
  kill9-A-busy          kill -9 A 0-0.8 s after it logged an assignment, while it
                        drains the backlog built up meanwhile
  kill9-A-after-commit  kill -9 A 0-30 ms after the store's WAL grows (or after 10 s
                        without growth): a batch's state is durable, its verdicts and
                        offsets maybe not yet (sqlite only)
  start-B / term-B      start a second worker B / SIGTERM it (a rebalance each)
  kill9-B, kill9-both, term-A
  term-both             SIGTERM B, then A 50 ms later, restart A (only with
                        --term-both-weight: this is what provokes a stall, below)

Once every event is sent, it waits for their verdicts and dead letters and checks them
against ``limitflow replay`` of the same lines:

* every input record (topic:partition:offset) has the verdict or dead letter that replay
  gives its line (for dead letters: error, detail, raw, event_id and source);
* every copy of a verdict, for one source and for one event_id, is byte for byte the same;
* the set of distinct verdicts equals replay's;
* verdicts are keyed by account_id with the suite's headers, and each account's new
  verdicts come in seq order 1, 2, 3 ...;
* the store's counters (buckets, accounts, events with their verdicts) equal replay's;
* no worker exited without being told to, none exited non-zero after SIGTERM, and no
  worker log holds a traceback. A SIGTERM before a worker's first log line ends it with
  -15, as documented, and is accepted.

A stall is no new verdict for --stall-after seconds while some are missing. On tansu it
means the group does not form again: when a group's leader leaves while the group is
rebalancing, tansu drops it from the members but keeps it as leader (a broker defect,
see the README). The soak reports the stall as a liveness failure, stops the workers and
lets one worker of a new group finish from offset 0, so that the other checks still say
whether anything was lost or counted twice.

    .venv/bin/python -m benchmarks.chaos_soak --seed 3
    .venv/bin/python -m benchmarks.chaos_soak --seed 12 --term-both-weight 2
    .venv/bin/python -m benchmarks.chaos_soak --seed 5 --store dynamodb
    .venv/bin/python -m benchmarks.chaos_soak --seed 8 --guarantee exactly-once

A run takes 1-2 minutes, 4-5 with a stall. Worker logs, the store, replay's output and
chaos.log (the disruptions) go to --workdir, by default a new temporary directory that
is printed first. To see tansu's own view of the group, keep its log (its path is
printed too): LIMITFLOW_KEEP_SERVER_LOGS=1
RUST_LOG=warn,tansu_broker::coordinator=debug,tansu_broker::broker::group=debug.

Exits 0 when every check held and 1 when one failed, each failure printed. Not a test;
needs the brokers of scripts/install-test-servers.sh, and every process shares the box.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from aiokafka import (  # type: ignore[import-untyped]
    AIOKafkaConsumer,
    AIOKafkaProducer,
    TopicPartition,
)
from aiokafka.admin import AIOKafkaAdminClient  # type: ignore[import-untyped]

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.faust_worker import faust_worker  # noqa: E402
from tests.integration.test_kafka_run import (  # noqa: E402
    Setup,
    account_key,
    counters,
    evict_members,
    make_events,
    replay,
    store_counters,
)
from tests.servers import dynamodb_local, kafka_broker, mongo_server  # noqa: E402

RULES = str(ROOT / "examples" / "rules.yaml")
LIMITFLOW = [sys.executable, "-m", "limitflow"]
T0 = time.monotonic()


def say(*parts: Any) -> None:
    print(f"[{time.monotonic() - T0:7.2f}s]", *parts, flush=True)


@dataclass
class Worker:
    slot: str
    index: int
    proc: subprocess.Popen[bytes]
    log: Path
    batch_size: int
    started: float = field(default_factory=time.monotonic)
    log_mark: int = 0
    """Bytes of the log already looked at for an assignment (``assigned_since``)."""
    faust: bool = False
    """A faust worker (``--runtime faust``), not ``limitflow run``."""

    @property
    def name(self) -> str:
        return f"{'faust' if self.faust else 'run'}-{self.index}"


FAUST_READY: Final = b"[^Worker]: Starting..."
"""A faust worker's line once mode has put its SIGTERM handler in place."""


def assigned_since(w: Worker, mark: int) -> bool:
    """Whether ``w`` logged a non-empty "partitions assigned" past byte ``mark`` of its
    log; if so, the next look starts after it, so that each assignment counts once."""
    if w.faust:
        return _faust_assigned_since(w, mark)
    for line in w.log.read_bytes()[mark:].splitlines():
        if not line.startswith(b"{"):
            continue
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        if doc.get("msg") == "partitions assigned" and doc.get("partitions"):
            w.log_mark = w.log.stat().st_size
            return True
    return False


def _faust_assigned_since(w: Worker, mark: int) -> bool:
    """``assigned_since`` for a faust worker: aiokafka's "Setting newly assigned
    partitions", whose table (ended by "for group") names the input topic (an empty
    assignment shows ``set()``)."""
    text = w.log.read_bytes()[mark:]
    at = 0
    while (start := text.find(b"Setting newly assigned partitions", at)) >= 0:
        end = text.find(b"for group", start)
        if end < 0:
            return False  # not all written yet
        at = end
        table = text[start:end]
        if b"-events" in table and b"set()" not in table:
            w.log_mark = mark + end
            return True
    return False


async def until(ready: Callable[[], bool], seconds: float) -> bool:
    """Whether ``ready()`` came true within ``seconds`` (looked at every 50 ms)."""
    deadline = time.monotonic() + seconds
    while not ready():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.05)
    return True


def wal_mark(wal: Path) -> tuple[int, int]:
    try:
        st = wal.stat()
    except FileNotFoundError:
        return (0, 0)
    return (st.st_size, st.st_mtime_ns)


def kill_when_wal_grows(wal: Path, pid: int, delay: float, timeout: float) -> None:
    """SIGKILL ``pid`` ``delay`` s after the sqlite WAL ``wal`` grows (or after
    ``timeout`` s without growth). Meant for a thread: it polls every 2 ms so that the
    kill lands within the few milliseconds between a batch's commit and its publishing,
    and the producer goes on meanwhile."""
    before = wal_mark(wal)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and wal_mark(wal) == before:
        time.sleep(0.002)
    time.sleep(delay)
    os.kill(pid, signal.SIGKILL)


class Cluster:
    """The broker's topics, the workers running now and everything they did."""

    def __init__(
        self, args: argparse.Namespace, bootstrap: str, work: Path, rng: random.Random
    ) -> None:
        self.args = args
        self.bootstrap = bootstrap
        self.work = work
        self.rng = rng
        self.name = f"chaos{args.seed}"
        self.store_path = work / "store.db"
        self.store = f"sqlite:///{self.store_path}"
        """The store every worker shares (``--store``: a server's, set by ``soak``)."""
        self.workers: dict[str, Worker] = {}
        self.history: list[Worker] = []
        self.events_log: list[str] = []
        self.unexpected_exits: list[str] = []
        self.stalls: list[str] = []
        self.recovered = False
        self.group_suffix = ""
        """Appended to the group id after a stall: a new group reads from offset 0."""
        self.setup = Setup(bootstrap, work, self.name, partitions=6)
        """The integration suite's topics and their names, shared with its tests."""

    @property
    def topics(self) -> tuple[str, str, str]:
        return self.setup.topics

    @property
    def group(self) -> str:
        return f"{self.name}-group{self.group_suffix}"

    def topic_args(self) -> list[str]:
        return self.setup.topic_args()

    def create_topics(self) -> None:
        self.setup.create_topics()

    def note(self, what: str) -> None:
        self.events_log.append(f"{time.monotonic() - T0:7.2f}s {what}")
        say(what)

    def start(self, slot: str) -> Worker:
        assert slot not in self.workers
        index = len(self.history)
        batch = self.rng.choice(self.args.batch_sizes)
        if self.args.runtime == "faust":
            return self._start_faust(slot, index, batch)
        log = self.work / f"run-{index}-{slot}.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                [
                    *LIMITFLOW,
                    "run",
                    *self.topic_args(),
                    *["--rules", RULES, "--store", self.store],
                    *["--group-id", self.group],
                    *["--session-timeout-ms", str(self.args.session_timeout_ms)],
                    *["--retry-initial-ms", "100", "--retry-max-ms", "2000"],
                    *["--batch-size", str(batch), "--log-level", self.args.log_level],
                    *["--guarantee", self.args.guarantee],
                ],
                cwd=ROOT,
                stdout=out,
                stderr=out,
            )
        return self._started(Worker(slot, index, proc, log, batch))

    def _start_faust(self, slot: str, index: int, batch: int) -> Worker:
        """``faust -A streams.faust_app worker``, as the integration tests start it."""
        argv, env = faust_worker(
            self.bootstrap,
            self.topics,
            self.group,
            self.store,
            log_level=self.args.log_level.lower(),
            batch_size=str(batch),
            retry_initial_ms="100",
            retry_max_ms="2000",
            session_timeout_ms=str(self.args.session_timeout_ms),
            data_dir=str(self.work / f"datadir-{index}"),
        )
        log = self.work / f"faust-{index}-{slot}.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=out, stderr=out)
        return self._started(Worker(slot, index, proc, log, batch, faust=True))

    def _started(self, w: Worker) -> Worker:
        self.workers[w.slot] = w
        self.history.append(w)
        self.note(f"start worker {w.slot} ({w.name}, pid {w.proc.pid}, batch {w.batch_size})")
        return w

    def unexpected(self, msg: str) -> None:
        self.unexpected_exits.append(msg)
        self.note("UNEXPECTED " + msg)

    def check_exits(self) -> None:
        """A worker that ended without being told to is a finding."""
        for slot, w in list(self.workers.items()):
            rc = w.proc.poll()
            if rc is not None:
                self.unexpected(f"worker {slot} ({w.name}, pid {w.proc.pid}) exited: {rc}")
                del self.workers[slot]

    def ensure_a(self) -> None:
        """Start A again if it died by itself, so that the events still get decided."""
        self.check_exits()
        if "A" not in self.workers:
            self.start("A")

    def kill9(self, slot: str) -> None:
        w = self.workers.pop(slot)
        w.proc.send_signal(signal.SIGKILL)
        w.proc.wait()
        up = time.monotonic() - w.started
        self.note(f"kill -9 worker {slot} ({w.name}, pid {w.proc.pid}, up {up:.1f}s)")
        if self.exactly_once:
            # noida never expires a dead member (its defect; see the README): do what a
            # session timeout would, as the integration tests do. Run to the end here,
            # in a thread of its own, so that no restart joins before it is done
            evicting = threading.Thread(
                target=asyncio.run, args=(evict_members(self.bootstrap, self.group),)
            )
            evicting.start()
            evicting.join()

    @property
    def exactly_once(self) -> bool:
        return bool(self.args.guarantee == "exactly-once")

    async def term(self, slot: str, *, sent: bool = False) -> None:
        """SIGTERM ``slot``'s worker (``sent``: it was sent already) and wait for its exit."""
        w = self.workers.pop(slot)
        if not sent:
            # wait for its first line, up to 10 s: a SIGTERM before that is the documented
            # -15 exit, which would hide whether the worker itself stops cleanly (for a
            # faust worker, until mode's own handler is in place, up to 30 s)
            await until(lambda: w.proc.poll() is not None or self._handles_sigterm(w), 30)
            w.proc.send_signal(signal.SIGTERM)
            self.note(f"SIGTERM worker {slot} ({w.name}, pid {w.proc.pid})")
        sent_at = time.monotonic()
        await until(lambda: w.proc.poll() is not None, 60)
        rc = w.proc.poll()
        if rc is None:
            w.proc.kill()
            w.proc.wait()
            self.unexpected(f"worker {slot} ({w.name}) did not stop within 60s of SIGTERM")
        elif rc == -signal.SIGTERM and not self._handles_sigterm(w):
            self.note(f"worker {slot} ({w.name}) ended by SIGTERM before its handler")
        elif rc != 0:
            self.unexpected(f"worker {slot} ({w.name}) exited {rc} after SIGTERM")
        else:
            took = time.monotonic() - sent_at
            self.note(f"worker {slot} ({w.name}) stopped: exit 0 after {took:.1f}s")

    @staticmethod
    def _handles_sigterm(w: Worker) -> bool:
        """Whether ``w`` has its SIGTERM handler (``run``: once it logs its first line)."""
        if w.faust:
            return FAUST_READY in w.log.read_bytes()
        return bool(w.log.read_bytes().strip())

    def kill_all(self) -> None:
        for w in self.workers.values():
            if w.proc.poll() is None:
                w.proc.kill()
                w.proc.wait()
        self.workers.clear()


async def produce(c: Cluster, lines: list[bytes], rate: float, sources: list[str | None]) -> None:
    """Send ``lines`` at ``rate`` per second, noting each one's topic:partition:offset."""
    producer = AIOKafkaProducer(bootstrap_servers=c.bootstrap, acks="all", linger_ms=5)
    await producer.start()
    try:
        start = time.monotonic()
        pending: list[tuple[int, Any]] = []

        async def settle() -> None:
            for i, fut in pending:
                m = await fut
                sources[i] = f"{m.topic}:{m.partition}:{m.offset}"
            pending.clear()

        for n, raw in enumerate(lines):
            delay = start + n / rate - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            pending.append((n, await producer.send(c.topics[0], raw, key=account_key(raw))))
            if len(pending) >= 50:
                await settle()
        await settle()
        c.note(f"produced {len(lines)} events in {time.monotonic() - start:.1f}s")
    finally:
        await producer.stop()


def pick(c: Cluster) -> str:
    """The next disruption, drawn by weight from those that fit the workers running."""
    options: list[tuple[str, float]] = [
        ("kill9-A", 2.0),
        ("kill9-A-restart-later", 1.0),
        ("kill9-A-busy", 1.5),
    ]
    if c.store.startswith("sqlite:"):  # it watches the sqlite WAL
        options.append(("kill9-A-after-commit", 2.5))
    if c.exactly_once:  # one member: noida never assigns a second one anything
        options.append(("term-A", 1.0))
    elif "B" in c.workers:
        options += [("term-B", 3.0), ("kill9-B", 1.5), ("kill9-both", 1.0), ("term-A", 1.0)]
        if c.args.term_both_weight:
            options.append(("term-both", c.args.term_both_weight))
    else:
        options.append(("start-B", 4.0))
    kinds = [kind for kind, _ in options]
    return c.rng.choices(kinds, [weight for _, weight in options])[0]


async def disrupt(c: Cluster, action: str) -> None:
    rng = c.rng
    if action == "kill9-A":
        if "A" in c.workers:
            c.kill9("A")
        await asyncio.sleep(rng.uniform(0.0, 1.0))
        c.start("A")
    elif action == "kill9-A-restart-later":
        if "A" in c.workers:
            c.kill9("A")
        await asyncio.sleep(rng.uniform(3.0, 8.0))
        c.start("A")
    elif action == "kill9-A-busy":
        if "A" in c.workers:
            busy = c.workers["A"]
            await until(lambda: assigned_since(busy, busy.log_mark), 15)
            await asyncio.sleep(rng.uniform(0.0, 0.8))
            if "A" in c.workers:
                c.kill9("A")
        await asyncio.sleep(rng.uniform(0.0, 1.0))
        c.start("A")
    elif action == "kill9-A-after-commit":
        # the window at-least-once redelivers: state committed, verdicts and offsets not
        delay = rng.choice([0.0, 0.0, 0.003, 0.01, 0.03])
        w = c.workers.get("A")
        if w is not None:
            wal = Path(f"{c.store_path}-wal")
            await asyncio.to_thread(kill_when_wal_grows, wal, w.proc.pid, delay, 10.0)
            c.kill9("A")  # reaps it and notes the kill
        await asyncio.sleep(rng.uniform(0.0, 1.0))
        c.start("A")
    elif action == "start-B":
        c.start("B")
    elif action == "term-B":
        await c.term("B")
    elif action == "kill9-B":
        c.kill9("B")
        if rng.random() < 0.5:
            await asyncio.sleep(rng.uniform(0.0, 2.0))
            c.start("B")
    elif action == "kill9-both":
        if "A" in c.workers:
            c.kill9("A")
        c.kill9("B")
        await asyncio.sleep(rng.uniform(0.0, 1.0))
        c.start("A")
    elif action == "term-both":
        # the leader's LeaveGroup may then arrive while B's leave has the group
        # rebalancing, which is when tansu keeps a departed leader; both must have
        # joined first (generation >= 1) for that to be so
        b = c.workers["B"]
        await until(
            lambda: assigned_since(b, 0) and "A" in c.workers and assigned_since(c.workers["A"], 0),
            15,
        )
        b.proc.send_signal(signal.SIGTERM)
        c.note(f"SIGTERM worker B ({b.name}, pid {b.proc.pid}), then A 50 ms later")
        await asyncio.sleep(0.05)
        if "A" in c.workers:
            a = c.workers["A"]
            a.proc.send_signal(signal.SIGTERM)
            c.note(f"SIGTERM worker A ({a.name}, pid {a.proc.pid})")
            await c.term("A", sent=True)
        await c.term("B", sent=True)
        c.start("A")
    elif action == "term-A":
        if "A" in c.workers:
            await c.term("A")
        c.start("A")
    else:
        raise AssertionError(action)


async def chaos(c: Cluster, window: float, count: int) -> None:
    """``count`` disruptions at seeded random moments within ``window`` seconds."""
    moments = sorted(c.rng.uniform(1.0, window) for _ in range(count))
    c.note("disruptions at: " + ", ".join(f"{m:.1f}" for m in moments))
    begin = time.monotonic()
    for number, at in enumerate(moments, 1):
        while time.monotonic() - begin < at:
            c.ensure_a()
            await asyncio.sleep(0.05)
        c.check_exits()
        action = pick(c)
        c.note(f"disruption {number}/{count}: {action}")
        await disrupt(c, action)
    c.ensure_a()


@dataclass
class Seen:
    by_source: dict[str, list[bytes]] = field(default_factory=dict)
    """Each record's value by its ``source`` header, one entry per copy read."""
    records: list[Any] = field(default_factory=list)


async def read_all(
    c: Cluster, topic: str, want: set[str], seconds: float, *, watch: bool = False
) -> Seen:
    """Every record of ``topic`` from the start until each source of ``want`` has been
    seen and 3 s passed without a record (copies published late count too), or until
    ``seconds``. ``watch``: keep A running, and handle a stall (see the docstring)."""
    consumer = await _reader(c, topic)
    seen = Seen()
    try:
        deadline = time.monotonic() + seconds
        quiet = shown = progress = reread = time.monotonic()
        most = 0  # most sources of ``want`` seen by any reader: a stall is none more
        while time.monotonic() < deadline:
            now = time.monotonic()
            if c.exactly_once and watch and min(now - quiet, now - reread) > _REREAD_AFTER:
                # noida defect: a read_committed reader that fetched while a transaction
                # was open can skip that producer's later committed batches (seed 402 of
                # 2026-11-29 reported a stall so, every verdict published): a fresh
                # reader from the start reads them all
                await consumer.stop()
                consumer, seen, reread = await _reader(c, topic), Seen(), now
            batch = await consumer.getmany(timeout_ms=300)
            for recs in batch.values():
                for r in recs:
                    source = dict(r.headers)["source"].decode()
                    seen.by_source.setdefault(source, []).append(r.value)
                    seen.records.append(r)
            if batch:
                quiet = time.monotonic()
                got = len(want & set(seen.by_source))
                if got > most:
                    most, progress = got, quiet
            if watch:
                c.ensure_a()
            if want <= set(seen.by_source) and time.monotonic() - quiet > 3.0:
                break
            stalled = time.monotonic() - progress > c.args.stall_after
            if watch and c.args.stall_after and not c.recovered and stalled:
                await recover_from_stall(c, len(want - set(seen.by_source)))
                progress = time.monotonic()
            if time.monotonic() - shown > 10:
                shown = time.monotonic()
                got = len(want & set(seen.by_source))
                say(f"  {topic}: {got}/{len(want)} sources, {len(seen.records)} records")
    finally:
        await consumer.stop()
    return seen


_REREAD_AFTER: Final = 20.0
"""Seconds without a record after which a watching read_committed reader is replaced."""


async def _reader(c: Cluster, topic: str) -> AIOKafkaConsumer:
    """A new reader of every partition of ``topic``, from its first record."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=c.bootstrap,
        isolation_level="read_committed" if c.exactly_once else "read_uncommitted",
        enable_auto_commit=False,
        auto_offset_reset="earliest",
    )
    await consumer.start()
    parts: set[int] = set()
    for _ in range(100):
        if topic in await consumer.topics():
            parts = consumer.partitions_for_topic(topic) or set()
            if parts:
                break
        await asyncio.sleep(0.1)
    consumer.assign([TopicPartition(topic, p) for p in parts])
    await consumer.seek_to_beginning()
    return consumer


async def recover_from_stall(c: Cluster, missing: int) -> None:
    """Report the stall with its evidence, then stop the workers and start one in a new
    group: it reads from offset 0, so the checks can still tell whether anything was
    lost or counted twice."""
    c.stalls.append(f"no verdict for {c.args.stall_after:.0f}s with {missing} missing")
    c.note(f"STALL: no new verdict for {c.args.stall_after:.0f}s, {missing} missing")
    await describe_group(c)
    for slot, w in list(c.workers.items()):
        tail = w.log.read_text(errors="replace")[-600:].replace("\n", " | ")
        c.note(f"  {slot} ({w.name}) log tail: {tail}")
        await c.term(slot)
    c.recovered = True
    c.group_suffix = "-recovery"
    c.start("A")


async def describe_group(c: Cluster) -> None:
    """The group as the broker describes it: a stall's evidence."""
    admin = AIOKafkaAdminClient(bootstrap_servers=c.bootstrap)
    try:
        await admin.start()
        for resp in await admin.describe_consumer_groups([c.group]):
            for g in resp.groups:
                # (error_code, group_id, state, protocol_type, protocol, members)
                members = [(m[0], m[1], m[2]) for m in g[5]]
                c.note(
                    f"  group {g[1]}: error {g[0]}, state {g[2]!r}, protocol {g[4]!r},"
                    f" members {members}"
                )
        # committed offsets are not asked for: aiokafka's admin fails to decode tansu's
        # OffsetFetch answer ("unpack requires a buffer of 4 bytes")
        live = {slot: w.proc.pid for slot, w in c.workers.items()}
        c.note(f"  live workers: {live}")
    except Exception as exc:  # evidence only: the soak goes on without it
        c.note(f"  describe group failed: {exc!r}")
    finally:
        await admin.close()


def diff_counters(got: dict[str, Any], want: dict[str, Any], limit: int = 10) -> list[str]:
    out: list[str] = []
    for table in ("buckets", "accounts", "events"):
        g = {row[0]: row[1:] for row in got[table]}
        w = {row[0]: row[1:] for row in want[table]}
        for key in sorted(set(g) | set(w)):
            gv, wv = g.get(key), w.get(key)
            if gv != wv:
                if table == "events":  # (accepted, seq, verdict, reversed): verdict as text
                    gv = None if gv is None else (*gv[:2], gv[2].decode()[:400], *gv[3:])
                    wv = None if wv is None else (*wv[:2], wv[2].decode()[:400], *wv[3:])
                out.append(f"{table} {key}: run {gv} != replay {wv}")
    return out[:limit] + ([f"... {len(out) - limit} more"] if len(out) > limit else [])


def check_sources(
    sources: list[str], verdicts: Seen, dead: Seen, want_v: list[bytes | None], want_d: list[Any]
) -> list[str]:
    """Each input record's outputs against replay's for its line."""
    missing: list[str] = []
    wrong: list[str] = []
    multi: list[str] = []
    for n, (src, wv, wd) in enumerate(zip(sources, want_v, want_d, strict=True), 1):
        if wv is not None:
            got = set(verdicts.by_source.get(src, []))
            if not got:
                instead = " (dead letter instead)" if src in dead.by_source else ""
                event_id = json.loads(wv)["event_id"]
                missing.append(f"line {n} {src} ({event_id}): no verdict{instead}")
                continue
            if len(got) > 1:
                shown = " | ".join(g.decode()[:300] for g in sorted(got))
                multi.append(f"line {n} {src}: {len(got)} distinct verdicts: {shown}")
            if got != {wv}:
                shown = str([g.decode()[:400] for g in got])
                wrong.append(f"line {n} {src}: got {shown} want {wv.decode()[:400]}")
            continue
        letters = set(dead.by_source.get(src, []))
        if not letters:
            instead = " (verdict instead)" if src in verdicts.by_source else ""
            missing.append(f"line {n} {src}: no dead letter{instead}")
            continue
        topic, partition, offset = src.rsplit(":", 2)
        at = {"topic": topic, "partition": int(partition), "offset": int(offset)}
        for raw in letters:
            letter = json.loads(raw)
            if letter["source"] != at:
                wrong.append(f"dead letter {src}: source {letter['source']}")
            for name in ("error", "detail", "raw", "raw_base64", "event_id"):
                if letter.get(name) != wd.get(name):
                    ours, theirs = letter.get(name), wd.get(name)
                    wrong.append(f"dead letter {src}: {name} {ours!r} != {theirs!r}")
    failures = []
    for name, items in (("missing", missing), ("wrong", wrong), ("multiple distinct", multi)):
        if items:
            failures.append(f"{len(items)} {name}: " + "\n    ".join(items[:15]))
    return failures


def check_verdicts(verdicts: Seen, want_v: list[bytes | None], sources: list[str]) -> list[str]:
    """The verdicts as a whole: one per event_id, the same set as replay's, and each
    account's in seq order."""
    failures = []
    by_id: dict[str, set[bytes]] = defaultdict(set)
    for r in verdicts.records:
        by_id[json.loads(r.value)["event_id"]].add(r.value)
    split = {k: v for k, v in by_id.items() if len(v) > 1}
    if split:
        shown = []
        for k, vs in list(split.items())[:10]:
            docs = [json.loads(v) for v in vs]
            shown.append(
                f"{k}: " + " | ".join(f"{d['decision']}/{d['reason']}/seq {d['seq']}" for d in docs)
            )
        failures.append(
            f"{len(split)} event_ids with differing verdicts:\n    " + "\n    ".join(shown)
        )
    distinct_run = {r.value for r in verdicts.records}
    distinct_replay = {v for v in want_v if v is not None}
    if distinct_run != distinct_replay:
        extra = distinct_run - distinct_replay
        lack = distinct_replay - distinct_run
        failures.append(
            f"distinct verdicts differ from replay: {len(extra)} not in replay, {len(lack)}"
            f" missing; e.g. extra {[e.decode()[:300] for e in list(extra)[:3]]}"
        )
    # a verdict for a record never produced would have come from a wrong source header
    stray = set(verdicts.by_source) - set(sources)
    if stray:
        failures.append(f"{len(stray)} verdicts for sources never produced: {sorted(stray)[:5]}")
    # each account lives on one partition, so its first verdicts follow seq 1, 2, 3 ...
    # there; a copy published again later repeats a seq and is skipped
    seen_ids: set[str] = set()
    last_seq: dict[str, int] = {}
    bad = []
    for r in sorted(verdicts.records, key=lambda r: (r.partition, r.offset)):
        doc = json.loads(r.value)
        at = f"verdicts {r.partition}:{r.offset}"
        if r.key != doc["account_id"].encode():
            bad.append(f"key {r.key!r} at {at}")
        if dict(r.headers)["event_id"] != doc["event_id"].encode():
            bad.append(f"event_id header at {at}")
        if doc["event_id"] in seen_ids:
            continue
        seen_ids.add(doc["event_id"])
        last = last_seq.get(doc["account_id"], 0)
        if doc["seq"] != last + 1:
            bad.append(
                f"{doc['event_id']} {doc['account_id']} seq {doc['seq']} after {last} ({at})"
            )
        last_seq[doc["account_id"]] = doc["seq"]
    if bad:
        failures.append(f"{len(bad)} seq-order/key problems: " + "; ".join(bad[:10]))
    return failures


def check(
    c: Cluster,
    sources: list[str],
    verdicts: Seen,
    dead: Seen,
    want_v: list[bytes | None],
    want_d: list[Any],
    got_c: dict[str, Any],
    want_c: dict[str, Any],
) -> list[str]:
    failures = check_sources(sources, verdicts, dead, want_v, want_d)
    stray = set(dead.by_source) - set(sources)
    if stray:
        failures.append(
            f"{len(stray)} dead letters for sources never produced: {sorted(stray)[:5]}"
        )
    failures += check_verdicts(verdicts, want_v, sources)
    if c.exactly_once:
        twice = sorted(s for s, v in {**verdicts.by_source, **dead.by_source}.items() if len(v) > 1)
        if twice:
            failures.append(
                f"exactly-once: {len(twice)} sources read_committed more than once: {twice[:5]}"
            )
    if got_c != want_c:
        failures.append(
            "store counters differ from replay's:\n    "
            + "\n    ".join(diff_counters(got_c, want_c))
        )
    if c.stalls:
        failures.append(
            "liveness: " + "; ".join(c.stalls) + " (finished by a member of a new group;"
            " the checks above are after that)"
        )
    if c.unexpected_exits:
        failures.append("unexpected worker exits: " + "; ".join(c.unexpected_exits))
    tracebacks = [w.log.name for w in c.history if "Traceback" in w.log.read_text(errors="replace")]
    if tracebacks:
        failures.append(f"tracebacks in {tracebacks}")
    return failures


def copies(seen: Seen) -> dict[int, int]:
    """How many sources were read once, twice ...: at-least-once's redelivery, in short."""
    return dict(sorted(Counter(len(v) for v in seen.by_source.values()).items()))


def server_store(kind: str, servers: contextlib.ExitStack, name: str) -> str:
    """A new store of ``kind`` on a server started for the soak, initialised."""
    if kind == "dynamodb":
        for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
            os.environ.setdefault(var, "test")  # the workers inherit them
        ddb = servers.enter_context(dynamodb_local())
        url = f"dynamodb://{name}?endpoint_url={ddb.endpoint_url}&region=us-east-1"
    else:
        server, _, options = servers.enter_context(mongo_server()).uri.partition("/?")
        url = f"{server.rstrip('/')}/{name}{'?' + options if options else ''}"
    subprocess.run([*LIMITFLOW, "store", "init", "--store", url], cwd=ROOT, check=True)
    return url


async def soak(args: argparse.Namespace, work: Path) -> int:
    rng = random.Random(args.seed)
    lines = make_events(args.events, accounts=args.accounts, seed=args.seed)
    window = args.window if args.window is not None else len(lines) / args.rate + 10
    with contextlib.ExitStack() as servers:
        kind = "noida" if args.guarantee == "exactly-once" else "tansu"
        broker = servers.enter_context(kafka_broker(kind))
        say(f"broker {broker.bootstrap_servers}, log {broker.log_path}")
        c = Cluster(args, broker.bootstrap_servers, work, rng)
        if args.store != "sqlite":
            c.store = server_store(args.store, servers, f"chaos{args.seed}x{os.getpid()}")
            say(f"store {c.store}")
        c.create_topics()
        c.start("A")
        sources: list[str | None] = [None] * len(lines)
        try:
            await asyncio.sleep(2.0)
            await asyncio.gather(
                produce(c, lines, args.rate, sources), chaos(c, window, args.disruptions)
            )
            srcs = [s for s in sources if s is not None]
            assert len(srcs) == len(lines)
            (work / "sources.json").write_text(json.dumps(srcs))
            want_v, want_d, replay_store = replay(lines, c.work)
            n_v = {s for s, v in zip(srcs, want_v, strict=True) if v is not None}
            n_d = set(srcs) - n_v
            c.note(f"waiting for {len(n_v)} verdicts and {len(n_d)} dead letters")
            verdicts = await read_all(c, c.topics[1], n_v, args.drain_timeout, watch=True)
            dead = await read_all(c, c.topics[2], n_d, 30)
            for slot in list(c.workers):  # stopped before the store is read
                await c.term(slot)
            if c.exactly_once:
                # noida defect: a read_committed reader that fetched while a transaction
                # was open can skip that producer's later committed batches; a reader
                # started once every transaction is over reads them all
                verdicts = await read_all(c, c.topics[1], n_v, 30)
                dead = await read_all(c, c.topics[2], n_d, 30)
            want_c = counters(replay_store)
            if c.store.startswith("sqlite:"):
                got_c = counters(c.store)
            else:
                got_c = await store_counters(c.store, want_c)
            failures = check(c, srcs, verdicts, dead, want_v, want_d, got_c, want_c)
        finally:
            c.kill_all()
            (work / "chaos.log").write_text("\n".join(c.events_log) + "\n")
    say(f"copies per verdict source: {copies(verdicts)}; dead-letter copies: {copies(dead)}")
    say(
        f"{len(c.history)} worker processes; verdict records {len(verdicts.records)},"
        f" dead-letter records {len(dead.records)}"
    )
    if failures:
        say(f"SEED {args.seed}: FAILED (logs in {work})")
        for f in failures:
            print("  - " + f)
        return 1
    say(f"SEED {args.seed}: every check held")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--seed", type=int, default=1, help="seeds the events and the chaos")
    ap.add_argument("--events", type=int, default=4000)
    ap.add_argument("--accounts", type=int, default=60)
    ap.add_argument("--rate", type=float, default=200.0, help="events produced per second")
    ap.add_argument("--disruptions", type=int, default=15)
    ap.add_argument(
        "--window",
        type=float,
        default=None,
        help="seconds over which disruptions fall (default: production time + 10)",
    )
    ap.add_argument(
        "--batch-sizes",
        type=lambda s: [int(x) for x in s.split(",")],
        default=[20, 50, 200],
        help="each worker's --batch-size is drawn from these (comma-separated)",
    )
    ap.add_argument(
        "--store",
        choices=["sqlite", "dynamodb", "mongodb"],
        default="sqlite",
        help="what every worker shares: one sqlite file, or a DynamoDB Local or MongoDB"
        " (mongoeco: keep --rate and --events low) store started for the soak",
    )
    ap.add_argument(
        "--guarantee",
        choices=["at-least-once", "exactly-once"],
        default="at-least-once",
        help="the workers' --guarantee; exactly-once runs on noida (tansu has no"
        " transactions) with worker A alone, and every verdict and dead letter must be"
        " read_committed exactly once",
    )
    ap.add_argument(
        "--runtime",
        choices=["run", "faust"],
        default="run",
        help="the workers: `limitflow run`, or the faust app (`faust -A streams.faust_app"
        " worker`, at-least-once only)",
    )
    ap.add_argument("--session-timeout-ms", type=int, default=6000)
    ap.add_argument("--log-level", default="INFO", help="the workers' --log-level")
    ap.add_argument(
        "--term-both-weight",
        type=float,
        default=0.0,
        help="weight of the disruption that SIGTERMs B, then A 50 ms later (0: never)",
    )
    ap.add_argument(
        "--drain-timeout",
        type=float,
        default=240.0,
        help="seconds to wait for every verdict once every event is sent",
    )
    ap.add_argument(
        "--stall-after",
        type=float,
        default=60.0,
        help="no new verdict for this long while some are missing is a stall: report it"
        " and finish with a worker of a new group (0: never)",
    )
    ap.add_argument(
        "--workdir",
        type=Path,
        default=None,
        help="where the worker logs, the stores and chaos.log go (default: a new"
        " temporary directory)",
    )
    args = ap.parse_args()
    if args.runtime == "faust" and args.guarantee != "at-least-once":
        ap.error("--runtime faust: the faust app is at-least-once only")
    work = args.workdir or Path(tempfile.mkdtemp(prefix=f"chaos-soak-{args.seed}-"))
    work.mkdir(parents=True, exist_ok=True)
    say(f"seed {args.seed}; workdir {work}; args {vars(args)}")
    return asyncio.run(soak(args, work))


if __name__ == "__main__":
    sys.exit(main())
