"""The consumer loop's reaction to a rebalance callback that fails for good.

aiokafka calls the rebalance listener from its coordinator and only logs what it raises,
so this is checked against a stand-in for the aiokafka consumer; everything that talks
to a broker is tested against real ones in tests/integration/test_kafka_run.py.
"""

from __future__ import annotations

import asyncio
import io
from pathlib import Path
from typing import Any

import pytest
from aiokafka import TopicPartition  # type: ignore[import-untyped]
from aiokafka.errors import KafkaError  # type: ignore[import-untyped]

from handlers.decide import Decider, OutcomeKind
from limitflow.errors import BrokerRejected, BrokerUnavailable, ConflictError, PartitionLost
from limitflow.settings import load_run_settings
from schemas.rules import load_rules
from stores.memory import MemoryStore
from streams.consumer import BatchAbandoned, VelocityConsumer
from streams.engine import Engine, Record
from streams.ops import ConsumerState, Health, Metrics
from streams.output import Output, TransactionalOutput, messages

RULES = str(Path(__file__).resolve().parents[2] / "examples" / "rules.yaml")


class _Consumer:
    """What VelocityConsumer uses of AIOKafkaConsumer, with no broker behind it."""

    def __init__(self) -> None:
        self.held: set[TopicPartition] = set()
        """The partitions paused (aiokafka's ``paused()``)."""
        self.assigned: set[TopicPartition] = set()

    def pause(self, *partitions: TopicPartition) -> None:
        self.held.update(partitions)

    def resume(self, *partitions: TopicPartition) -> None:
        self.held.difference_update(partitions)

    def paused(self) -> set[TopicPartition]:
        return set(self.held)

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

    async def close(self, within: float | None = None) -> None:
        return None


class _TakeOvers(_FencingRefused):
    """An output that records the take-overs it is asked for."""

    def __init__(self) -> None:
        self.asked: list[frozenset[TopicPartition]] = []

    async def on_assigned(self, partitions: frozenset[TopicPartition]) -> None:
        self.asked.append(partitions)


def _runner(
    consumer: Any, engine: Engine, output: Output | None = None, **settings: object
) -> VelocityConsumer:
    """A consumer on ``consumer`` (a fake) whose output (by default) refuses to take
    partitions over; ``settings``: more of ``run``'s settings."""
    loaded = load_run_settings(
        {
            "bootstrap_servers": "127.0.0.1:9",
            "input_topic": "in",
            "output_topic": "out",
            "dead_letter_topic": "dead",
            "group_id": "g",
            "rules": RULES,
            "store": "memory://",
            **settings,
        },
        {},
    )
    metrics = Metrics()
    return VelocityConsumer(
        loaded,
        engine,
        consumer,
        output or _FencingRefused(),
        Health(metrics),
        metrics,
    )


async def test_a_take_over_that_fails_for_good_stops_the_consumer_with_partitions_paused() -> None:
    # aiokafka logged the error and the partitions were resumed anyway: consumption
    # went on from offsets whose previous owner had not been fenced
    consumer = _Consumer()
    runner = _runner(consumer, Engine(Decider(load_rules(RULES)), MemoryStore()))
    loop = asyncio.create_task(runner.run())
    tp = TopicPartition("in", 0)
    consumer.assigned = {tp}
    await runner.partitions_assigned(frozenset({tp}))
    assert consumer.held == {tp}
    with pytest.raises(BrokerRejected):
        await asyncio.wait_for(loop, 5)
    assert runner.health.state is ConsumerState.FAILED


async def test_partitions_assigned_once_stopping_are_left_paused_for_their_next_owner() -> None:
    # a rebalance that completed while run closed (after its loop, before it left the
    # group) had the exactly-once output open producers for them after its close
    consumer, output = _Consumer(), _TakeOvers()
    runner = _runner(consumer, Engine(Decider(load_rules(RULES)), MemoryStore()), output)
    loop = asyncio.create_task(runner.run())
    first = TopicPartition("in", 0)
    consumer.assigned = {first}
    await runner.partitions_assigned(frozenset({first}))
    assert output.asked == [frozenset({first})]
    runner.request_stop()
    await asyncio.wait_for(loop, 5)
    await runner.partitions_revoked(frozenset({first}))
    second = TopicPartition("in", 1)
    consumer.assigned = {second}
    await runner.partitions_assigned(frozenset({second}))
    assert output.asked == [frozenset({first})]
    assert second in consumer.held


