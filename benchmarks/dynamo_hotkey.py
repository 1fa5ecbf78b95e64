"""Where one hot bucket bites: N writer processes on one merchant bucket vs one bucket each.

    AWS_ACCESS_KEY_ID=test AWS_SECRET_ACCESS_KEY=test AWS_DEFAULT_REGION=us-east-1 \\
      python benchmarks/dynamo_hotkey.py --endpoint-url http://127.0.0.1:8000

Each writer is an OS process with its own ``Engine`` and ``DynamoStore`` deciding micro-
batches of payments from distinct accounts under one rule (``merchant-day``). In ``hot``
mode every payment hits the same merchant bucket, so every commit of every writer
conditions on that one item and concurrent commits conflict; in ``spread`` mode each
writer has its own merchant. Afterwards the hot bucket must hold exactly every accepted
payment (no lost increment).
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import sys
import time
import uuid
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from handlers.decide import Decider
from handlers.state import Keys
from schemas.rules import RuleSet, parse_rules
from stores.dynamo import DynamoStore
from streams.engine import Engine
from streams.replay import replay

RULES = """
rules:
  - id: merchant-day
    scope: merchant_id
    window: day
    timezone: UTC
    currency: CNY
    max_count: 1000000000
"""


def _rules() -> RuleSet:
    return parse_rules(RULES)


def _lines(writer: int, count: int, merchant: str) -> bytes:
    return b"".join(
        json.dumps(
            {
                "event_id": f"{uuid.uuid4().hex}",
                "account_id": f"acct-{writer}-{n}",
                "merchant_id": merchant,
                "amount": "1.00",
                "currency": "CNY",
                "occurred_at": "2026-03-14T10:00:00Z",
            }
        ).encode()
        + b"\n"
        for n in range(count)
    )


async def _writer(
    endpoint_url: str, prefix: str, writer: int, count: int, batch: int, hot: bool, start: float
) -> dict[str, Any]:
    store = DynamoStore(prefix, endpoint_url=endpoint_url)
    data = _lines(writer, count, "m-hot" if hot else f"m-{writer}")
    try:
        await store.check()
        engine = Engine(Decider(_rules()), store, max_conflict_retries=1_000)
        await asyncio.sleep(max(0.0, start - time.time()))
        began = time.perf_counter()
        summary = await replay(
            engine, io.BytesIO(data), io.BytesIO(), io.BytesIO(), batch_size=batch
        )
        return {
            "seconds": time.perf_counter() - began,
            "accepted": summary.accepted,
            "commits": engine.stats.commits,
            "conflicts": engine.stats.conflicts,
        }
    finally:
        await store.close()


def _run_writer(*args: Any) -> dict[str, Any]:
    return asyncio.run(_writer(*args))


async def _setup(endpoint_url: str, prefix: str) -> None:
    store = DynamoStore(prefix, endpoint_url=endpoint_url)
    try:
        await store.init()
    finally:
        await store.close()


async def _hot_count(endpoint_url: str, prefix: str) -> int:
    store = DynamoStore(prefix, endpoint_url=endpoint_url)
    key = "merchant-day|2026-03-14|m-hot"
    try:
        return (await store.load(Keys(buckets={key}))).buckets[key].count
    finally:
        await store.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--endpoint-url", required=True)
    parser.add_argument("--writers", default="1,2,4,8", help="comma-separated process counts")
    parser.add_argument("--events", type=int, default=400, help="events per writer")
    parser.add_argument("--batch-size", type=int, default=20)
    args = parser.parse_args()
    print(f"{args.events} events per writer, batches of {args.batch_size}, DynamoDB Local")
    print(
        f"{'mode':7} {'writers':>7} {'events/s':>9} {'commits':>8} {'conflicts':>9} {'c/commit':>8}"
    )
    for writers in (int(w) for w in args.writers.split(",")):
        for hot in (True, False):
            prefix = f"hot{uuid.uuid4().hex[:8]}"
            asyncio.run(_setup(args.endpoint_url, prefix))
            start = time.time() + 3  # let every process import and connect first
            with ProcessPoolExecutor(writers) as pool:
                futures = [
                    pool.submit(
                        _run_writer,
                        args.endpoint_url,
                        prefix,
                        w,
                        args.events,
                        args.batch_size,
                        hot,
                        start,
                    )
                    for w in range(writers)
                ]
                results = [f.result() for f in futures]
            total = sum(r["accepted"] for r in results)
            wall = max(r["seconds"] for r in results)
            commits = sum(r["commits"] for r in results)
            conflicts = sum(r["conflicts"] for r in results)
            if hot:
                stored = asyncio.run(_hot_count(args.endpoint_url, prefix))
                assert stored == total == writers * args.events, (stored, total)
            print(
                f"{'hot' if hot else 'spread':7} {writers:7} {total / wall:9,.0f} {commits:8}"
                f" {conflicts:9} {conflicts / max(commits, 1):8.2f}"
            )


if __name__ == "__main__":
    main()
