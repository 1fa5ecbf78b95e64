"""``run``'s stop signals before and after ``serve`` handles them (``limitflow.stopping``).
The whole process is in tests/unit/test_cli.py; these look at the parts in one."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from limitflow.run_cli import serve
from limitflow.settings import RunSettings, load_run_settings
from limitflow.stopping import SIGNALS, StopSignals
from schemas.rules import load_rules
from stores import open_store


@pytest.fixture
def handlers() -> Iterator[None]:
    before = {sig: signal.getsignal(sig) for sig in SIGNALS}
    yield
    StopSignals.restore()
    assert {sig: signal.getsignal(sig) for sig in SIGNALS} == before


def test_a_signal_before_the_event_loop_sets_the_stop_once_it_runs(handlers: None) -> None:
    signals = StopSignals.install()
    assert StopSignals.install() is signals  # the console script's, taken up by `run`
    os.kill(os.getpid(), signal.SIGTERM)  # recorded, not fatal

    async def attached() -> bool:
        return signals.attach().is_set()

    assert signals.received is signal.SIGTERM
    assert asyncio.run(attached())


def _rules_and_settings(tmp_path: Path, **extra: object) -> tuple[Path, RunSettings]:
    """A one-rule file and the settings of a `run` on it, its brokers at a closed port."""
    rules = tmp_path / "rules.yaml"
    rules.write_text("rules:\n  - {id: r, window: day, max_count: 1}\n")
    settings = load_run_settings(
        {
            "bootstrap_servers": "127.0.0.1:1",
            "input_topic": "in",
            "output_topic": "out",
            "dead_letter_topic": "dead",
            "group_id": "g",
            "rules": str(rules),
            "store": "memory://",
            **extra,
        },
        {},
    )
    return rules, settings


async def test_serve_stops_at_once_for_a_signal_before_its_handlers_and_logs_one_after(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    rules, settings = _rules_and_settings(tmp_path)  # brokers never tried: the stop comes first
    store = open_store("memory://")
    await store.init()
    signals = StopSignals()
    signals.received = signal.SIGTERM  # between the store's opening and serve's handlers
    caplog.set_level(logging.INFO, "limitflow.run")
    loop = asyncio.get_running_loop()
    try:
        assert (
            await asyncio.wait_for(serve(settings, load_rules(str(rules)), store, signals), 10) == 0
        )
        assert "received SIGTERM" in caplog.messages
        assert "stopped before the consumer could reach Kafka; nothing was consumed" in (
            caplog.messages
        )
        # handed back, not removed: the store and the loop are still to close
        assert signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, signal.SIG_IGN, None)
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(100):
            if "received SIGTERM: already stopping" in caplog.messages:
                break
            await asyncio.sleep(0.01)
        assert "received SIGTERM: already stopping" in caplog.messages
    finally:
        for sig in SIGNALS:
            loop.remove_signal_handler(sig)
        await store.close()


@pytest.mark.parametrize("final", [False, True])
async def test_serve_waits_for_brokers_the_bootstrap_server_named_but_that_do_not_answer(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    final: bool,
) -> None:
    # the bootstrap server answered the consumer's start, the brokers it advertised did
    # not (a listener this host cannot reach, or brokers gone since): aiokafka's
    # KafkaError of consumer.topics() ended run with exit 1 and a traceback. A refusal
    # that asking again cannot change (authorisation) still ends it.
    from aiokafka.errors import (  # type: ignore[import-untyped]
        KafkaError,
        TopicAuthorizationFailedError,
    )

    import limitflow.run_cli as run_cli
    from limitflow.run_cli import MissingTopics

    class Consumer:
        asked = 0

        async def start(self) -> None:
            pass

        async def stop(self) -> None:
            pass

        async def topics(self) -> set[str]:
            self.asked += 1
            if final:
                raise TopicAuthorizationFailedError()
            if self.asked < 3:
                raise KafkaError("Unable to get cluster metadata over all known brokers")
            return set()  # then the brokers answer: the topics are missing

    consumer = Consumer()
    monkeypatch.setattr(run_cli, "_consumer", lambda settings: consumer)
    rules, settings = _rules_and_settings(tmp_path, retry_initial_ms=10)
    store = open_store("memory://")
    await store.init()
    loop = asyncio.get_running_loop()
    caplog.set_level(logging.WARNING, "limitflow.run")
    try:
        with pytest.raises(TopicAuthorizationFailedError if final else MissingTopics):
            await asyncio.wait_for(serve(settings, load_rules(str(rules)), store), 10)
    finally:
        for sig in SIGNALS:
            loop.remove_signal_handler(sig)
        await store.close()
    assert consumer.asked == (1 if final else 3)
    waits = sum("waiting for them" in message for message in caplog.messages)
    assert waits == (0 if final else 2)


async def test_after_a_stop_the_consumer_closes_within_what_the_producers_left(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # the consumer was given what had been left of the grace before the producers
    # closed: a batch that ended 5 s into a 20 s grace, then brokers that stopped
    # answering, made the stop take 30 s, past an orchestrator's grace
    import limitflow.run_cli as run_cli

    given: list[float | None] = []

    class Runner:  # a stop under way: what is left of its grace
        gave_up = False
        left = 15.0

        def grace_left(self, now: float) -> float:
            return self.left

    runner = Runner()

    class Output:
        async def close(self, within: float | None = None) -> None:
            given.append(within)
            runner.left -= 10  # the producers took their 10 s

    async def close_consumer(consumer: object, within: float | None = None) -> None:
        given.append(within)

    monkeypatch.setattr(run_cli, "_close_consumer", close_consumer)
    await run_cli._close_clients(Output(), object(), runner)  # type: ignore[arg-type]
    assert given == [15.0, 5.0]
    await run_cli._close_clients(None, object(), None)  # no stop: the clients' own bounds
    assert given[2:] == [None]
