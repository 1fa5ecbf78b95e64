"""Where a sqlite replay's time goes: the store's ``load`` and ``commit``, apart from the rest.

    python -m benchmarks.sqlite_store                      # 100,000 events, 3 runs
    python -m benchmarks.sqlite_store --events 20000 --runs 5 --path /tmp/x.db
    python -m benchmarks.sqlite_store --store-only         # the store's calls alone

Runs the engine in this process over generated events (the batches ``limitflow replay``
makes: 2,000 events), into a fresh SQLite file each run, and prints, per run, the CPU
seconds (this thread's, so other processes on the machine do not count) and the wall
seconds spent in ``SqliteStore.load`` and ``SqliteStore.commit``, and the whole run's.
CPU time is the steadier figure on a shared machine; wall time includes the fsyncs.

``--store-only`` records the store calls of one such run (with a fixed clock), then
makes exactly those calls again on a fresh file in each run, with nothing else between
them: the same work every run, for comparing two versions of the store.
Not a test: figures vary with the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import os
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

from benchmarks.generate import events
from handlers.decide import Decider
from handlers.state import Keys, Writes
from schemas.rules import load_rules
from stores.sqlite import SqliteStore
from streams.engine import Engine, Record

ROOT = Path(__file__).resolve().parents[1]
RULES = ROOT / "examples" / "rules.yaml"
BATCH = 2_000
CLOCK = 1_772_400_000.0
"""The fixed clock of ``--store-only`` (2026-03-01, the generated events' start)."""
T = TypeVar("T")


class _Clock:
    """CPU and wall seconds spent inside the wrapped coroutines."""

    def __init__(self) -> None:
        self.cpu = 0.0
        self.wall = 0.0

    def wrap(self, call: Callable[..., Awaitable[T]]) -> Callable[..., Awaitable[T]]:
        async def timed(*args: object) -> T:
            cpu, wall = time.thread_time(), time.perf_counter()
            try:
                return await call(*args)
            finally:
                self.cpu += time.thread_time() - cpu
                self.wall += time.perf_counter() - wall

        return timed


def _fresh(path: str) -> None:
    for suffix in ("", "-wal", "-shm"):
        if os.path.exists(path + suffix):
            os.remove(path + suffix)


async def run(lines: list[bytes], path: str) -> tuple[_Clock, _Clock, float, float]:
    """(load, commit, whole-run CPU seconds, whole-run wall seconds) of one replay."""
    _fresh(path)
    store = SqliteStore(path)
    await store.init()
    loads, commits = _Clock(), _Clock()
    store.load = loads.wrap(store.load)  # type: ignore[method-assign,assignment]
    store.commit = commits.wrap(store.commit)  # type: ignore[method-assign,assignment]
    engine = Engine(Decider(load_rules(str(RULES))), store)
    records = [Record(line, {"line": n}) for n, line in enumerate(lines, start=1)]
    cpu, wall = time.thread_time(), time.perf_counter()
    for start in range(0, len(records), BATCH):
        await engine.process(records[start : start + BATCH])
    cpu, wall = time.thread_time() - cpu, time.perf_counter() - wall
    await store.close()
    return loads, commits, cpu, wall


Call = tuple[str, Keys | Writes]


async def record(lines: list[bytes], path: str) -> list[Call]:
    """The store calls of one replay of ``lines``, each with a copy of its argument."""
    _fresh(path)
    store = SqliteStore(path, clock=lambda: CLOCK)
    await store.init()
    calls: list[Call] = []
    load, commit = store.load, store.commit

    async def recorded_load(keys: Keys) -> object:
        calls.append(("load", copy.deepcopy(keys)))
        return await load(keys)

    async def recorded_commit(writes: Writes) -> None:
        calls.append(("commit", copy.deepcopy(writes)))  # commit changes the records
        await commit(writes)

    store.load = recorded_load  # type: ignore[method-assign,assignment]
    store.commit = recorded_commit  # type: ignore[method-assign]
    engine = Engine(Decider(load_rules(str(RULES))), store)
    records = [Record(line, {"line": n}) for n, line in enumerate(lines, start=1)]
    for start in range(0, len(records), BATCH):
        await engine.process(records[start : start + BATCH])
    await store.close()
    return calls


async def store_only(calls: list[Call], path: str) -> tuple[float, float, float, float]:
    """(load CPU, commit CPU, load wall, commit wall) seconds of making ``calls`` again
    (which changes their records: give each run a copy)."""
    _fresh(path)
    store = SqliteStore(path, clock=lambda: CLOCK)
    await store.init()
    spent = [0.0, 0.0, 0.0, 0.0]
    for name, argument in calls:
        cpu, wall = time.thread_time(), time.perf_counter()
        if isinstance(argument, Keys):
            await store.load(argument)
        elif isinstance(argument, Writes):
            await store.commit(argument)
        at = 0 if name == "load" else 1
        spent[at] += time.thread_time() - cpu
        spent[at + 2] += time.perf_counter() - wall
    await store.close()
    return spent[0], spent[1], spent[2], spent[3]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--path", help="the SQLite file (default: in a temporary directory)")
    parser.add_argument("--store-only", action="store_true", help="the store's calls alone")
    args = parser.parse_args()
    lines = events(args.events)
    with tempfile.TemporaryDirectory() as tmp:
        path = args.path or str(Path(tmp) / "state.db")
        if args.store_only:
            calls = asyncio.run(record(lines, path))
            print("run   load cpu/wall    commit cpu/wall   (seconds)")
            for n in range(args.runs):
                load_cpu, commit_cpu, load_wall, commit_wall = asyncio.run(
                    store_only(copy.deepcopy(calls), path)
                )
                print(
                    f"{n + 1:>3}  {load_cpu:6.2f} {load_wall:6.2f}    {commit_cpu:6.2f}"
                    f" {commit_wall:6.2f}"
                )
            return
        print("run   load cpu/wall    commit cpu/wall    whole cpu/wall   (seconds)")
        for n in range(args.runs):
            loads, commits, cpu, wall = asyncio.run(run(lines, path))
            print(
                f"{n + 1:>3}  {loads.cpu:6.2f} {loads.wall:6.2f}    {commits.cpu:6.2f}"
                f" {commits.wall:6.2f}    {cpu:6.2f} {wall:6.2f}"
            )


if __name__ == "__main__":
    main()
