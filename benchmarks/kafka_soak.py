"""Whether ``limitflow run``'s memory levels off on a long stream.

Starts a fresh tansu broker and one ``limitflow run`` worker on a fresh sqlite store,
then sends ``--waves`` waves of ``--events`` generated events each (new event ids every
wave, a day later each wave, so that new buckets keep being made as on a live stream).
After the worker has published a verdict or dead letter for every event of a wave, it
prints the worker's resident memory (VmRSS) and its peak so far (VmHWM), read from
``/proc``, and the wave's rate (first event sent to last verdict read).

    .venv/bin/python benchmarks/kafka_soak.py                      # 10 waves of 50,000
    .venv/bin/python benchmarks/kafka_soak.py --waves 20 --events 20000

Not a test; needs the brokers of scripts/install-test-servers.sh, and Linux for
``/proc``. The broker and every process share the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from datetime import date, timedelta
from pathlib import Path

from aiokafka import AIOKafkaConsumer  # type: ignore[import-untyped]

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.generate import events as generated_events  # noqa: E402
from benchmarks.kafka_backlog import create_topics, new_producer  # noqa: E402
from tests.servers import kafka_broker  # noqa: E402

TOPICS = ("soak-events", "soak-verdicts", "soak-dead")
FIRST_DAY = date(2026, 3, 1)


def wave(number: int, count: int) -> list[tuple[bytes, bytes]]:
    """(key, value) of a wave's events: ids of their own (``w<number>-evt-…``, reversals'
    originals too), starting ``number`` days after the first wave's."""
    start = (FIRST_DAY + timedelta(days=number)).isoformat()
    out = []
    for line in generated_events(count, seed=number, start=start):
        value = line.replace(b'"evt-', f'"w{number}-evt-'.encode())
        out.append((json.loads(value)["account_id"].encode(), value))
    return out


def memory_kib(pid: int) -> tuple[int, int]:
    """(VmRSS, VmHWM) of process ``pid``, in KiB."""
    kib = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            kib[name] = int(value.split()[0])
    return kib["VmRSS"], kib["VmHWM"]


async def soak(bootstrap: str, worker: subprocess.Popen[bytes], waves: int, count: int) -> None:
    await create_topics(bootstrap, TOPICS)
    producer = new_producer(bootstrap)
    reader = AIOKafkaConsumer(
        TOPICS[1], TOPICS[2], bootstrap_servers=bootstrap, auto_offset_reset="earliest"
    )
    await producer.start()
    await reader.start()
    print(f"{'wave':>4} {'events':>10} {'events/s':>9} {'RSS MiB':>8} {'peak MiB':>9}")
    try:
        for number in range(waves):
            records = wave(number, count)
            started = time.monotonic()
            sent = [await producer.send(TOPICS[0], v, key=k) for k, v in records]
            await asyncio.gather(*sent)
            seen = 0
            while seen < len(records):
                if worker.poll() is not None:
                    raise SystemExit(f"the worker exited with {worker.returncode}")
                batch = await reader.getmany(timeout_ms=500, max_records=5_000)
                seen += sum(len(got) for got in batch.values())
            rate = len(records) / (time.monotonic() - started)
            rss, peak = memory_kib(worker.pid)
            total = (number + 1) * count
            rss_mib, peak_mib = rss / 1024, peak / 1024
            print(f"{number + 1:>4} {total:>10,} {rate:>9,.0f} {rss_mib:>8.0f} {peak_mib:>9.0f}")
    finally:
        await reader.stop()
        await producer.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--waves", type=int, default=10)
    parser.add_argument("--events", type=int, default=50_000, help="events per wave")
    args = parser.parse_args()
    with kafka_broker("tansu") as kafka, tempfile.TemporaryDirectory() as tmp:
        argv = [
            *(sys.executable, "-m", "limitflow", "run"),
            *("--bootstrap-servers", kafka.bootstrap_servers, "--input-topic", TOPICS[0]),
            *("--output-topic", TOPICS[1], "--dead-letter-topic", TOPICS[2]),
            *("--group-id", "soak", "--rules", str(ROOT / "examples" / "rules.yaml")),
            *("--store", f"sqlite:///{Path(tmp) / 'state.db'}", "--log-level", "WARNING"),
        ]
        env = dict(os.environ, LIMITFLOW_SESSION_TIMEOUT_MS="6000")
        worker = subprocess.Popen(argv, cwd=ROOT, env=env, stderr=subprocess.DEVNULL)
        print(
            f"kafka_soak: {args.waves} waves of {args.events:,} events, one worker, sqlite"
            " store, 6 partitions, tansu, 2 CPUs shared with the broker"
        )
        try:
            asyncio.run(soak(kafka.bootstrap_servers, worker, args.waves, args.events))
            size = sum(f.stat().st_size for f in Path(tmp).iterdir())
            print(f"store files: {size / 2**20:,.0f} MiB")
        finally:
            worker.send_signal(signal.SIGINT)
            worker.wait(60)


if __name__ == "__main__":
    main()