async def test_a_member_joining_its_group_again_is_not_ready_and_owns_nothing() -> None:
    # a join that never completed (tansu keeps a departed leader while the group
    # rebalances) showed 200 "running", with the partitions the member had lost
    consumer = _Consumer()
    runner = _runner(consumer, Engine(Decider(load_rules(RULES)), MemoryStore()), _TakeOvers())
    loop = asyncio.create_task(runner.run())
    health = runner.health
    tps = TopicPartition("in", 0), TopicPartition("in", 1)
    await runner.partitions_revoked(frozenset())  # aiokafka's, before the first join
    consumer.assigned = set(tps)
    await runner.partitions_assigned(frozenset(tps))
    assert health.ready and health.describe()["assigned"] == ["in:0", "in:1"]
    await runner.partitions_revoked(frozenset(tps))
    assert not health.ready
    assert {k: health.describe()[k] for k in ("state", "waiting_on", "assigned")} == {
        "state": "waiting",
        "waiting_on": "group",
        "assigned": [],
    }
    state = runner.metrics.registry.get_sample_value
    assert state("limitflow_consumer_state", {"state": "waiting"}) == 1  # the metric agrees
    assert state("limitflow_consumer_state", {"state": "running"}) == 0
    consumer.assigned = {tps[1]}
    await runner.partitions_assigned(frozenset({tps[1]}))
    assert health.ready
    assert health.describe()["state"] == "running" and health.describe()["assigned"] == ["in:1"]
    assert state("limitflow_consumer_state", {"state": "running"}) == 1
    runner.request_stop()
    await asyncio.wait_for(loop, 5)


async def test_results_are_counted_by_decision_reason_and_error() -> None:
    """Counted per label set, once per batch: the totals are still one per result."""
    engine = Engine(Decider(load_rules(RULES)), MemoryStore())
    runner = _runner(_Consumer(), engine)
    metrics = runner.metrics
    lines = [
        b'{"event_id": "e1", "account_id": "a", "amount": "1.00", "currency": "CNY",'
        b' "occurred_at": "2026-03-01T00:00:00Z"}',
        b'{"event_id": "e2", "account_id": "a", "amount": "9999.00", "currency": "CNY",'
        b' "occurred_at": "2026-03-01T00:00:01Z"}',
        b"not json",
        b"{}",
        b"[1, 2",
    ]
    records = [Record(line, {"line": n}) for n, line in enumerate(lines, 1)]
    first = await engine.process(records)
    again = await engine.process(records[:2]) + await engine.process(records[:2])  # resent
    runner._count_results(first + again)
    value = metrics.registry.get_sample_value
    verdict = {"decision": "accept", "reason": "none", "duplicate": "false"}
    assert value("limitflow_verdicts_total", verdict) == 1
    assert value("limitflow_verdicts_total", {**verdict, "duplicate": "true"}) == 2
    limit = {"decision": "reject", "reason": "limit_exceeded"}
    assert value("limitflow_verdicts_total", {**limit, "duplicate": "false"}) == 1
    assert value("limitflow_verdicts_total", {**limit, "duplicate": "true"}) == 2
    assert value("limitflow_dead_letters_total", {"error": "invalid_json"}) == 2
    assert value("limitflow_dead_letters_total", {"error": "invalid_event"}) == 1


class _Contended(MemoryStore):
    """A memory store whose first ``conflicts`` commits another writer got to first."""

    def __init__(self, conflicts: int) -> None:
        super().__init__()
        self.conflicts = conflicts

    async def _write(self, writes: Any, expected: Any) -> None:
        if self.conflicts:
            self.conflicts -= 1
            raise ConflictError("a record changed since it was read")
        await super()._write(writes, expected)


async def test_commits_refused_by_another_writer_are_counted() -> None:
    engine = Engine(Decider(load_rules(RULES)), _Contended(conflicts=2))
    runner = _runner(_Consumer(), engine)
    value = runner.metrics.registry.get_sample_value
    assert value("limitflow_store_conflicts_total") == 0
    line = (
        b'{"event_id": "e1", "account_id": "a", "amount": "1.00", "currency": "CNY",'
        b' "occurred_at": "2026-03-01T00:00:00Z"}'
    )
    await engine.process([Record(line, {"line": 1})])
    runner._count_store_work()
    assert value("limitflow_store_conflicts_total") == 2
    await engine.process([Record(line, {"line": 2})])  # a duplicate: no commit at all
    runner._count_store_work()
    assert value("limitflow_store_conflicts_total") == 2


async def test_a_retry_wait_after_a_stop_sleeps_instead_of_spinning() -> None:
    # request_stop wakes the wait once; the event it set stayed set, and every later
    # pass of the wait returned at once: a stop during an outage spun on the CPU, polling,
    # for the whole grace period (30 s by default)
    runner = _runner(_Consumer(), Engine(Decider(load_rules(RULES)), MemoryStore()))
    passes = 0

    async def keep_membership() -> None:
        nonlocal passes
        passes += 1

    runner._keep_membership = keep_membership  # type: ignore[method-assign]
    runner.request_stop()
    started = asyncio.get_running_loop().time()
    await runner._wait(0.6, "decide")
    assert asyncio.get_running_loop().time() - started >= 0.55  # the backoff, slept
    assert passes <= 3  # woken by the stop, then 1-s slices: not thousands of passes


