"""Events/s on DynamoDB: limitflow's batched engine vs a seed-style one-write-per-rule loop.

    AWS_ACCESS_KEY_ID=test AWS_SECRET_ACCESS_KEY=test AWS_DEFAULT_REGION=us-east-1 \\
      python benchmarks/dynamo_store.py --endpoint-url http://127.0.0.1:8000 --events 5000
    ... --rtt-ms 2      # the same through a proxy adding 2 ms per round trip, as a network does

Batched: ``streams.engine.Engine`` over ``DynamoStore`` (reads in BatchGetItem calls of 100
keys, commits in TransactWriteItems of <= 100 records, idempotency records and account
sequences included). Baseline, as in seed 000: for each event and each rule that keeps a
bucket, one conditional ``UpdateItem`` (``ADD`` count and amount if the limit still holds),
awaited one after the other. The baseline does *less* work (no idempotency record, no
verdict, no all-or-nothing: a payment rejected by its third rule keeps the first two
increments), so the ratio understates what batching buys for the same guarantees.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.generate import events as generate_events
from benchmarks.latency_proxy import delayed
from handlers.decide import Decider
from schemas.events import EventRejected, EventType, parse_event
from schemas.rules import load_rules
from stores.dynamo import DynamoStore
from streams.engine import Engine
from streams.replay import replay

RULES = Path(__file__).resolve().parent.parent / "examples" / "rules.yaml"


async def batched(endpoint_url: str, lines: list[bytes], batch_size: int) -> dict[str, Any]:
    store = DynamoStore(f"bench{uuid.uuid4().hex[:8]}", endpoint_url=endpoint_url)
    try:
        await store.init()
        engine = Engine(Decider(load_rules(str(RULES))), store)
        started = time.perf_counter()
        summary = await replay(
            engine,
            io.BytesIO(b"\n".join(lines) + b"\n"),
            io.BytesIO(),
            io.BytesIO(),
            batch_size=batch_size,
        )
        seconds = time.perf_counter() - started
        return {
            "seconds": seconds,
            "events_per_s": len(lines) / seconds,
            "accepted": summary.accepted,
            "round_trips": store.round_trips,
            "commits": engine.stats.commits,
            "conflicts": engine.stats.conflicts,
        }
    finally:
        await store.close()


async def baseline(endpoint_url: str, lines: list[bytes]) -> dict[str, Any]:
    """One conditional UpdateItem per event per bucket rule, sequentially."""
    from botocore.exceptions import ClientError  # type: ignore[import-untyped]

    decider = Decider(load_rules(str(RULES)))
    store = DynamoStore(f"seed{uuid.uuid4().hex[:8]}", endpoint_url=endpoint_url)
    try:
        await store.init()
        client = await store._dynamodb()  # the same client setup as the batched run
        calls = accepted = 0
        started = time.perf_counter()
        for raw in lines:
            try:
                event = parse_event(raw)
            except EventRejected:
                continue
            if event.type is not EventType.PAYMENT:
                continue  # the seed articles have no reversals
            ok = True
            for applied in decider.plan(event):
                rule = applied.rule
                amount = event.amount or 0
                if rule.max_amount is not None and amount > rule.max_amount:
                    ok = False
                    continue
                if applied.key is None:
                    continue
                checks, values = [], {":one": {"N": "1"}, ":amt": {"N": str(amount)}}
                if rule.max_count is not None:
                    checks.append("#c < :maxc")
                    values[":maxc"] = {"N": str(rule.max_count)}
                if rule.max_amount is not None:
                    checks.append("#m <= :room")
                    values[":room"] = {"N": str(rule.max_amount - amount)}
                condition = "attribute_not_exists(pk)"
                if checks:
                    condition += " OR (" + " AND ".join(checks) + ")"
                calls += 1
                try:
                    await client.update_item(
                        TableName=store.table,
                        Key={"pk": {"S": "b#" + applied.key}},
                        UpdateExpression="ADD #c :one, #m :amt",
                        ConditionExpression=condition,
                        ExpressionAttributeNames={"#c": "count", "#m": "amount"},
                        ExpressionAttributeValues=values,
                    )
                except ClientError as exc:
                    if exc.response["Error"]["Code"] != "ConditionalCheckFailedException":
                        raise
                    ok = False
            accepted += ok
        seconds = time.perf_counter() - started
        return {
            "seconds": seconds,
            "events_per_s": len(lines) / seconds,
            "accepted": accepted,
            "round_trips": calls,
        }
    finally:
        await store.close()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--endpoint-url", required=True, help="DynamoDB (Local) endpoint")
    parser.add_argument("--events", type=int, default=5_000)
    parser.add_argument("--accounts", type=int, default=2_000)
    parser.add_argument("--batch-size", type=int, default=2_000)
    parser.add_argument(
        "--rtt-ms", type=float, default=0.0, help="network delay added per round trip (a proxy)"
    )
    args = parser.parse_args()
    lines = generate_events(args.events, accounts=args.accounts)
    scheme, _, target = args.endpoint_url.partition("://")
    with delayed(target.rstrip("/"), args.rtt_ms) as address:
        endpoint = f"{scheme}://{address}"
        fast = await batched(endpoint, lines, args.batch_size)
        slow = await baseline(endpoint, lines)
    print(
        f"events: {len(lines)}  accounts: {args.accounts}  batch size: {args.batch_size}"
        f"  added round-trip time: {args.rtt_ms:g} ms"
    )
    for name, result in (("batched engine", fast), ("seed baseline", slow)):
        extra = ", ".join(
            f"{k} {v}" for k, v in result.items() if k not in ("seconds", "events_per_s")
        )
        rate, seconds = result["events_per_s"], result["seconds"]
        print(f"  {name:15} {rate:9,.0f} events/s  ({seconds:.2f}s; {extra})")
    print(f"  ratio           {fast['events_per_s'] / slow['events_per_s']:9.1f}x")


if __name__ == "__main__":
    asyncio.run(main())
