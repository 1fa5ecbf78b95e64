"""The consumer loop's reaction to a rebalance callback that fails for good.

aiokafka calls the rebalance listener from its coordinator and only logs what it raises,
so this is checked against a stand-in for the aiokafka consumer; everything that talks
to a broker is tested against real ones in tests/integration/test_kafka_run.py.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from aiokafka import TopicPartition  # type: ignore[import-untyped]

from handlers.decide import Decider
from limitflow.errors import BrokerRejected
from limitflow.settings import load_run_settings
from schemas.rules import load_rules
from stores.memory import MemoryStore
from streams.consumer import VelocityConsumer
from streams.engine import Engine
from streams.ops import ConsumerState, Health, Metrics
from streams.output import Output

RULES = str(Path(__file__).resolve().parents[2] / "examples" / "rules.yaml")


class _Consumer:
    """What VelocityConsumer uses of AIOKafkaConsumer, with no broker behind it."""

    def __init__(self) -> None:
        self.paused: set[TopicPartition] = set()
        self.assigned: set[TopicPartition] = set()

    def pause(self, *partitions: TopicPartition) -> None:
        self.paused.update(partitions)

    def resume(self, *partitions: TopicPartition) -> None:
        self.paused.difference_update(partitions)

    def assignment(self) -> set[TopicPartition]:
        return self.assigned

    async def getmany(self, timeout_ms: int = 0, max_records: int | None = None) -> dict[Any, Any]:
        await asyncio.sleep(0.01)
        return {}

    def highwater(self, tp: TopicPartition) -> int | None:
        return None


class _FencingRefused(Output):
    """An output whose take-over of new partitions fails for good (exactly-once)."""

    async def on_assigned(self, partitions: frozenset[TopicPartition]) -> None:
        raise BrokerRejected("Kafka refused: InitProducerId")

    async def deliver(
        self,
        batch: Any,
        offsets: Any,
        done: set[TopicPartition],
    ) -> None:
        raise AssertionError("nothing may be delivered")

    async def close(self) -> None:
        return None


async def test_a_take_over_that_fails_for_good_stops_the_consumer_with_partitions_paused() -> None:
    # aiokafka logged the error and the partitions were resumed anyway: consumption
    # went on from offsets whose previous owner had not been fenced
    settings = load_run_settings(
        {
            "bootstrap_servers": "127.0.0.1:9",
            "input_topic": "in",
            "output_topic": "out",
            "dead_letter_topic": "dead",
            "group_id": "g",
            "rules": RULES,
            "store": "memory://",
        },
        {},
    )
    consumer = _Consumer()
    metrics = Metrics()
    runner = VelocityConsumer(
        settings,
        Engine(Decider(load_rules(RULES)), MemoryStore()),
        consumer,  # type: ignore[arg-type]
        _FencingRefused(),
        Health(metrics),
        metrics,
    )
    loop = asyncio.create_task(runner.run())
    tp = TopicPartition("in", 0)
    consumer.assigned = {tp}
    await runner.partitions_assigned(frozenset({tp}))
    assert consumer.paused == {tp}
    with pytest.raises(BrokerRejected):
        await asyncio.wait_for(loop, 5)
    assert runner.health.state is ConsumerState.FAILED