async def test_a_second_signal_still_ends_a_retry_wait_at_once() -> None:
    runner = _runner(_Consumer(), Engine(Decider(load_rules(RULES)), MemoryStore()))
    runner.request_stop()
    waiting = asyncio.create_task(runner._wait(30, "decide"))
    await asyncio.sleep(0.05)  # woken by the first signal, now waiting on the event
    runner.request_stop(now=True)
    with pytest.raises(BatchAbandoned, match="grace"):
        await asyncio.wait_for(waiting, 2)


class _Seeking(_Consumer):
    """The stand-in, recording where each partition was sent back to."""

    def __init__(self) -> None:
        super().__init__()
        self.seeks: dict[TopicPartition, int] = {}

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self.seeks[tp] = offset


class _LosesOnePartition(Output):
    """Exactly-once's shape: each partition commits alone; ``lost``'s is fenced."""

    def __init__(self, lost: TopicPartition) -> None:
        self.lost = lost

    async def deliver(
        self,
        batch: Any,
        offsets: Any,
        done: set[TopicPartition],
    ) -> None:
        done.update(tp for tp in batch if tp != self.lost)
        raise PartitionLost(f"{self.lost}: ProducerFenced")


class _Record:
    def __init__(self, tp: TopicPartition, offset: int) -> None:
        self.topic, self.partition, self.offset = tp.topic, tp.partition, offset
        self.key = b"a"
        self.value = (
            b'{"event_id": "%s-%d", "account_id": "a", "amount": "1.00", "currency": "CNY",'
            b' "occurred_at": "2026-03-01T00:00:00Z"}' % (str(tp).encode(), offset)
        )


async def test_partitions_committed_before_another_is_lost_are_not_read_again() -> None:
    # Under exactly-once, partition 0's transaction committed its verdicts and offset,
    # then partition 1's was fenced. Sending partition 0 back to the batch's start made
    # the next batch publish its verdicts again, a second time for read_committed readers.
    consumer = _Seeking()
    runner, kept, lost = await _one_of_two_lost(consumer)
    assert consumer.seeks == {lost: 100}
    assert runner._positions[kept] == 103


async def test_verdicts_of_partitions_committed_before_another_is_lost_are_counted() -> None:
    # partition 0's 3 verdicts were published and committed and are never read again, but
    # limitflow_verdicts_total and limitflow_offset_commits_total left them out for good
    runner, _, _ = await _one_of_two_lost(_Seeking())
    value = runner.metrics.registry.get_sample_value
    verdict = {"decision": "accept", "reason": "none", "duplicate": "false"}
    assert value("limitflow_verdicts_total", verdict) == 3
    assert value("limitflow_offset_commits_total") == 1


async def _one_of_two_lost(
    consumer: _Seeking,
) -> tuple[VelocityConsumer, TopicPartition, TopicPartition]:
    """A runner on ``consumer`` that decided a batch of two partitions, offsets 100-102:
    ``kept``'s committed, then ``lost``'s transaction was fenced."""
    kept, lost = TopicPartition("in", 0), TopicPartition("in", 1)
    consumer.assigned = {kept, lost}
    runner = _runner(consumer, Engine(Decider(load_rules(RULES)), MemoryStore()))
    runner.output = _LosesOnePartition(lost)
    batch = {tp: [_Record(tp, n) for n in range(100, 103)] for tp in (kept, lost)}
    await runner._handle(batch)
    return runner, kept, lost


async def test_a_member_whose_partition_was_taken_over_pauses_it_and_rejoins_at_once() -> None:
    # a member whose session had ended went on reading the partition another member now
    # owned until its next heartbeat, each fencing the other's producer batch after batch
    class Coordinator:
        rejoins = 0

        def request_rejoin(self) -> None:
            self.rejoins += 1

    consumer = _Seeking()
    consumer._coordinator = Coordinator()  # type: ignore[attr-defined]
    runner, kept, lost = await _one_of_two_lost(consumer)
    assert consumer.held == {lost}
    assert consumer._coordinator.rejoins == 1  # type: ignore[attr-defined]
    await runner.partitions_assigned(frozenset({kept, lost}))  # the rejoin's assignment
    assert consumer.held == set()


class _Transacting(TransactionalOutput):
    """Exactly-once's output whose transactions all commit, with no broker behind it."""

    def __init__(self, consumer: Any) -> None:
        super().__init__(lambda tid: None, consumer, "g")

    async def _transact(self, tp: TopicPartition, batch: Any, offset: int) -> None:
        return None


