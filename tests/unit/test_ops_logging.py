"""How `run` logs: aiokafka's repeated errors throttled, text lines that keep the fields."""

from __future__ import annotations

import asyncio
import gc
import logging
from typing import Any

from streams.ops import KafkaClientThrottle, OffsetResets, TextFormatter, unseen_fence


def _record(name: str, msg: str, *args: object, **extra: object) -> logging.LogRecord:
    record = logging.LogRecord(name, logging.ERROR, __file__, 1, msg, args, None)
    record.__dict__.update(extra)
    return record


def test_aiokafka_repeating_itself_during_an_outage_is_let_through_every_10_s() -> None:
    # a broker outage made aiokafka log ~100 ERROR lines a second (992 in 10 s)
    now = [0.0]
    throttle = KafkaClientThrottle(every=10, clock=lambda: now[0])
    reconnect = "Unable connect to node with id %s: %s"
    passed = []
    for tick in range(1_000):  # 100 a second for 10 s
        now[0] = tick / 100
        record = _record("aiokafka.conn", reconnect, 111, "refused")
        if throttle.filter(record):
            passed.append(record)
    assert len(passed) == 1
    now[0] = 10.5
    later = _record("aiokafka.conn", reconnect, 111, "refused")
    assert throttle.filter(later)
    assert later.suppressed == 999  # type: ignore[attr-defined]
    # another message of aiokafka's, and limitflow's own, are not held back by it
    assert throttle.filter(_record("aiokafka.cluster", "Unable to update metadata from %s", 1))
    assert all(throttle.filter(_record("limitflow.consumer", "retrying")) for _ in range(50))


def test_text_lines_keep_the_fields_that_say_what_they_are_about() -> None:
    # --log-format text dropped them: "consuming" said neither topic nor group
    line = TextFormatter().format(
        _record("limitflow.run", "consuming", input_topic="payments", group_id="g")
    )
    assert line.endswith('ERROR limitflow.run: consuming [input_topic="payments" group_id="g"]')
    assert TextFormatter().format(_record("limitflow.run", "plain")).endswith("run: plain")


def test_a_message_that_is_not_a_string_is_throttled_too() -> None:
    # a record's msg may be any object, an unhashable one too (logging.error({...}))
    throttle = KafkaClientThrottle(every=10, clock=lambda: 0.0)
    unhashable: Any = {"node": 111}
    assert throttle.filter(_record("aiokafka", unhashable))
    assert not throttle.filter(_record("aiokafka", unhashable))


def test_asyncio_reporting_a_fence_run_has_handled_is_left_out() -> None:
    # a partition taken over logged ~20 "Future exception was never retrieved" errors
    # with ProducerFenced tracebacks: aiokafka's own futures of the discarded producer
    from aiokafka.errors import ProducerFenced  # type: ignore[import-untyped]

    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    async def unretrieved(exc: BaseException) -> None:
        asyncio.get_running_loop().create_future().set_exception(exc)

    handler = Keep()
    handler.addFilter(unseen_fence)
    logger = logging.getLogger("asyncio")
    logger.addHandler(handler)
    try:
        for exc in (ProducerFenced(), RuntimeError("one that no one handled")):
            asyncio.run(unretrieved(exc))
            gc.collect()
    finally:
        logger.removeHandler(handler)
    assert [r.getMessage().splitlines()[0] for r in records] == [
        "Future exception was never retrieved"
    ]
    assert records[0].exc_info is not None
    assert isinstance(records[0].exc_info[1], RuntimeError)


def test_the_offset_reset_warning_follows_the_log_level() -> None:
    # aiokafka's fetcher logger is opened to INFO for this one record, made a WARNING:
    # at --log-level ERROR it was shown all the same (the root's level is not checked
    # for a record that comes up from a child logger, and run's handler has no level)
    from aiokafka import TopicPartition  # type: ignore[import-untyped]
    from prometheus_client import CollectorRegistry, Counter

    counter = Counter("resets", "", ["partition"], registry=CollectorRegistry())
    fetcher = logging.getLogger(OffsetResets.LOGGER)
    root = logging.getLogger()
    shown: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = shown.append  # type: ignore[method-assign,assignment]
    level = root.level
    root.addHandler(handler)
    try:
        for run_level, seen in ((logging.ERROR, 0), (logging.WARNING, 1)):
            root.setLevel(run_level)
            with OffsetResets(counter).installed():
                fetcher.info(
                    "Fetch offset %s is out of range for partition %s, resetting offset",
                    7,
                    TopicPartition("events", 0),
                )
            assert len(shown) == seen
        assert counter.labels("0")._value.get() == 2  # counted at every level
        assert shown[0].levelname == "WARNING"
        assert shown[0].name == "limitflow.consumer"
    finally:
        root.removeHandler(handler)
        root.setLevel(level)
