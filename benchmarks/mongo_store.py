"""Events per second: batched MongoStore vs a seed-004-style counter per round trip.

    python benchmarks/mongo_store.py --url mongodb://127.0.0.1:PORT/ [--events 3000] [--rtt-ms 2]

Both run on the same server, each in a fresh database, over the same generated events
(examples/rules.yaml):

* ``MongoStore``: ``streams.engine.Engine`` as ``limitflow replay`` runs it: per batch
  one ``find`` per collection, then one transaction (a ``bulk_write`` per collection and
  a commit) that stores every bucket, account sequence and idempotency record.
* baseline: what seed 004 does, one ``find_one_and_update`` (``$inc`` with an upsert,
  filtered on the limits) per event per period counter. It is faster per call but
  not correct: no idempotency, no all-or-nothing across rules, and a filter that fails
  on an existing counter turns the upsert into a duplicate-key error. It is here only
  to show what batching costs or saves in round trips.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from pymongo import AsyncMongoClient
from pymongo.errors import DuplicateKeyError

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script

from benchmarks.generate import events
from benchmarks.latency_proxy import delayed
from handlers.decide import Decider
from schemas.events import EventRejected, parse_event
from schemas.rules import load_rules
from stores.mongo import MongoStore
from streams.engine import Engine, Record

RULES = Path(__file__).resolve().parent.parent / "examples" / "rules.yaml"


def database_url(server: str, database: str) -> str:
    base, _, query = server.partition("?")
    base = base.split("://", 1)[0] + "://" + base.split("://", 1)[1].split("/", 1)[0]
    return f"{base}/{database}" + (f"?{query}" if query else "")


async def run_store(server: str, lines: list[bytes], batch: int) -> tuple[float, int, int]:
    """Seconds, round trips and conflicts of Engine + MongoStore over ``lines``."""
    database = f"bench_{uuid.uuid4().hex[:8]}"
    store = MongoStore.from_url(database_url(server, database))
    try:
        await store.init()
        engine = Engine(Decider(load_rules(str(RULES))), store)
        records = [Record(raw, {"line": n}) for n, raw in enumerate(lines, 1)]
        started = time.perf_counter()
        for start in range(0, len(records), batch):
            await engine.process(records[start : start + batch])
        seconds = time.perf_counter() - started
        await store.client.drop_database(database)
        return seconds, store.round_trips, engine.stats.conflicts
    finally:
        await store.close()


async def run_baseline(server: str, lines: list[bytes]) -> tuple[float, int]:
    """Seconds and round trips of one conditional upsert per event per counter."""
    database = f"bench_seed_{uuid.uuid4().hex[:8]}"
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(database_url(server, database))
    decider = Decider(load_rules(str(RULES)))
    counters = client[database]["counters"]
    trips = 0
    try:
        started = time.perf_counter()
        for raw in lines:
            try:
                event = parse_event(raw)
            except EventRejected:
                continue
            amount = event.amount or 0
            for applied in decider.plan(event):
                rule = applied.rule
                if applied.key is None:  # a per-transaction limit needs no counter
                    continue
                limits: dict[str, Any] = {"_id": applied.key}
                if rule.max_count is not None:
                    limits["count"] = {"$lt": rule.max_count}
                if rule.max_amount is not None:
                    limits["amount"] = {"$lte": rule.max_amount - amount}
                trips += 1
                try:
                    await counters.find_one_and_update(
                        limits, {"$inc": {"count": 1, "amount": amount}}, upsert=True
                    )
                except DuplicateKeyError:
                    break  # over the limit (seed 004 leaves earlier counters incremented)
        seconds = time.perf_counter() - started
        await client.drop_database(database)
        return seconds, trips
    finally:
        await client.close()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True, help="mongodb://HOST:PORT/ of the server")
    parser.add_argument("--events", type=int, default=3_000)
    parser.add_argument("--batch", type=int, default=500, help="events per Engine batch")
    parser.add_argument(
        "--rtt-ms", type=float, default=0.0, help="network delay added per round trip (a proxy)"
    )
    args = parser.parse_args()
    lines = events(args.events, accounts=300, merchants=50)
    parts = urlsplit(args.url)
    with delayed(parts.netloc, args.rtt_ms) as address:
        # a direct connection, so that the driver keeps to the proxy's address
        url = urlunsplit(parts._replace(netloc=address))
        if args.rtt_ms > 0 and "directConnection" not in url:
            url += ("&" if parts.query else "?") + "directConnection=true"
        store_s, store_trips, conflicts = await run_store(url, lines, args.batch)
        seed_s, seed_trips = await run_baseline(url, lines)
    store_rate, seed_rate = len(lines) / store_s, len(lines) / seed_s
    print(
        f"events: {len(lines)}, batch {args.batch}, rules {RULES.name},"
        f" added round-trip time {args.rtt_ms:g} ms"
    )
    print(
        f"MongoStore (Engine, batched): {store_rate:10,.0f} events/s  "
        f"{store_trips:6d} round trips  {conflicts} conflicts"
    )
    print(f"seed-004 baseline (per rule): {seed_rate:10,.0f} events/s  {seed_trips:6d} round trips")
    print(f"ratio MongoStore / baseline: {store_rate / seed_rate:.2f}x")


if __name__ == "__main__":
    asyncio.run(main())