async def test_under_exactly_once_each_partitions_transaction_counts_as_a_commit() -> None:
    # a batch of two partitions commits in two transactions, one each; the metric said
    # "offset commits (or transactions) that succeeded", and counted one a batch (7 for
    # the 10 transactions of 600 events on 4 partitions, in batches of 100, on noida)
    consumer = _Seeking()
    tps = TopicPartition("in", 0), TopicPartition("in", 1)
    consumer.assigned = set(tps)
    runner = _runner(consumer, Engine(Decider(load_rules(RULES)), MemoryStore()))
    runner.output = _Transacting(consumer)
    await runner._handle({tp: [_Record(tp, n) for n in range(100, 103)] for tp in tps})
    assert runner.metrics.registry.get_sample_value("limitflow_offset_commits_total") == 2


class _Rebalancing(_Consumer):
    """aiokafka's getmany while the group rebalances: it waits for the new assignment,
    whatever its timeout (for ever, when the brokers went away during the join)."""

    async def getmany(self, timeout_ms: int = 0, max_records: int | None = None) -> dict[Any, Any]:
        await asyncio.Event().wait()
        return {}


async def test_a_stop_during_a_rebalance_that_never_ends_is_heeded() -> None:
    # a SIGTERM that came while the member was joining went unheeded until the join
    # ended: a reviewer's member was still running 90 s later, its brokers gone
    runner = _runner(_Rebalancing(), Engine(Decider(load_rules(RULES)), MemoryStore()))
    loop = asyncio.create_task(runner.run())
    await asyncio.sleep(0.05)  # in the poll, waiting on the join
    runner.request_stop()
    await asyncio.wait_for(loop, 2)
    assert runner.health.state is ConsumerState.STOPPED


class _Recording(Output):
    """An output that takes any partition over and records what it is given to deliver."""

    def __init__(self) -> None:
        self.delivered: list[TopicPartition] = []

    async def deliver(self, batch: Any, offsets: Any, done: set[TopicPartition]) -> None:
        self.delivered.extend(batch)
        done.update(batch)


class _ReturnsAfterARevocation(_Consumer):
    """aiokafka's getmany that was waiting when the group began to rebalance: it returns
    the old assignment's records after ``partitions_revoked`` has run."""

    def __init__(self, tp: TopicPartition) -> None:
        super().__init__()
        self.tp = tp
        self.revoked = asyncio.Event()
        self.returned = False

    async def getmany(self, timeout_ms: int = 0, max_records: int | None = None) -> dict[Any, Any]:
        if self.returned:
            return await super().getmany(timeout_ms, max_records)
        await self.revoked.wait()
        self.returned = True
        return {self.tp: [_Record(self.tp, 100)]}


async def test_records_of_a_partition_revoked_while_polling_are_not_decided() -> None:
    # they were: the member took the partition back for a batch (under exactly-once its
    # new producer fenced the new owner's), and then the lag of a partition no longer
    # assigned raised aiokafka's "Partition is not assigned", ending `run` with exit 1
    tp = TopicPartition("in", 0)
    consumer = _ReturnsAfterARevocation(tp)
    consumer.assigned = {tp}
    runner = _runner(consumer, Engine(Decider(load_rules(RULES)), MemoryStore()))
    runner.output = output = _Recording()
    await runner.partitions_assigned(frozenset({tp}))
    loop = asyncio.create_task(runner.run())
    await asyncio.sleep(0.05)  # polling
    await runner.partitions_revoked(frozenset({tp}))
    consumer.assigned = set()  # the rebalance's new assignment, without it
    consumer.revoked.set()
    await asyncio.sleep(0.05)
    runner.request_stop()
    await asyncio.wait_for(loop, 5)
    assert consumer.returned
    assert output.delivered == []


async def test_a_stage_left_unanswered_shows_as_waiting_then_running_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # a publish to brokers gone quiet waits out the whole request timeout (30 s) before
    # it fails: /readyz said ready all along, and nothing was logged
    monkeypatch.setattr("streams.consumer._SLOW_AFTER", 0.3)
    runner = _runner(_Consumer(), Engine(Decider(load_rules(RULES)), MemoryStore()))
    runner.health.set(ConsumerState.RUNNING)
    answer = asyncio.Event()

    async def publish() -> str:
        await answer.wait()
        return "acked"

    watched = asyncio.create_task(runner._retrying("publish", publish))
    await asyncio.sleep(1.0)  # past _SLOW_AFTER and a look of the watch
    assert (runner.health.state, runner.health.waiting_on) == (ConsumerState.WAITING, "publish")
    answer.set()
    assert await asyncio.wait_for(watched, 2) == "acked"
    assert runner.health.state is ConsumerState.RUNNING
    assert not runner.gave_up


