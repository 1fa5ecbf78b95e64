"""The progress line a replay shows on a terminal's stderr."""

from __future__ import annotations

import io
import json
from pathlib import Path
from unittest import mock

from handlers.decide import Decider
from schemas.rules import load_rules
from stores.memory import MemoryStore
from streams.engine import Engine
from streams.replay import Interruption, replay

ROOT = Path(__file__).resolve().parents[2]


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


async def test_a_replay_stopped_by_a_signal_does_not_show_100_percent() -> None:
    # the last progress line showed the whole file done ([####…] 100%) for a replay
    # stopped by a signal after its first batch
    event = {"account_id": "a1", "amount": "1.00", "currency": "CNY"}
    lines = [
        json.dumps({**event, "event_id": f"e{i}", "occurred_at": "2026-03-14T01:00:00Z"})
        for i in range(10)
    ]
    data = "\n".join(lines).encode() + b"\n"
    engine = Engine(Decider(load_rules(str(ROOT / "examples" / "rules.yaml"))), MemoryStore())
    stop = Interruption()
    process = engine.process

    async def then_stop(batch: object) -> object:
        stop.requested = True  # a signal while the first batch is decided
        return await process(batch)  # type: ignore[arg-type]

    terminal = _Terminal()
    with mock.patch("sys.stderr", terminal), mock.patch.object(engine, "process", then_stop):
        summary = await replay(
            engine,
            io.BytesIO(data),
            io.BytesIO(),
            io.BytesIO(),
            batch_size=2,
            total_bytes=len(data),
            stop=stop,
        )
    assert summary.interrupted and summary.lines == 2
    last = terminal.getvalue().split("\r")[-1]
    assert last.startswith("[######      ") and " 20% 2 events" in last, last
