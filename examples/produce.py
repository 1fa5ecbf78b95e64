"""Sample producer: sends examples/events.jsonl, then generated events, to the input topic.

Each event is keyed by its ``account_id`` (so an account's events stay in order on one
partition), at ``--rate`` events a second. Used by docker-compose.yml; also works
against any broker::

    python examples/produce.py --bootstrap-servers 127.0.0.1:9094 --generate 1000

TLS and SASL come from the variables ``limitflow run`` reads
(``LIMITFLOW_SECURITY_PROTOCOL``, ``LIMITFLOW_SSL_CAFILE``, ``LIMITFLOW_SASL_PASSWORD``, …).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaConnectionError

ROOT = Path(__file__).resolve().parent.parent
DEMO_BROKER = "127.0.0.1:9094"
"""Where the Docker Compose demo's broker listens for programs outside its containers."""
sys.path.insert(0, str(ROOT))


def account_key(line: bytes) -> bytes | None:
    """The ``account_id`` of an event line, or None when it has none (bad input)."""
    try:
        doc = json.loads(line)
    except ValueError:
        return None
    account = doc.get("account_id") if isinstance(doc, dict) else None
    try:
        return account.encode() if isinstance(account, str) else None
    except UnicodeEncodeError:  # "\ud800": half a surrogate pair, which limitflow refuses
        return None


def lines(path: Path, generate: int, seed: int) -> list[bytes]:
    """The file's lines as ``limitflow replay`` reads them (only blank ones are left
    out: a line of form feeds is bad input to dead-letter, not blank), then generated
    events."""
    from schemas.events import JSON_BLANK_BYTES

    data = path.read_bytes().removeprefix(b"\xef\xbb\xbf")  # a BOM, as replay drops it
    out = [raw for line in data.split(b"\n") if (raw := line.rstrip(b"\r")).strip(JSON_BLANK_BYTES)]
    if generate:
        from benchmarks.generate import events

        out += events(generate, seed=seed)
    return out


async def connect(servers: str, wait: float, security: dict[str, Any]) -> AIOKafkaProducer:
    """A started producer; retries while the broker is still coming up."""
    deadline = time.monotonic() + wait
    while True:
        producer = AIOKafkaProducer(bootstrap_servers=servers, linger_ms=5, **security)
        try:
            await producer.start()
            return producer
        except KafkaConnectionError:
            await producer.stop()
            if time.monotonic() > deadline:
                raise
            print(f"waiting for {servers}… (for {wait:.0f} s at most: --wait)", file=sys.stderr)
            await asyncio.sleep(2)


async def produce(args: argparse.Namespace) -> int:
    from limitflow.errors import ConfigError
    from limitflow.run_cli import env_client_security

    try:
        security = env_client_security(os.environ)
    except ConfigError as exc:
        print(f"produce.py: {exc}", file=sys.stderr)
        return 2
    records = lines(Path(args.file), args.generate, args.seed)
    try:
        producer = await connect(args.bootstrap_servers, args.wait, security)
    except KafkaConnectionError:
        demo = " (the Docker Compose demo's)" if args.bootstrap_servers == DEMO_BROKER else ""
        print(
            f"produce.py: cannot reach Kafka at {args.bootstrap_servers}{demo}:"
            " --bootstrap-servers HOST:PORT names another",
            file=sys.stderr,
        )
        return 1
    interval = 1 / args.rate if args.rate > 0 else 0.0
    start = time.perf_counter()
    try:
        for index, line in enumerate(records):
            delay = start + index * interval - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            await producer.send(args.topic, line, key=account_key(line))
            if (index + 1) % 1000 == 0:
                print(f"sent {index + 1} events", file=sys.stderr)
        await producer.flush()
    finally:
        await producer.stop()
    print(f"sent {len(records)} events to {args.topic}", file=sys.stderr)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--bootstrap-servers", default=DEMO_BROKER, help="default: the Docker Compose demo's broker"
    )
    parser.add_argument("--topic", default="limitflow.events")
    parser.add_argument("--file", default=str(ROOT / "examples" / "events.jsonl"))
    parser.add_argument("--generate", type=int, default=0, help="generated events after the file")
    parser.add_argument(
        "--seed",
        type=int,
        default=7,
        help="of the generated events (their ids are evt-0, evt-1, … whatever the seed:"
        " another seed on the same topic and store gives idempotency conflicts)",
    )
    parser.add_argument("--rate", type=float, default=100.0, help="events a second; 0: no limit")
    parser.add_argument("--wait", type=float, default=120.0, help="seconds to wait for the broker")
    return asyncio.run(produce(parser.parse_args()))


if __name__ == "__main__":
    sys.exit(main())
