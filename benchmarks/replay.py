"""Throughput and memory of the decision core and of ``limitflow replay``.

    python -m benchmarks.replay                 # 200,000 events, then a 1,000,000-event memory run
    python -m benchmarks.replay --events 50000 --memory-events 0

Prints decisions/s of the core alone (parsed events, plan + decide, no store; on the
compiled payment path, the best of ``--repeat`` runs and their median, then on the Python
path alone, as without a C compiler; all on one working state for every event, as this
benchmark always measured it), then the core decided batch by batch as the runtimes
decide it (a new working state per batch of 2,000, read from a memory store whose reads
and commits are not timed): plan + decide, and the whole core (with ``keys``,
``reversal_keys`` and ``take_writes``, what the store is handed), events/s
of ``limitflow replay`` with ``memory://`` and ``sqlite://`` (whole command, as a user
runs it: process start, parsing, store, writing both outputs; the best of ``--repeat``
runs, each into a new store, and their median: other load on a shared machine only ever
slows a run down) and the peak RSS of a replay of ``--memory-events`` events. Not a
test: figures vary with the machine's load.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.generate import events
from handlers.decide import Decider
from handlers.state import Snapshot, WorkingState
from schemas.events import Event, EventRejected, parse_event
from schemas.rules import load_rules
from stores.memory import MemoryStore
from streams.engine import fewer_collections

ROOT = Path(__file__).resolve().parents[1]
RULES = ROOT / "examples" / "rules.yaml"


def parsed_events(lines: list[bytes]) -> list[Event]:
    """The events of ``lines`` (the generator makes valid ones; any other is left out)."""
    parsed = []
    for line in lines:
        with contextlib.suppress(EventRejected):
            parsed.append(parse_event(line))
    return parsed


def core(lines: list[bytes], *, compiled: bool = True) -> tuple[float, float]:
    """(decisions/s of plan+decide, events/s of parse alone) on one core; ``compiled``:
    on the compiled payment path, else on the Python path alone. Deciding runs with the
    cyclic garbage collector set as every runtime of limitflow sets it."""
    started = time.perf_counter()
    parsed = parsed_events(lines)
    parse_rate = len(lines) / (time.perf_counter() - started)
    decider = Decider(load_rules(str(RULES)), compiled=compiled)
    state = WorkingState(Snapshot())
    with fewer_collections():  # as replay, run and the faust app decide
        started = time.perf_counter()
        for event in parsed:
            decider.decide(event, decider.plan(event), state)
        elapsed = time.perf_counter() - started
    return len(parsed) / elapsed, parse_rate


def core_batched(lines: list[bytes], batch: int = 2_000) -> tuple[float, float]:
    """(decisions/s of plan + decide, decisions/s of the whole core: plan, ``keys``,
    ``reversal_keys``, decide and ``take_writes``), deciding batch by batch as the
    runtimes do: each batch on a new working state read from a memory store, its writes
    committed back; only the store's reads and commits are left out of the time."""
    parsed = parsed_events(lines)
    decider = Decider(load_rules(str(RULES)))
    store = MemoryStore()
    clock = time.perf_counter
    deciding = handing = 0.0

    async def run() -> None:
        nonlocal deciding, handing
        for start in range(0, len(parsed), batch):
            events = parsed[start : start + batch]
            started = clock()
            plans = [decider.plan(event) for event in events]
            deciding += clock() - started
            started = clock()
            keys = decider.keys(events, plans)
            handing += clock() - started
            snapshot = await store.load(keys)
            started = clock()
            state = WorkingState(snapshot)
            more = decider.reversal_keys(events, state)
            handing += clock() - started
            if more:
                snapshot.merge(await store.load(more))
            started = clock()
            for event, plan in zip(events, plans, strict=True):
                decider.decide(event, plan, state)
            deciding += clock() - started
            started = clock()
            writes = state.take_writes()
            handing += clock() - started
            await store.commit(writes)

    with fewer_collections():
        asyncio.run(run())
    return len(parsed) / deciding, len(parsed) / (deciding + handing)


