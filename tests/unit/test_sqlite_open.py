"""Several processes opening one new SQLite file at the same moment, as two consumers
started together do: every one of them gets a usable store."""

from __future__ import annotations

import multiprocessing
from multiprocessing.synchronize import Barrier
from pathlib import Path

OPENERS = 6
ROUNDS = 10  # without the retry on open, about 1 round in 3 failed on this machine


def _open(path: str, barrier: Barrier, results: multiprocessing.Queue[str]) -> None:
    import asyncio

    from stores.sqlite import SqliteStore

    barrier.wait()
    try:
        store = SqliteStore(path)
        asyncio.run(store.init())
        asyncio.run(store.close())
        results.put("ok")
    except Exception as exc:  # reported to the test, which names it
        results.put(repr(exc))


def test_processes_opening_a_new_file_together_all_succeed(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("spawn")
    for n in range(ROUNDS):
        path = str(tmp_path / f"store-{n}.db")
        barrier = ctx.Barrier(OPENERS)
        results: multiprocessing.Queue[str] = ctx.Queue()
        procs = [ctx.Process(target=_open, args=(path, barrier, results)) for _ in range(OPENERS)]
        for p in procs:
            p.start()
        outcomes = [results.get(timeout=60) for _ in procs]
        for p in procs:
            p.join(timeout=60)
        assert outcomes == ["ok"] * OPENERS, f"round {n}: {outcomes}"
