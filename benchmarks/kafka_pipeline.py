"""End-to-end speed of a limitflow runtime behind a real Kafka-protocol broker.

For each runtime (``run``: ``limitflow run``; ``faust``: ``faust -A streams.faust_app
worker``; ``copy``: a consumer that forwards records without deciding, the ceiling any
runtime has here) and each guarantee, on a fresh sqlite store and fresh topics:

1. throughput: with the runtime joined and warm, produce N events as fast as the
   producer goes; events/s = N / (first event sent → last verdict received);
2. latency: produce events at a fixed offered load (default 2,000/s) and match each
   verdict to its event by the ``event_id`` header; report p50/p99 of
   (verdict's record timestamp - event sent) and of (verdict received - event sent).

Every process (broker, runtime, this producer and consumer) shares the machine, so the
figures are for the whole pipeline on one box, not for the runtime alone.

    .venv/bin/python benchmarks/kafka_pipeline.py --events 50000 --rate 2000
    .venv/bin/python benchmarks/kafka_pipeline.py --runtimes faust --guarantees at-least-once

``exactly-once`` runs on noida (tansu's transactions are not usable with aiokafka; see
issue 3); ``at-least-once`` on ``--broker`` (tansu by default). The faust app only
offers at-least-once. Needs the brokers of scripts/install-test-servers.sh.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer  # type: ignore[import-untyped]
from aiokafka.admin import AIOKafkaAdminClient, NewTopic  # type: ignore[import-untyped]

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.generate import events as generated_events  # noqa: E402
from tests.faust_worker import faust_worker  # noqa: E402
from tests.servers import KafkaBroker, kafka_broker  # noqa: E402

RULES = ROOT / "examples" / "rules.yaml"
BIN = Path(sys.executable).parent
RUNTIMES = ("run", "faust", "copy")
"""``copy`` (benchmarks/kafka_copy.py) forwards records without deciding: the ceiling."""
GUARANTEES = ("at-least-once", "exactly-once")


@dataclass
class Topics:
    input: str
    output: str
    dead: str

    @classmethod
    def fresh(cls) -> Topics:
        tag = uuid.uuid4().hex[:8]
        return cls(f"bench-events-{tag}", f"bench-verdicts-{tag}", f"bench-dead-{tag}")


@dataclass
class Result:
    runtime: str
    guarantee: str
    broker: str
    events: int = 0
    seconds: float = 0.0
    offered: int = 0
    latency_events: int = 0
    created_ms: list[float] = field(default_factory=list)
    received_ms: list[float] = field(default_factory=list)
    note: str = ""
    skipped: bool = False
    """Not measured by design (``note`` says why), as opposed to a run that failed."""

    @property
    def rate(self) -> float:
        return self.events / self.seconds if self.seconds else 0.0


def workload(count: int, prefix: str, seed: int) -> list[tuple[str, bytes, bytes]]:
    """``(event_id, key, value)`` of ``count`` generated events with unique ids."""
    out: list[tuple[str, bytes, bytes]] = []
    for line in generated_events(count, accounts=20_000, seed=seed):
        line = line.replace(b'"evt-', f'"{prefix}-evt-'.encode())
        doc = json.loads(line)
        out.append((doc["event_id"], doc["account_id"].encode(), line))
    return out


def runtime_command(
    runtime: str, guarantee: str, kafka: KafkaBroker, topics: Topics, store: str, group: str
) -> tuple[list[str], dict[str, str]]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if runtime == "run":
        argv = [
            str(BIN / "limitflow"),
            "run",
            *["--bootstrap-servers", kafka.bootstrap_servers],
            *["--input-topic", topics.input, "--output-topic", topics.output],
            *["--dead-letter-topic", topics.dead, "--group-id", group],
            *["--rules", str(RULES), "--store", store, "--guarantee", guarantee],
        ]
        env["LIMITFLOW_SESSION_TIMEOUT_MS"] = "6000"
        return argv, env
    if runtime == "copy":
        module = [sys.executable, "-m", "benchmarks.kafka_copy"]
        return [*module, kafka.bootstrap_servers, topics.input, topics.output, group], env
    return faust_worker(
        kafka.bootstrap_servers,
        (topics.input, topics.output, topics.dead),
        group,
        store,
        log_level="warn",
    )


@contextlib.contextmanager
def running(argv: list[str], env: dict[str, str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            argv, env=env, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)


class VerdictReader:
    """Reads the output and dead-letter topics in the background, noting arrival times."""

    def __init__(self, kafka: KafkaBroker, topics: Topics, read_committed: bool) -> None:
        self.consumer = AIOKafkaConsumer(
            topics.output,
            topics.dead,
            bootstrap_servers=kafka.bootstrap_servers,
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            isolation_level="read_committed" if read_committed else "read_uncommitted",
            fetch_max_wait_ms=5,
        )
        self.seen: dict[str, tuple[float, float]] = {}
        """event_id → (record timestamp, received), both in seconds since the epoch."""
        self.records = 0
        self.last_received = 0.0
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self.consumer.start()
        self._task = asyncio.create_task(self._read())

    async def _read(self) -> None:
        while True:
            batches = await self.consumer.getmany(timeout_ms=100)
            now = time.time()
            for records in batches.values():
                for record in records:
                    self.records += 1
                    self.last_received = now
                    headers = dict(record.headers)
                    event_id = headers.get("event_id")
                    if event_id is not None:
                        self.seen.setdefault(event_id.decode(), (record.timestamp / 1000, now))

    async def wait_for(
        self, records: int, seconds: float, procs: list[subprocess.Popen[bytes]]
    ) -> None:
        deadline = time.monotonic() + seconds
        while self.records < records:
            running_still(procs)
            if self._task is not None and self._task.done():
                self._task.result()
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.records}/{records} outputs after {seconds:.0f}s")
            await asyncio.sleep(0.02)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self.consumer.stop()


async def create_topics(kafka: KafkaBroker, topics: Topics, partitions: int) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka.bootstrap_servers)
    await admin.start()
    try:
        await admin.create_topics(
            [NewTopic(name, partitions, 1) for name in (topics.input, topics.output, topics.dead)]
        )
    finally:
        await admin.close()


def running_still(procs: list[subprocess.Popen[bytes]]) -> None:
    """Raise if a runtime process has exited."""
    for proc in procs:
        if proc.poll() is not None:
            raise RuntimeError(f"runtime exited with {proc.returncode}")


async def settled(
    logs: list[Path], partitions: int, seconds: float, procs: list[subprocess.Popen[bytes]]
) -> None:
    """Wait until the ``run`` workers writing ``logs`` hold every partition between them,
    each with its last rebalance done: a rebalance later would be timed."""
    deadline = time.monotonic() + seconds
    while True:
        held: list[list[str] | None] = []
        for log in logs:
            last: list[str] | None = None
            for line in log.read_text(errors="replace").splitlines():
                with contextlib.suppress(ValueError):
                    doc = json.loads(line)
                    if doc.get("msg") == "partitions assigned":
                        last = doc.get("partitions") or []
                    elif doc.get("msg") == "partitions revoked":
                        last = None
            held.append(last)
        if all(h for h in held) and sum(len(h or ()) for h in held) == partitions:
            return
        running_still(procs)
        if time.monotonic() > deadline:
            raise TimeoutError(f"partitions held by the workers: {held}")
        await asyncio.sleep(0.1)


def percentile(values: list[float], share: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


async def measure(
    runtime: str, guarantee: str, kafka: KafkaBroker, args: argparse.Namespace, workdir: Path
) -> Result:
    result = Result(runtime, guarantee, kafka.kind)
    topics = Topics.fresh()
    await create_topics(kafka, topics, args.partitions)
    store = f"sqlite:///{workdir / f'{runtime}-{guarantee}.db'}"
    argv, env = runtime_command(
        runtime, guarantee, kafka, topics, store, f"bench-{uuid.uuid4().hex[:6]}"
    )
    reader = VerdictReader(kafka, topics, read_committed=guarantee == "exactly-once")
    producer = AIOKafkaProducer(bootstrap_servers=kafka.bootstrap_servers, linger_ms=2)
    await producer.start()
    await reader.start()
    logs = [workdir / f"{runtime}-{guarantee}-{n}.log" for n in range(args.workers)]
    try:
        with contextlib.ExitStack() as stack:
            procs = [stack.enter_context(running(argv, env, log)) for log in logs]
            if runtime == "run" and args.workers > 1:
                await settled(logs, args.partitions, args.timeout, procs)
            # warm-up: the group is joined and the store opened before anything is timed
            warm = workload(200, "warm", seed=1)
            for _event_id, key, value in warm:
                await producer.send(topics.input, value, key=key, headers=[("event_id", b"")])
            await producer.flush()
            await reader.wait_for(len(warm), args.timeout, procs)
            done = reader.records

            events = workload(args.events, "tput", seed=2)
            started = time.time()
            for _event_id, key, value in events:
                await producer.send(topics.input, value, key=key)
            await producer.flush()
            await reader.wait_for(done + len(events), args.timeout, procs)
            result.events, result.seconds = len(events), reader.last_received - started
            done = reader.records

            paced = workload(args.latency_events, "lat", seed=3)
            sent: dict[str, float] = {}
            interval = 1 / args.rate
            begin = time.perf_counter()
            for index, (event_id, key, value) in enumerate(paced):
                delay = begin + index * interval - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                sent.setdefault(event_id, time.time())
                await producer.send(topics.input, value, key=key)
            await producer.flush()
            await reader.wait_for(done + len(paced), args.timeout, procs)
            result.offered, result.latency_events = args.rate, len(sent)
            for event_id, at in sent.items():
                got = reader.seen.get(event_id)
                if got is not None:
                    result.created_ms.append((got[0] - at) * 1000)
                    result.received_ms.append((got[1] - at) * 1000)
    except (RuntimeError, TimeoutError) as exc:
        result.note = f"{exc}; log {logs[0]}"
        if not args.keep:
            result.note += ":\n" + logs[0].read_text(errors="replace")[-2000:]
    finally:
        await reader.stop()
        await producer.stop()
    return result


def table(results: list[Result]) -> str:
    head = (
        f"{'runtime':<8} {'guarantee':<14} {'broker':<7} {'events':>7} {'events/s':>9} "
        f"{'offered/s':>9} {'p50 ms':>7} {'p99 ms':>7} {'p50 rcv':>8} {'p99 rcv':>8}"
    )
    lines = [head, "-" * len(head)]
    for r in results:
        if r.note:
            outcome = "skipped" if r.skipped else "failed"
            lines.append(f"{r.runtime:<8} {r.guarantee:<14} {r.broker:<7} {outcome}: {r.note}")
            continue
        lines.append(
            f"{r.runtime:<8} {r.guarantee:<14} {r.broker:<7} {r.events:>7} {r.rate:>9,.0f} "
            f"{r.offered:>9,} {percentile(r.created_ms, 0.5):>7.1f} "
            f"{percentile(r.created_ms, 0.99):>7.1f} {percentile(r.received_ms, 0.5):>8.1f} "
            f"{percentile(r.received_ms, 0.99):>8.1f}"
        )
    return "\n".join(lines)


async def main_async(args: argparse.Namespace) -> list[Result]:
    results: list[Result] = []
    with tempfile.TemporaryDirectory(prefix="limitflow-bench-") as tmp:
        workdir = Path(tmp)
        if args.keep:
            workdir = Path(tempfile.mkdtemp(prefix="limitflow-bench-logs-"))
        for guarantee in args.guarantees:
            kind = "noida" if guarantee == "exactly-once" else args.broker
            with kafka_broker(kind) as kafka:
                for runtime in args.runtimes:
                    if runtime != "run" and guarantee == "exactly-once":
                        results.append(
                            Result(
                                runtime, guarantee, kind, note="at-least-once only", skipped=True
                            )
                        )
                        continue
                    print(f"… {runtime} {guarantee} on {kind}", file=sys.stderr, flush=True)
                    results.append(await measure(runtime, guarantee, kafka, args, workdir))
        if args.keep:
            print(f"logs kept in {workdir}", file=sys.stderr)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=50_000, help="throughput phase")
    parser.add_argument("--rate", type=int, default=2_000, help="offered load, events/s")
    parser.add_argument("--latency-events", type=int, default=10_000, help="latency phase")
    parser.add_argument("--runtimes", type=lambda s: s.split(","), default=list(RUNTIMES))
    parser.add_argument("--guarantees", type=lambda s: s.split(","), default=list(GUARANTEES))
    parser.add_argument("--broker", default="tansu", help="for at-least-once: tansu|noida")
    parser.add_argument("--partitions", type=int, default=6)
    parser.add_argument(
        "--workers", type=int, default=1, help="processes of the runtime in one group (run only)"
    )
    parser.add_argument("--timeout", type=float, default=300, help="seconds per phase")
    parser.add_argument("--keep", action="store_true", help="keep runtime logs")
    args = parser.parse_args()
    for name in args.runtimes:
        if name not in RUNTIMES:
            parser.error(f"unknown runtime {name}: use {', '.join(RUNTIMES)}")
    if args.workers > 1 and args.runtimes != ["run"]:
        parser.error("--workers applies to --runtimes run alone")
    for name in args.guarantees:
        if name not in GUARANTEES:
            parser.error(f"unknown guarantee {name}: use {', '.join(GUARANTEES)}")
    results = asyncio.run(main_async(args))
    print(
        f"\nkafka_pipeline: {args.events:,} events for throughput, {args.latency_events:,} at "
        f"{args.rate:,}/s for latency, sqlite store, {args.partitions} partitions, "
        f"{args.workers} worker process(es); "
        f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} at the end"
    )
    print("p50/p99 ms: verdict record timestamp - event sent; rcv: verdict received - sent\n")
    print(table(results))


if __name__ == "__main__":
    main()