def replay(path: Path, store: str) -> float:
    """Wall seconds of one ``limitflow replay`` process."""
    started = time.perf_counter()
    subprocess.run(
        [
            sys.executable,
            "-m",
            "limitflow",
            "replay",
            "--rules",
            str(RULES),
            "--input",
            str(path),
            "--output",
            os.devnull,
            "--dead-letter",
            os.devnull,
            "--store",
            store,
        ],
        check=True,
        stderr=subprocess.DEVNULL,
    )
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--memory-events", type=int, default=1_000_000)
    parser.add_argument("--accounts", type=int, default=20_000)
    parser.add_argument(
        "--repeat",
        type=int,
        default=3,
        help="runs of the core and replays of each store (the best is shown)",
    )
    args = parser.parse_args()
    lines = events(args.events, accounts=args.accounts)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "events.jsonl"
        path.write_bytes(b"\n".join(lines) + b"\n")
        # each run on a new working state; the first also grows the process's heap
        runs = [core(lines) for _ in range(args.repeat)]
        decisions = [rate for rate, _ in runs]
        parses = max(rate for _, rate in runs)
        python_only, _ = core(lines, compiled=False)
        batched = [core_batched(lines) for _ in range(args.repeat)]
        print(f"events: {args.events:,}, rules: {RULES.name} (6 rules), cpu: {os.cpu_count()}")
        print(
            f"core (plan + decide, no I/O)     {max(decisions):>10,.0f} decisions/s"
            f" (best of {len(decisions)}; median {statistics.median(decisions):,.0f})"
        )
        print(f"core, Python path alone          {python_only:>10,.0f} decisions/s")
        for index, label in ((0, "plan + decide"), (1, "whole core   ")):
            rates = [pair[index] for pair in batched]
            print(
                f"  per batch of 2,000, {label} {max(rates):>10,.0f} decisions/s"
                f" (best of {len(rates)}; median {statistics.median(rates):,.0f})"
            )
        print(f"parse + validate                 {parses:>10,.0f} events/s (best)")
        for name in ("memory://", "sqlite://"):
            rates = []
            for run in range(args.repeat):  # each run into a new store: no duplicates
                store = name if name == "memory://" else f"sqlite:///{Path(tmp) / f'{run}.db'}"
                rates.append(args.events / replay(path, store))
            print(
                f"limitflow replay {name:<15} {max(rates):>10,.0f} events/s"
                f" (best of {len(rates)}; median {statistics.median(rates):,.0f})"
            )
        if args.memory_events:
            big = Path(tmp) / "big.jsonl"
            with big.open("wb") as out:
                for line in events(args.memory_events, accounts=200_000, seed=11):
                    out.write(line + b"\n")
            for name, store in (
                ("memory://", "memory://"),
                ("sqlite://", f"sqlite:///{Path(tmp) / 'big.db'}"),
            ):
                # VmHWM of the child's own address space: ru_maxrss would also count the
                # pages it shared with this (large) process between fork and exec
                code = (
                    "import runpy,sys;"
                    "sys.argv=['limitflow']+sys.argv[1:];"
                    'exec(\'try:\\n runpy.run_module("limitflow",run_name="__main__")\\n'
                    "except SystemExit: pass');"
                    "print([l.split()[1] for l in open('/proc/self/status') "
                    "if l.startswith('VmHWM')][0],file=sys.stderr)"
                )
                started = time.perf_counter()
                done = subprocess.run(
                    [
                        sys.executable,
                        "-c",
                        code,
                        "replay",
                        "--rules",
                        str(RULES),
                        "--input",
                        str(big),
                        "--output",
                        os.devnull,
                        "--dead-letter",
                        os.devnull,
                        "--store",
                        store,
                    ],
                    check=True,
                    capture_output=True,
                    text=True,
                )
                seconds = time.perf_counter() - started
                peak_kib = int(done.stderr.strip().splitlines()[-1])
                print(
                    f"replay of {args.memory_events:,} events, {name:<10} peak RSS "
                    f"{peak_kib / 1024:,.0f} MiB ({args.memory_events / seconds:,.0f} events/s)"
                )


if __name__ == "__main__":
    main()
