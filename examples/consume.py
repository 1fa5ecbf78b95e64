"""Sample reader: prints the value of every record of a topic, from the beginning, a line each.

Reads without a consumer group (every partition, from its first offset, no offsets
committed), so it can be run again and again, e.g. on the verdicts and the dead letters
of ``limitflow run``::

    python examples/consume.py --bootstrap-servers 127.0.0.1:9094 --topic limitflow.verdicts

It stops after ``--max-records`` records, or once no record has come for ``--timeout``
seconds. A record without a value (a tombstone) prints as an empty line. TLS and SASL
come from the variables ``limitflow run`` reads (``LIMITFLOW_SECURITY_PROTOCOL``,
``LIMITFLOW_SSL_CAFILE``, ``LIMITFLOW_SASL_PASSWORD``, …).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path

from aiokafka import AIOKafkaConsumer  # type: ignore[import-untyped]
from aiokafka.errors import KafkaConnectionError  # type: ignore[import-untyped]

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from limitflow.errors import ConfigError
from limitflow.run_cli import env_client_security


async def consume(args: argparse.Namespace) -> int:
    try:
        security = env_client_security(os.environ)
    except ConfigError as exc:
        print(f"consume.py: {exc}", file=sys.stderr)
        return 2
    consumer = AIOKafkaConsumer(
        args.topic,
        bootstrap_servers=args.bootstrap_servers,
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        isolation_level=args.isolation_level,
        **security,
    )
    try:
        await consumer.start()
    except KafkaConnectionError:
        await consumer.stop()
        print(f"cannot reach Kafka at {args.bootstrap_servers}", file=sys.stderr)
        return 1
    out = sys.stdout.buffer
    count = 0
    last = time.monotonic()
    try:
        while args.max_records is None or count < args.max_records:
            batches = await consumer.getmany(timeout_ms=200)
            records = [record for batch in batches.values() for record in batch]
            if args.max_records is not None:
                records = records[: args.max_records - count]
            if records:
                out.writelines((record.value or b"") + b"\n" for record in records)
                out.flush()
                count += len(records)
                last = time.monotonic()
            elif args.timeout > 0 and time.monotonic() - last >= args.timeout:
                break
    finally:
        await consumer.stop()
    print(f"read {count} records from {args.topic}", file=sys.stderr)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--bootstrap-servers", default="127.0.0.1:9094")
    parser.add_argument("--topic", required=True)
    parser.add_argument(
        "--isolation-level",
        choices=["read_committed", "read_uncommitted"],
        default="read_committed",
        help="read_committed (default): skip records of open or aborted transactions",
    )
    parser.add_argument("--max-records", type=int, help="stop after this many records")
    parser.add_argument(
        "--timeout",
        type=float,
        default=10.0,
        help="stop once no record has come for this many seconds (default 10; 0: never)",
    )
    try:
        return asyncio.run(consume(parser.parse_args()))
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
