"""A replay and a consumer collect cyclic garbage less often, and leave the collector as
they found it."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from pathlib import Path

import pytest

from limitflow import run_cli
from limitflow.cli import main
from streams.engine import GC_THRESHOLD, fewer_collections


@pytest.fixture
def thresholds() -> Iterator[None]:
    before = gc.get_threshold()
    yield
    gc.set_threshold(*before)


def test_a_replay_raises_the_young_threshold_and_restores_it(thresholds: None) -> None:
    gc.set_threshold(700, 10, 10)
    with fewer_collections():
        assert gc.get_threshold() == (GC_THRESHOLD, 10, 10)
    assert gc.get_threshold() == (700, 10, 10)


def test_the_threshold_is_restored_when_the_replay_fails(thresholds: None) -> None:
    gc.set_threshold(700, 5, 7)
    with pytest.raises(RuntimeError), fewer_collections():
        raise RuntimeError
    assert gc.get_threshold() == (700, 5, 7)


@pytest.mark.parametrize("first", [0, 100_000])
def test_off_stays_off_and_a_higher_threshold_stays(thresholds: None, first: int) -> None:
    gc.set_threshold(first, 10, 10)
    with fewer_collections():
        assert gc.get_threshold() == (first, 10, 10)


def test_a_consumer_runs_with_the_raised_threshold(
    thresholds: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[tuple[int, int, int]] = []

    async def serve(*_: object) -> int:
        seen.append(gc.get_threshold())
        return 0

    monkeypatch.setattr(run_cli, "serve", serve)
    gc.set_threshold(700, 10, 10)
    rules = tmp_path / "rules.yaml"
    rules.write_text("rules:\n  - {id: r, window: day, max_count: 1}\n")
    code = main(
        [
            "run",
            *("--bootstrap-servers", "127.0.0.1:9", "--input-topic", "in"),
            *("--output-topic", "out", "--dead-letter-topic", "dead", "--group-id", "g"),
            *("--rules", str(rules), "--store", "memory://"),
        ]
    )
    assert (code, seen) == (0, [(GC_THRESHOLD, 10, 10)])
    assert gc.get_threshold() == (700, 10, 10)
