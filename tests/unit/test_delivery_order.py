"""Ordering guarantees of the delivery machinery that the existing suite leaves unchecked.

Fakes stand in for aiokafka's producer and consumer; each test drives the real
``AtLeastOnceOutput`` / ``TransactionalOutput`` / ``VelocityConsumer`` code and checks
the order of the calls it makes (a broker test only catches these by luck: a crash must
land between two awaits).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from aiokafka import TopicPartition  # type: ignore[import-untyped]
from aiokafka import errors as kafka_errors
from aiokafka.producer.message_accumulator import BatchBuilder  # type: ignore[import-untyped]

from handlers.decide import Decider
from limitflow.errors import BrokerUnavailable, PartitionLost, StoreUnavailable
from schemas.rules import load_rules
from stores.memory import MemoryStore
from streams import output as output_module
from streams.consumer import VelocityConsumer
from streams.engine import Engine
from streams.output import AtLeastOnceOutput, Message, Output, TransactionalOutput
from tests.unit.test_consumer import RULES
from tests.unit.test_consumer import _runner as consumer_runner

TP0, TP1 = TopicPartition("in", 0), TopicPartition("in", 1)


async def settle() -> None:
    for _ in range(10):
        await asyncio.sleep(0)


# -- at-least-once: the offset commit waits for every ack ---------------------------------


class _Producer:
    """``partitions_for``/``create_batch``/``send_batch``; acks given by the test."""

    def __init__(self, log: list[str]) -> None:
        self.log = log
        self.acks: list[asyncio.Future[None]] = []

    async def partitions_for(self, topic: str) -> set[int]:
        return {0, 1}

    def create_batch(self) -> Any:
        return BatchBuilder(1 << 20, 0, is_transactional=False)

    async def send_batch(self, builder: Any, topic: str, *, partition: int) -> Any:
        self.log.append(f"send {topic}")
        ack: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.acks.append(ack)
        return ack


class _GroupConsumer:
    def __init__(self, log: list[str]) -> None:
        self.log = log
        self.commits: list[dict[TopicPartition, int]] = []

    async def commit(self, offsets: dict[TopicPartition, int]) -> None:
        self.log.append("commit")
        self.commits.append(dict(offsets))


def _batch() -> dict[TopicPartition, list[Message]]:
    return {
        TP0: [Message("verdicts", b"a", b"v0", [], 10)],
        TP1: [Message("dead", None, b"d1", [], 20)],  # a dead letter
    }


async def _delivering() -> tuple[
    _Producer, _GroupConsumer, set[TopicPartition], asyncio.Task[None]
]:
    """``_batch()`` being delivered at least once, its records sent, none acknowledged:
    (producer, consumer, partitions done, the delivery)."""
    log: list[str] = []
    producer, consumer = _Producer(log), _GroupConsumer(log)
    out = AtLeastOnceOutput(producer, consumer, timeout=5)
    done: set[TopicPartition] = set()
    task = asyncio.create_task(out.deliver(_batch(), {TP0: 11, TP1: 21}, done))
    await settle()
    return producer, consumer, done, task


async def test_at_least_once_commits_offsets_only_once_every_publish_is_acknowledged() -> None:
    producer, consumer, done, task = await _delivering()
    assert producer.acks, "nothing was published"
    assert consumer.commits == [], "offsets committed before the verdicts were acknowledged"
    for ack in producer.acks[:-1]:
        ack.set_result(None)
    await settle()
    assert consumer.commits == [], "offsets committed before the dead letter was acknowledged"
    producer.acks[-1].set_result(None)
    await asyncio.wait_for(task, 5)
    assert consumer.commits == [{TP0: 11, TP1: 21}]
    assert done == {TP0, TP1}


async def test_at_least_once_a_failed_publish_commits_nothing_and_marks_nothing_done() -> None:
    producer, consumer, done, task = await _delivering()
    for ack in producer.acks:
        ack.set_exception(kafka_errors.KafkaTimeoutError())
    with pytest.raises(BrokerUnavailable):
        await asyncio.wait_for(task, 5)
    assert consumer.commits == []
    assert done == set(), "a retry would skip partitions whose verdicts never went out"


# -- exactly-once -------------------------------------------------------------------------


async def test_exactly_once_a_lost_partition_outranks_a_retriable_failure(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Retrying a partition this member no longer owns starts a fresh producer with its
    # transactional id, which fences the new owner's: the batch must be abandoned.
    async def transact(self: Any, tp: TopicPartition, batch: Any, offset: int) -> None:
        await asyncio.sleep(0)
        if tp == TP0:
            raise BrokerUnavailable("Kafka unavailable: timeout")
        raise PartitionLost("partition ownership lost: ProducerFenced")

    monkeypatch.setattr(TransactionalOutput, "_transact", transact)
    out = TransactionalOutput(lambda _: None, None, "g")
    done: set[TopicPartition] = set()
    with pytest.raises(PartitionLost):
        await out.deliver({TP0: [], TP1: []}, {TP0: 1, TP1: 1}, done)
    assert done == set()


class _TxnProducer:
    def __init__(self) -> None:
        self.started = False

    async def start(self) -> None:
        self.started = True

    async def stop(self) -> None:
        return None


class _Committed:
    def __init__(self, committed: dict[TopicPartition, int | None]) -> None:
        self.committed_offsets = committed
        self.seeks: dict[TopicPartition, int] = {}

    async def committed(self, tp: TopicPartition) -> int | None:
        return self.committed_offsets[tp]

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self.seeks[tp] = offset


async def test_exactly_once_take_over_reads_from_the_offsets_committed_after_fencing() -> None:
    # aiokafka may have set the positions from offsets read before the previous owner's
    # committing transaction completed: once fenced, the final committed offset is where
    # reading starts, or that transaction's records are published a second time.
    producers: dict[str, _TxnProducer] = {}

    def make(transactional_id: str) -> Any:
        producers[transactional_id] = _TxnProducer()
        return producers[transactional_id]

    consumer = _Committed({TP0: 42, TP1: None})
    out = TransactionalOutput(make, consumer, "g", timeout=5)
    await out.on_assigned(frozenset({TP0, TP1}))
    assert all(p.started for p in producers.values()) and len(producers) == 2
    assert consumer.seeks == {TP0: 42}


async def test_exactly_once_offsets_go_inside_the_transaction(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[str] = []

    class Producer:
        async def begin_transaction(self) -> None:
            calls.append("begin")

        async def send_offsets_to_transaction(self, offsets: Any, group_id: str) -> None:
            calls.append(f"offsets {dict(offsets)} {group_id}")

        async def commit_transaction(self) -> None:
            calls.append("commit")

    class Consumer:
        async def commit(self, offsets: Any) -> None:
            calls.append("consumer commit")

    async def sent(producer: Any, batch: Any) -> None:
        calls.append("send")

    monkeypatch.setattr(output_module, "send_all", sent)
    out = TransactionalOutput(lambda _: None, Consumer(), "g")
    out.producers[TP0] = Producer()
    done: set[TopicPartition] = set()
    await out.deliver({TP0: [Message("v", b"a", b"x", [], 4)]}, {TP0: 5}, done)
    assert calls == ["begin", "send", f"offsets { ({TP0: 5}) } g", "commit"]
    assert done == {TP0}


def _sequence_lost() -> BaseException:
    lost: BaseException = kafka_errors.OutOfOrderSequenceNumber()
    return lost


def _transactional_id_expired() -> BaseException:
    try:
        raise kafka_errors.InvalidProducerIdMapping()
    except kafka_errors.KafkaError as exc:  # as aiokafka's sender raises it
        try:
            raise kafka_errors.KafkaError("Unexpected error during batch delivery") from exc
        except kafka_errors.KafkaError as bare:
            found: BaseException = bare
            return found


@pytest.mark.parametrize(
    "error",
    [
        # An output topic deleted and made again mid-run: the new partition does not know
        # the producer's sequence numbers, and the broker answers OutOfOrderSequenceNumber,
        # fatal to that producer (aiokafka's sender stops) but not to a new one.
        _sequence_lost,
        # A partition quiet for longer than transactional.id.expiration.ms: the coordinator
        # answers the producer's next AddPartitionsToTxn with InvalidProducerIdMapping,
        # which stops aiokafka's sender (a bare KafkaError from it). A new producer maps
        # the id again.
        _transactional_id_expired,
    ],
)
async def test_exactly_once_a_producer_the_brokers_no_longer_know_is_replaced(
    monkeypatch: pytest.MonkeyPatch, error: Callable[[], BaseException]
) -> None:
    # each was taken for a refusal for good: `run` exited 4 where a new producer goes on
    made: list[Any] = []

    class Producer(_TxnProducer):
        async def begin_transaction(self) -> None:
            return None

        async def send_offsets_to_transaction(self, offsets: Any, group_id: str) -> None:
            return None

        async def commit_transaction(self) -> None:
            return None

    def make(transactional_id: str) -> Any:
        made.append(Producer())
        return made[-1]

    async def sent(producer: Any, batch: Any) -> None:
        if producer is made[0]:
            raise error()

    monkeypatch.setattr(output_module, "send_all", sent)
    out = TransactionalOutput(make, _Committed({TP0: 4}), "g", timeout=5)
    done: set[TopicPartition] = set()
    batch = {TP0: [Message("v", b"a", b"x", [], 4)]}
    with pytest.raises(BrokerUnavailable) as failed:
        await out.deliver(batch, {TP0: 5}, done)
    assert failed.value.retriable and done == set()
    await out.deliver(batch, {TP0: 5}, done)  # the consumer's retry: a new producer
    assert done == {TP0} and len(made) == 2


async def test_exactly_once_a_producer_start_cut_short_by_a_closed_connection_is_retried() -> None:
    # A FindCoordinator whose connection closed mid-request (a broker restarting): aiokafka
    # raises a bare KafkaError from the KafkaConnectionError, which was taken for brokers
    # without transactions, and `run` exited for good.
    made: list[Any] = []

    class Producer(_TxnProducer):
        async def start(self) -> None:
            if len(made) == 1:
                try:
                    raise kafka_errors.KafkaConnectionError("Connection closed")
                except kafka_errors.KafkaError as exc:  # as aiokafka's lookup raises it
                    raise kafka_errors.KafkaError(repr(exc)) from exc
            await super().start()

    def make(transactional_id: str) -> Any:
        made.append(Producer())
        return made[-1]

    out = TransactionalOutput(make, _Committed({TP0: 4}), "g", timeout=5)
    with pytest.raises(BrokerUnavailable) as failed:
        await out.on_assigned(frozenset({TP0}))
    assert failed.value.retriable
    await out.on_assigned(frozenset({TP0}))  # the consumer's retry: a new producer
    assert len(made) == 2 and made[1].started


# -- the consumer loop ----------------------------------------------------------------------


class _Rec:
    def __init__(self, tp: TopicPartition, offset: int) -> None:
        self.topic, self.partition, self.offset = tp.topic, tp.partition, offset
        self.key = b"a"
        self.value = (
            b'{"event_id": "e-%d-%d", "account_id": "a", "amount": "1.00", "currency": "CNY",'
            b' "occurred_at": "2026-03-01T00:00:00Z"}' % (tp.partition, offset)
        )


class _StrayConsumer:
    """aiokafka's consumer as the retry wait sees it: ``getmany`` hands out records of
    a paused partition once (prefetched before the pause)."""

    def __init__(self) -> None:
        self.assigned = {TP0}
        self.held: set[TopicPartition] = set()
        """The partitions paused (aiokafka's ``paused()``)."""
        self.seeks: list[tuple[TopicPartition, int]] = []
        self.stray = {TP0: [_Rec(TP0, 3), _Rec(TP0, 4)]}

    def assignment(self) -> set[TopicPartition]:
        return self.assigned

    def pause(self, *tps: TopicPartition) -> None:
        self.held.update(tps)

    def resume(self, *tps: TopicPartition) -> None:
        self.held.difference_update(tps)

    def paused(self) -> set[TopicPartition]:
        return set(self.held)

    async def getmany(self, timeout_ms: int = 0, max_records: int | None = None) -> Any:
        stray, self.stray = self.stray, {}
        return stray

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self.seeks.append((tp, offset))

    def highwater(self, tp: TopicPartition) -> int | None:
        return None

    async def end_offsets(self, tps: Any) -> dict[TopicPartition, int]:
        return {tp: 5 for tp in tps}


class _FlakyStore(MemoryStore):
    def __init__(self) -> None:
        super().__init__()
        self.fail = 1

    async def load(self, keys: Any) -> Any:
        if self.fail:
            self.fail -= 1
            raise StoreUnavailable("test outage")
        return await super().load(keys)


class _Delivered(Output):
    def __init__(self) -> None:
        self.offsets: list[dict[TopicPartition, int]] = []

    async def deliver(self, batch: Any, offsets: Any, done: set[TopicPartition]) -> None:
        self.offsets.append(dict(offsets))
        done.update(batch)


def _runner(consumer: Any, store: Any, out: Output) -> VelocityConsumer:
    """test_consumer's, on ``store``, retrying within 100 ms."""
    engine = Engine(Decider(load_rules(RULES)), store)
    return consumer_runner(consumer, engine, out, retry_initial_ms=50, retry_max_ms=100)


async def test_records_fetched_while_a_batch_waits_on_an_outage_are_put_back() -> None:
    # The retry wait polls (to keep the group membership); records it is handed for a
    # paused partition are not in any batch: dropped, they would be skipped, and the next
    # batch's commit would cover them with no verdict ever published.
    consumer = _StrayConsumer()
    out = _Delivered()
    runner = _runner(consumer, _FlakyStore(), out)
    runner._owned = {TP0}
    async with runner._batch_lock:
        await asyncio.wait_for(
            runner._handle({TP0: [_Rec(TP0, 0), _Rec(TP0, 1), _Rec(TP0, 2)]}), 10
        )
    assert consumer.stray == {}, "the retry wait never polled: nothing was tested"
    assert (TP0, 3) in consumer.seeks, "stray records of a paused partition were dropped"
    assert out.offsets == [{TP0: 3}]
    assert consumer.held == set()  # resumed after the outage


class _LosesTP1Once(Output):
    """Exactly-once's outcome once another member has taken TP1 over: TP0's transaction
    committed, TP1's producer fenced. Every later delivery goes through."""

    def __init__(self) -> None:
        self.calls = 0

    async def deliver(self, batch: Any, offsets: Any, done: set[TopicPartition]) -> None:
        self.calls += 1
        if self.calls == 1:
            done.add(TP0)
            raise PartitionLost("TP1: fenced by another member")
        done.update(batch)


async def test_a_partition_lost_to_another_member_stays_paused_through_a_later_retry() -> None:
    # ``_rejoin`` pauses a lost partition until the group's next assignment. A later
    # batch's retry (one store outage) paused every partition and then resumed them all,
    # the lost one too: read and decided again, fencing its new owner batch after batch.
    consumer = _StrayConsumer()
    consumer.stray = {}
    consumer.assigned = {TP0, TP1}
    store = _FlakyStore()
    store.fail = 0
    runner = _runner(consumer, store, _LosesTP1Once())
    runner._owned = {TP0, TP1}
    async with runner._batch_lock:
        await runner._handle({TP0: [_Rec(TP0, 0)], TP1: [_Rec(TP1, 0)]})
    assert consumer.held == {TP1}
    store.fail = 1  # the next batch meets an outage before the group assigns again
    async with runner._batch_lock:
        await asyncio.wait_for(runner._handle({TP0: [_Rec(TP0, 1)]}), 10)
    assert store.fail == 0, "no retry: nothing was tested"
    assert consumer.held == {TP1}


# -- a revocation waits for the batch in hand ----------------------------------------------


class _Blocking(Output):
    """Delivers once ``release`` is set; records when the revocation reached it."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.log: list[str] = []

    async def deliver(self, batch: Any, offsets: Any, done: set[TopicPartition]) -> None:
        self.log.append("deliver started")
        await self.release.wait()
        self.log.append("delivered")
        done.update(batch)

    async def on_revoked(self, partitions: frozenset[TopicPartition]) -> None:
        self.log.append("revoked")


async def test_a_revocation_waits_for_the_batch_in_hand_to_be_committed() -> None:
    # on_revoked hands the partitions on (under exactly-once it stops their producers);
    # before the batch in hand is committed, the next owner would read from the old
    # committed offset while this member still publishes, or its transaction be cut.
    consumer = _StrayConsumer()
    consumer.stray = {}
    out = _Blocking()
    runner = _runner(consumer, MemoryStore(), out)
    runner._owned = {TP0}

    async def one_batch() -> None:
        async with runner._batch_lock:  # as run() holds it around _handle
            await runner._handle({TP0: [_Rec(TP0, 0)]})

    batch = asyncio.create_task(one_batch())
    while "deliver started" not in out.log:
        await asyncio.sleep(0.01)
    revoking = asyncio.create_task(runner.partitions_revoked(frozenset({TP0})))
    await asyncio.sleep(0.1)
    assert not revoking.done() and "revoked" not in out.log, "revoked under a batch in flight"
    out.release.set()
    await asyncio.wait_for(asyncio.gather(batch, revoking), 5)
    assert out.log == ["deliver started", "delivered", "revoked"]
    assert runner._owned == set()


class _RevokedWhileAsked(_StrayConsumer):
    """``position`` answered while the group rebalances: TP0 goes to another member."""

    runner: VelocityConsumer | None = None

    async def position(self, tp: TopicPartition) -> int:
        self.assigned = set()
        assert self.runner is not None
        await self.runner.partitions_revoked(frozenset({tp}))
        return 7


async def test_skipped_records_are_not_committed_for_a_partition_revoked_meanwhile() -> None:
    # While no records come, ``run`` commits positions moved past transaction markers. A
    # rebalance that revoked the partition while its position was asked for went
    # unnoticed: the commit went ahead, and under exactly-once it took the partition back
    # with a new transactional producer, fencing its new owner.
    consumer = _RevokedWhileAsked()
    consumer.stray = {}
    out = _Delivered()
    runner = _runner(consumer, MemoryStore(), out)
    consumer.runner = runner
    runner._owned = {TP0}
    runner._positions[TP0] = 5  # a batch committed up to 5; the position is past it, at 7
    await asyncio.wait_for(runner._pass_skipped(), 5)
    assert TP0 not in runner._owned, "the revocation did not run: nothing was tested"
    assert out.offsets == []


# -- the engine: a conflict after a committed unit -----------------------------------------


class _SplitStore(MemoryStore):
    """A store that commits at most a few records at once (as DynamoDB, MongoDB do), and
    whose second commit loses a race to another writer once."""

    max_records_per_commit = 8

    def __init__(self) -> None:
        super().__init__()
        self.commits = 0

    async def commit(self, writes: Any) -> None:
        from limitflow.errors import ConflictError

        self.commits += 1
        if self.commits == 2:
            raise ConflictError("test: another writer won")
        await super().commit(writes)


async def test_a_conflict_redecides_only_the_units_not_yet_committed() -> None:
    # what the first unit committed stays committed; deciding it again would report
    # first deliveries as duplicates (and count duplicate verdicts in the metrics)
    from handlers.decide import OutcomeKind
    from streams.engine import Record

    store = _SplitStore()
    engine = Engine(Decider(load_rules(RULES)), store)
    records = [
        Record(
            _Rec(TopicPartition("in", 0), n).value.replace(b'"a"', b'"acct-%d"' % (n % 3)),
            {"topic": "in", "partition": 0, "offset": n},
        )
        for n in range(12)
    ]
    results = await engine.process(records)
    assert store.commits >= 3, "no conflict after a committed unit: nothing was tested"
    assert engine.stats.conflicts == 1
    assert [r.kind for r in results].count(OutcomeKind.DUPLICATE) == 0, [r.kind for r in results]
    # delivered again: every one a duplicate now, with the identical verdict
    again = await engine.process(records)
    assert all(r.kind is OutcomeKind.DUPLICATE for r in again)
    assert [r.verdict for r in again] == [r.verdict for r in results]
