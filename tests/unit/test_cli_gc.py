"""A replay collects cyclic garbage less often, and leaves the collector as it found it."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from limitflow.cli import REPLAY_GC_THRESHOLD, _fewer_collections


@pytest.fixture
def thresholds() -> Iterator[None]:
    before = gc.get_threshold()
    yield
    gc.set_threshold(*before)


def test_a_replay_raises_the_young_threshold_and_restores_it(thresholds: None) -> None:
    gc.set_threshold(700, 10, 10)
    with _fewer_collections():
        assert gc.get_threshold() == (REPLAY_GC_THRESHOLD, 10, 10)
    assert gc.get_threshold() == (700, 10, 10)


def test_the_threshold_is_restored_when_the_replay_fails(thresholds: None) -> None:
    gc.set_threshold(700, 5, 7)
    with pytest.raises(RuntimeError), _fewer_collections():
        raise RuntimeError
    assert gc.get_threshold() == (700, 5, 7)


@pytest.mark.parametrize("first", [0, 100_000])
def test_off_stays_off_and_a_higher_threshold_stays(thresholds: None, first: int) -> None:
    gc.set_threshold(first, 10, 10)
    with _fewer_collections():
        assert gc.get_threshold() == (first, 10, 10)
