"""How much of the core's time is the verdict: the core whole, then without parts of it.

    python -m benchmarks.core_parts [--events 100000]

Decides the same parsed events three times on one core, best of five runs each, on the
Python path (``Decider(compiled=False)``: the compiled payment path writes its verdicts
in C, out of reach of these patches): whole; with the verdict's JSON encoding replaced
by a constant; and with, in addition, the explanation of every applicable rule
(``limits``) skipped. The last two are not limitflow (their verdicts are wrong); they
bound what any speed-up of those parts could give. Not a test.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import handlers.decide as decide
from benchmarks.generate import events
from benchmarks.replay import RULES
from handlers.state import Snapshot, WorkingState
from schemas.events import Event, parse_event
from schemas.rules import load_rules


class _ConstantEncoder:
    def encode(self, _verdict: Any) -> bytes:
        return b"{}"


@contextmanager
def _without(encoding: bool, explanation: bool) -> Iterator[None]:
    # the module's own names, which its functions look up at each call
    names = vars(decide)
    saved = names["verdict_encoder"], names["_limit_state"]
    if encoding:
        names["verdict_encoder"] = _ConstantEncoder()
    if explanation:
        names["_limit_state"] = lambda *_: None
    try:
        yield
    finally:
        names["verdict_encoder"], names["_limit_state"] = saved


def _rate(parsed: list[Event]) -> float:
    best = 0.0
    for _ in range(5):
        decider = decide.Decider(load_rules(str(RULES)), compiled=False)
        state = WorkingState(Snapshot())
        started = time.perf_counter()
        for event in parsed:
            decider.decide(event, decider.plan(event), state)
        best = max(best, len(parsed) / (time.perf_counter() - started))
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=100_000)
    args = parser.parse_args()
    parsed = [parse_event(line) for line in events(args.events, accounts=20_000)]
    for label, encoding, explanation in (
        ("core, whole", False, False),
        ("without the verdict's encoding", True, False),
        ("without encoding and explanation", True, True),
    ):
        with _without(encoding, explanation):
            print(f"{label:<34} {_rate(parsed):>10,.0f} decisions/s")


if __name__ == "__main__":
    main()
