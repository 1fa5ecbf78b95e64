"""How fast ``limitflow run`` drains a backlog, and where its time goes.

Produces N generated events to a fresh tansu broker first (6 partitions, keyed by
account), then starts ``--workers`` ``limitflow run`` processes in one group on a fresh
sqlite store and times first verdict out to last verdict out. With ``--profile FILE``
the (single) worker runs under py-spy, which writes its raw samples there, and the
share of the busiest functions is printed.

    .venv/bin/python benchmarks/kafka_backlog.py --events 100000
    .venv/bin/python benchmarks/kafka_backlog.py --events 100000 --workers 2
    .venv/bin/python benchmarks/kafka_backlog.py --events 100000 --profile /tmp/run.txt

Not a test; needs the brokers of scripts/install-test-servers.sh (and py-spy from PyPI
for ``--profile``). The broker and every process share the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer  # type: ignore[import-untyped]
from aiokafka.admin import AIOKafkaAdminClient, NewTopic  # type: ignore[import-untyped]

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.generate import events as generated_events  # noqa: E402
from tests.servers import kafka_broker  # noqa: E402

TOPICS = ("backlog-events", "backlog-verdicts", "backlog-dead")


async def create_topics(bootstrap: str, names: tuple[str, ...]) -> None:
    """Topics of 6 partitions, one replica."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(name, 6, 1) for name in names])
    finally:
        await admin.close()


def new_producer(bootstrap: str) -> Any:
    """A producer that fills large batches, to load a backlog fast (not started)."""
    return AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5, max_batch_size=256 * 1024)


async def produce(bootstrap: str, lines: list[bytes]) -> None:
    await create_topics(bootstrap, TOPICS)
    producer = new_producer(bootstrap)
    await producer.start()
    try:
        sent = [
            await producer.send(TOPICS[0], line, key=json.loads(line)["account_id"].encode())
            for line in lines
        ]
        await asyncio.gather(*sent)
    finally:
        await producer.stop()


async def drain(bootstrap: str, expected: int) -> tuple[float, float]:
    """(first, last) monotonic times a verdict or dead letter was read."""
    consumer = AIOKafkaConsumer(
        TOPICS[1], TOPICS[2], bootstrap_servers=bootstrap, auto_offset_reset="earliest"
    )
    await consumer.start()
    seen, first = 0, 0.0
    try:
        while seen < expected:
            batch = await consumer.getmany(timeout_ms=500, max_records=5_000)
            for records in batch.values():
                if records and not first:
                    first = time.monotonic()
                seen += len(records)
    finally:
        await consumer.stop()
    return first, time.monotonic()


STAGES = {
    "parse events": "parse_event",
    "plan and decide, compiled (with the engine's own code)": (
        "leaf:Engine.process|Engine._decide_and_commit"
    ),
    "plan, Python path (rules, bucket keys)": "Decider.plan",
    "decide, Python path": "Decider.decide",
    "store: read": "Store.load",
    "store: commit": "Store.commit",
    "  of which compressing stored verdicts": "VerdictCodec.pack",
    "publish verdicts": "send_all",
    "poll records": "AIOKafkaConsumer.getmany",
}
"""Where ``limitflow run``'s time goes: a label, and the function whose samples count
(its callees' too), or after ``leaf:`` the functions whose own samples count: the
compiled plan and decide have no Python frame, so py-spy finds their time in the
engine's frames that call them."""


def shares(profile: Path) -> list[tuple[float, str]]:
    """Each stage's share of the samples."""
    counts: collections.Counter[str] = collections.Counter()
    total = 0
    for line in profile.read_text().splitlines():
        stack, _, number = line.rpartition(" ")
        if not stack:
            continue
        total += int(number)
        frames = [frame.split(" (")[0] for frame in stack.split(";")]
        for name in set(frames):
            counts[name] += int(number)
        counts["leaf:" + frames[-1]] += int(number)

    def count(function: str) -> int:
        if function.startswith("leaf:"):
            return sum(counts["leaf:" + name] for name in function[5:].split("|"))
        return counts[function]

    return [(count(function) / total, label) for label, function in STAGES.items()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--profile", type=Path, help="py-spy raw output file (one worker)")
    args = parser.parse_args()
    if args.profile and args.workers != 1:
        parser.error("--profile profiles one worker")
    lines = generated_events(args.events)
    with kafka_broker("tansu") as kafka, tempfile.TemporaryDirectory() as tmp:
        asyncio.run(produce(kafka.bootstrap_servers, lines))
        argv = [
            *(sys.executable, "-m", "limitflow", "run"),
            *("--bootstrap-servers", kafka.bootstrap_servers, "--input-topic", TOPICS[0]),
            *("--output-topic", TOPICS[1], "--dead-letter-topic", TOPICS[2]),
            *("--group-id", "backlog", "--rules", str(ROOT / "examples" / "rules.yaml")),
            *("--store", f"sqlite:///{Path(tmp) / 'state.db'}", "--log-level", "WARNING"),
        ]
        if args.profile:
            spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
            argv = [spy, "record", "-o", str(args.profile), "-f", "raw", "-r", "200", "--", *argv]
        env = dict(os.environ, LIMITFLOW_SESSION_TIMEOUT_MS="6000")
        workers = [
            subprocess.Popen(argv, cwd=ROOT, env=env, stderr=subprocess.DEVNULL)
            for _ in range(args.workers)
        ]
        try:
            first, last = asyncio.run(drain(kafka.bootstrap_servers, len(lines)))
        finally:
            for worker in workers:
                worker.send_signal(signal.SIGINT)
            for worker in workers:
                worker.wait(60)
    print(
        f"kafka_backlog: {len(lines):,} events, {args.workers} worker(s), sqlite store,"
        f" 6 partitions, 2 CPUs shared with the broker"
    )
    print(f"first verdict to last: {len(lines) / (last - first):,.0f} events/s")
    if args.profile:
        for share, name in shares(args.profile):
            print(f"{share:6.1%}  {name}")
        print("(the rest: the Kafka clients' own tasks, the event loop, start and stop)")


if __name__ == "__main__":
    main()