async def test_a_stop_abandons_a_stage_in_flight_once_its_grace_is_over() -> None:
    # the grace was looked at only between retries: a stop during an outage took the
    # grace and then the in-flight request's whole timeout (~60 s with the defaults)
    runner = _runner(_Consumer(), Engine(Decider(load_rules(RULES)), MemoryStore()))
    cancelled = asyncio.Event()

    async def publish() -> None:
        try:
            await asyncio.sleep(3600)  # brokers that never answer
        except asyncio.CancelledError:
            cancelled.set()
            raise

    watched = asyncio.create_task(runner._retrying("publish", publish))
    await asyncio.sleep(0.1)
    runner.request_stop()
    await asyncio.sleep(0.7)
    assert not watched.done()  # within the grace (30 s): still waiting for the answer
    runner.request_stop(now=True)  # a second signal, or the grace running out
    with pytest.raises(BatchAbandoned, match="grace period expired while waiting on publish"):
        await asyncio.wait_for(watched, 2)
    assert cancelled.is_set()  # the request in flight was cancelled, not left running
    assert runner.gave_up  # the clients then close in haste


class _Fetched(_Consumer):
    """The stand-in, with high-water marks and read positions as fetches bring them."""

    def __init__(self, highwater: dict[TopicPartition, int], at: dict[TopicPartition, int]):
        super().__init__()
        self.assigned = set(highwater) | {TopicPartition("in", 9)}  # 9: not fetched yet
        self.marks, self.at = highwater, at

    def highwater(self, tp: TopicPartition) -> int | None:
        return self.marks.get(tp)

    async def position(self, tp: TopicPartition) -> int:
        return self.at[tp]


async def test_lag_counts_the_partitions_no_batch_came_from_yet() -> None:
    # only partitions a batch had come from had a lag: a backlog spread over six
    # partitions read 335 of ~2,800 waiting records, and an alert on the sum stayed quiet
    p0, p1 = TopicPartition("in", 0), TopicPartition("in", 1)
    consumer = _Fetched({p0: 100, p1: 50}, {p0: 90, p1: 20})
    runner = _runner(consumer, Engine(Decider(load_rules(RULES)), MemoryStore()))
    runner._positions[p0] = 40  # where its last batch ended (its read position runs ahead)
    await runner._update_lag()
    value = runner.metrics.registry.get_sample_value
    assert value("limitflow_consumer_lag", {"partition": "0"}) == 60
    assert value("limitflow_consumer_lag", {"partition": "1"}) == 30
    assert value("limitflow_consumer_lag", {"partition": "9"}) is None  # no mark yet


async def test_a_slow_stage_that_then_fails_for_good_leaves_readiness_running(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # slow, then its partition lost (a commit refused after the session ended): the
    # batch is rewound and the consumer goes on, but /readyz stayed at "waiting" for good
    monkeypatch.setattr("streams.consumer._SLOW_AFTER", 0.3)
    runner = _runner(_Consumer(), Engine(Decider(load_rules(RULES)), MemoryStore()))
    runner.health.set(ConsumerState.RUNNING)

    async def publish() -> None:
        await asyncio.sleep(0.9)
        raise PartitionLost("in-0: ProducerFenced")

    with pytest.raises(PartitionLost):
        await runner._retrying("publish", publish)
    assert runner.health.state is ConsumerState.RUNNING


async def test_readiness_stays_waiting_between_slow_attempts_that_fail(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # brokers frozen under a batch: each publish is slow (shown as waiting) and then
    # fails; from the second failure on, the attempt's end set "running" and nothing set
    # "waiting" again: /readyz said 200 for ~7 s of every retry, the brokers still down
    monkeypatch.setattr("streams.consumer._SLOW_AFTER", 0.1)
    monkeypatch.setattr("streams.consumer._WATCH_EVERY", 0.02)
    runner = _runner(
        _Consumer(),
        Engine(Decider(load_rules(RULES)), MemoryStore()),
        retry_initial_ms=10,
        retry_max_ms=20,
    )
    runner.health.set(ConsumerState.RUNNING)
    ready_at_start: list[bool] = []

    async def publish() -> str:
        ready_at_start.append(runner.health.ready)
        await asyncio.sleep(0.2)  # slow: past _SLOW_AFTER
        if len(ready_at_start) < 4:
            raise BrokerUnavailable("Kafka unavailable: RequestTimedOutError()")
        return "acked"

    assert await asyncio.wait_for(runner._retrying("publish", publish), 5) == "acked"
    assert ready_at_start == [True, False, False, False]
    assert runner.health.state is ConsumerState.RUNNING


class _Rebalanced(_Fetched):
    """A rebalance that ends while the lag asks where a partition is read."""

    async def position(self, tp: TopicPartition) -> int:
        self.assigned = set()  # revoked meanwhile: aiokafka now asserts on them
        return self.at[tp]

    def highwater(self, tp: TopicPartition) -> int | None:
        assert tp in self.assigned, f"Partition {tp} is not assigned"
        return super().highwater(tp)


async def test_lag_never_asks_about_a_partition_revoked_while_it_waited() -> None:
    # the loop asked highwater() of the next partition after an await in which the
    # rebalance had ended: aiokafka's assertion would stop run
    p0, p1 = TopicPartition("in", 0), TopicPartition("in", 1)
    runner = _runner(
        _Rebalanced({p0: 100, p1: 50}, {p0: 90, p1: 20}),
        Engine(Decider(load_rules(RULES)), MemoryStore()),
    )
    await runner._update_lag()
    assert (
        runner.metrics.registry.get_sample_value("limitflow_consumer_lag", {"partition": "0"})
        is None
    )


class _PastMarkers(_Consumer):
    """A consumer whose position moved past records it never returned (transaction
    markers, which a read_committed consumer skips)."""

    async def position(self, tp: TopicPartition) -> int:
        return 105


async def test_offsets_moved_past_transaction_markers_count_as_commits() -> None:
    # committed (a transaction of its own under exactly-once), but
    # limitflow_offset_commits_total, "offset commits (or transactions) that succeeded",
    # left them out
    tp = TopicPartition("in", 0)
    consumer = _PastMarkers()
    consumer.assigned = {tp}
    runner = _runner(consumer, Engine(Decider(load_rules(RULES)), MemoryStore()))
    runner.output = output = _Recording()
    runner._owned, runner._positions = {tp}, {tp: 100}
    await runner._pass_skipped()
    assert output.delivered == [tp]
    assert runner._positions[tp] == 105
    assert runner.metrics.registry.get_sample_value("limitflow_offset_commits_total") == 1


class _RestartedPastMarkers(_PastMarkers):
    """The same after a restart: the group's offset (100) is where the last run's last
    batch ended, before the marker that closed its transaction."""

    async def committed(self, tp: TopicPartition) -> int | None:
        return 100


async def test_offsets_moved_past_markers_before_any_batch_are_committed_too() -> None:
    # a partition no batch came from since it was assigned (a restart after a batch that
    # ended before its transaction's marker, or input that was all aborted) was taken to
    # be read from the group's offset: the marker's offset was never committed, and the
    # group's lag stayed at 1 (or the aborted records') for good
    tp = TopicPartition("in", 0)
    consumer = _RestartedPastMarkers()
    consumer.assigned = {tp}
    runner = _runner(consumer, Engine(Decider(load_rules(RULES)), MemoryStore()))
    runner.output = output = _Recording()
    runner._owned = {tp}
    await runner._pass_skipped()
    assert output.delivered == [tp]
    assert runner._positions[tp] == 105


class _SlowCoordinator(_RestartedPastMarkers):
    """A coordinator that answers each committed-offset request after 0.3 s; how many
    were asked at once is kept."""

    def __init__(self) -> None:
        super().__init__()
        self.asking = self.most_at_once = 0

    async def committed(self, tp: TopicPartition) -> int | None:
        self.asking += 1
        self.most_at_once = max(self.most_at_once, self.asking)
        try:
            await asyncio.sleep(0.3)
        finally:
            self.asking -= 1
        return 100


async def test_the_group_offsets_of_partitions_never_read_are_asked_at_once() -> None:
    # asked one after another, each bounded by 0.5 s, a coordinator answering in 0.3 s
    # held the consume loop 0.3 s a partition at every first look after an assignment:
    # 1.8 s for six partitions, 30 s for a hundred
    partitions = {TopicPartition("in", n) for n in range(6)}
    consumer = _SlowCoordinator()
    consumer.assigned = set(partitions)
    runner = _runner(consumer, Engine(Decider(load_rules(RULES)), MemoryStore()))
    runner.output = output = _Recording()
    runner._owned = set(partitions)
    await runner._pass_skipped()
    assert consumer.most_at_once == len(partitions)
    assert sorted(output.delivered) == sorted(partitions)
    assert all(runner._positions[tp] == 105 for tp in partitions)


class _OneBusyOneQuiet(_PastMarkers):
    """Records keep coming from partition 0 (every poll brings some); partition 1, quiet,
    is read past a transaction's marker (position 105, committed 100)."""

    def __init__(self, busy: TopicPartition) -> None:
        super().__init__()
        self.busy, self.next = busy, 0

    async def getmany(self, timeout_ms: int = 0, max_records: int | None = None) -> dict[Any, Any]:
        await asyncio.sleep(0.01)
        self.next += 1
        return {self.busy: [_Record(self.busy, self.next)]}


async def test_a_quiet_partition_is_committed_past_its_markers_while_another_is_busy() -> None:
    # looked at only when a poll brought nothing: a few events a second on one partition
    # kept every poll from coming back empty, and a quiet partition's marker stayed
    # uncommitted (its lag at 1, in limitflow's metric and the group's) for as long
    busy, quiet = TopicPartition("in", 0), TopicPartition("in", 1)
    consumer = _OneBusyOneQuiet(busy)
    consumer.assigned = {busy, quiet}
    runner = _runner(consumer, Engine(Decider(load_rules(RULES)), MemoryStore()))
    runner.output = output = _Recording()
    runner._owned, runner._positions = {busy, quiet}, {quiet: 100}
    loop = asyncio.create_task(runner.run())
    await asyncio.sleep(0.2)
    runner.request_stop()
    await asyncio.wait_for(loop, 5)
    assert consumer.next > 3  # every poll brought records
    assert quiet in output.delivered
    assert runner._positions[quiet] == 105


class _Kept(Output):
    """An output that keeps what it is asked to deliver."""

    def __init__(self) -> None:
        self.messages: list[Any] = []

    async def deliver(self, batch: Any, offsets: Any, done: set[TopicPartition]) -> None:
        self.messages += [m for tp in batch for m in batch[tp]]
        done.update(batch)


class _In:
    def __init__(self, offset: int, value: bytes) -> None:
        self.topic, self.partition, self.offset = "in", 0, offset
        self.key, self.value = b"a", value


def _padded_payment(n: int, pad: int = 0) -> bytes:
    """Payment ``e{n}`` of 1.00 CNY of account ``a``, made ``pad`` bytes longer."""
    import json

    return json.dumps(
        {
            "event_id": f"e{n}",
            "account_id": "a",
            "amount": "1.00",
            "currency": "CNY",
            "occurred_at": "2026-03-01T00:00:00Z",
            "note": "x" * pad,
        }
    ).encode()


async def test_a_record_over_max_message_bytes_is_a_dead_letter_as_a_long_line_in_replay() -> None:
    # replay takes no line over --max-line-bytes, which is run's --max-message-bytes
    # ("the same limit"): an input topic that took a larger record had it decided and
    # counted by run, and dead-lettered by a replay of the same events
    import hashlib
    import json

    from streams.replay import LongLine, read_lines

    pay = _padded_payment
    big = pay(1, pad=5000)
    store = MemoryStore()
    out = _Kept()
    engine = Engine(Decider(load_rules(RULES)), store)
    runner = _runner(_Consumer(), engine, out, max_message_bytes=4000)
    tp = TopicPartition("in", 0)
    runner._owned = {tp}
    async with runner._batch_lock:
        await runner._handle({tp: [_In(0, pay(0)), _In(1, big), _In(2, pay(2))]})
    assert [m.topic for m in out.messages] == ["out", "dead", "out"]
    letter = json.loads(out.messages[1].value)
    assert letter["error"] == "invalid_event" and letter.get("raw") is None
    assert (letter["raw_size"], letter["raw_sha256"]) == (len(big), hashlib.sha256(big).hexdigest())
    assert letter["source"] == {"topic": "in", "partition": 0, "offset": 1}
    assert out.messages[1].key == b"a"
    assert json.loads(out.messages[2].value)["seq"] == 2  # e1 was not counted
    assert runner.engine.stats.by_kind[OutcomeKind.DEAD_LETTER] == 1
    pending: list[Record] = []
    for _ in read_lines(io.BytesIO(big + b"\n"), 10, pending, max_line_bytes=4000):
        pass
    assert [type(r) for r in pending] == [LongLine]  # as replay has it


async def test_the_faust_app_dead_letters_a_record_over_max_message_bytes_too() -> None:
    # the app handed the engine every record whatever its size, as run did: a record
    # replay dead-letters was decided and counted
    import hashlib
    import json
    from types import SimpleNamespace

    from streams.engine import process_within
    from streams.faust_app import FaustSettings, _unkeyed, source_of

    settings = FaustSettings.from_env(
        {
            "LIMITFLOW_BOOTSTRAP_SERVERS": "127.0.0.1:9092",
            "LIMITFLOW_RULES": RULES,
            "LIMITFLOW_MAX_MESSAGE_BYTES": "4000",
        }
    )

    def event(offset: int, pad: int = 0) -> Any:
        message = SimpleNamespace(topic="in", partition=0, offset=offset)
        return SimpleNamespace(message=message, value=_padded_payment(offset, pad))

    events = [event(0), event(1, pad=5000), event(2)]
    records = [source_of(e, settings.max_message_bytes) for e in events]
    engine = Engine(Decider(load_rules(RULES)), MemoryStore())
    out = list(messages(await process_within(engine, records), settings, _unkeyed))
    assert [m.topic for m in out] == [
        settings.output_topic,
        settings.dead_letter_topic,
        settings.output_topic,
    ]
    letter = json.loads(out[1].value)
    big = events[1].value
    assert letter["error"] == "invalid_event" and letter.get("raw") is None
    assert (letter["raw_size"], letter["raw_sha256"]) == (len(big), hashlib.sha256(big).hexdigest())
    assert json.loads(out[2].value)["seq"] == 2  # e1 was not counted


async def test_the_faust_app_bounds_each_publish_request_not_the_whole_batch() -> None:
    # the app bounded a batch's whole publish by the request timeout: verdicts that took
    # several record batches of a partition, one after another, each acknowledged well
    # within the timeout, took longer as a whole; the batch failed, was published again,
    # failed again, and so on without end, the brokers being well
    from types import SimpleNamespace

    from aiokafka.producer.message_accumulator import (  # type: ignore[import-untyped]
        BatchBuilder,
    )
    from faust.transport.drivers import aiokafka as faust_aiokafka

    from streams.faust_app import BatchHandler, FaustSettings
    from streams.output import batch_bytes

    settings = FaustSettings.from_env(
        {
            "LIMITFLOW_BOOTSTRAP_SERVERS": "127.0.0.1:9092",
            "LIMITFLOW_RULES": RULES,
            "LIMITFLOW_REQUEST_TIMEOUT_MS": "300",
            "LIMITFLOW_MAX_MESSAGE_BYTES": "2000",  # one verdict per record batch
            "LIMITFLOW_RETRY_INITIAL_MS": "10",
        }
    )
    loop = asyncio.get_running_loop()
    sent: list[str] = []

    class Client:  # aiokafka's producer: each record batch acknowledged after 0.1 s
        async def partitions_for(self, topic: str) -> set[int]:
            return {0}

        def create_batch(self) -> Any:
            return BatchBuilder(batch_bytes(settings.max_message_bytes), 0, is_transactional=False)

        async def send_batch(self, builder: Any, topic: str, *, partition: int) -> Any:
            sent.append(topic)
            ack: asyncio.Future[None] = loop.create_future()
            loop.call_later(0.1, ack.set_result, None)
            return ack

    class Producer(faust_aiokafka.Producer):
        def __init__(self) -> None:
            pass

        def _ensure_producer(self) -> Any:
            return Client()

    acked: list[Any] = []

    async def ack(event: Any) -> bool:
        acked.append(event)
        return True

    def event(offset: int) -> Any:
        message = SimpleNamespace(topic="in", partition=0, offset=offset)
        return SimpleNamespace(message=message, value=_padded_payment(offset, 0))

    events = [event(n) for n in range(6)]  # 6 record batches: 0.6 s in all
    app: Any = SimpleNamespace(producer=Producer(), should_stop=False)
    stream: Any = SimpleNamespace(should_stop=False, ack=ack)
    handler = BatchHandler(app, Engine(Decider(load_rules(RULES)), MemoryStore()), settings)
    assert await asyncio.wait_for(handler.handle(stream, events), 5)
    assert sent == [settings.output_topic] * 6  # each verdict once, no retry
    assert acked == events


class _OneAtATimeCoordinator(_RestartedPastMarkers):
    """A coordinator that answers committed-offset requests one after another, 0.1 s
    each, as a broker answers the requests of one connection in turn."""

    def __init__(self) -> None:
        super().__init__()
        self.turn = asyncio.Lock()

    async def committed(self, tp: TopicPartition) -> int | None:
        async with self.turn:
            await asyncio.sleep(0.1)
        return 100


async def test_the_group_offsets_answered_in_time_are_kept_when_others_are_not() -> None:
    # all asked under one 0.5 s bound, every answer was dropped when the last came later:
    # eight partitions answered in turn, 0.1 s each, never got their group's offset, look
    # after look, and their markers stayed uncommitted for good
    partitions = {TopicPartition("in", n) for n in range(8)}
    consumer = _OneAtATimeCoordinator()
    consumer.assigned = set(partitions)
    runner = _runner(consumer, Engine(Decider(load_rules(RULES)), MemoryStore()))
    runner.output = output = _Recording()
    runner._owned = set(partitions)
    await runner._pass_skipped()
    assert 3 <= len(output.delivered) < len(partitions)
    assert all(runner._positions[tp] == 105 for tp in output.delivered)


class _OnePartitionRefused(_RestartedPastMarkers):
    """The coordinator refuses the committed offset of partition 0 alone."""

    async def committed(self, tp: TopicPartition) -> int | None:
        if tp.partition == 0:
            raise KafkaError("refused")
        return 100


async def test_a_group_offset_refused_loses_none_of_the_others() -> None:
    partitions = {TopicPartition("in", n) for n in range(3)}
    consumer = _OnePartitionRefused()
    consumer.assigned = set(partitions)
    runner = _runner(consumer, Engine(Decider(load_rules(RULES)), MemoryStore()))
    runner.output = output = _Recording()
    runner._owned = set(partitions)
    await runner._pass_skipped()
    assert sorted(output.delivered) == [TopicPartition("in", 1), TopicPartition("in", 2)]
