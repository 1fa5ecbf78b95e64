"""How ``streams.output`` hands verdicts to the producer: per-partition order under failure.

The producer here is a recorder around aiokafka's real ``BatchBuilder``; the broker side
is covered by tests/integration/test_kafka_run.py. What is checked is the one thing a
broker test only catches by luck: a partition's next record batch is queued only after
the previous one is acknowledged, and a failure is raised only once nothing else of the
attempt is still in flight. Also: a dead letter record fits the broker's message limit.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from aiokafka import errors as kafka_errors  # type: ignore[import-untyped]
from aiokafka.producer.message_accumulator import BatchBuilder  # type: ignore[import-untyped]

from streams.output import Message, send_all


class RecordingProducer:
    """``partitions_for``/``create_batch``/``send_batch``, acknowledged by the test."""

    def __init__(self, partitions: int = 2, batch_bytes: int = 600, codec: int = 0) -> None:
        self.partitions = set(range(partitions))
        self.batch_bytes = batch_bytes
        self.codec = codec
        self.built: list[int] = []
        """The size of each record batch sent, as a broker receives it."""
        self.queued: list[tuple[int, list[bytes], asyncio.Future[None]]] = []

    async def partitions_for(self, topic: str) -> set[int]:
        return self.partitions

    def create_batch(self) -> Any:
        return BatchBuilder(self.batch_bytes, self.codec, is_transactional=False)

    async def send_batch(self, builder: Any, topic: str, *, partition: int) -> Any:
        builder.close()
        built = bytes(builder._builder.build())  # compresses, once
        self.built.append(len(built))
        values = [r.value for r in _records(built)]
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.queued.append((partition, values, future))
        return future

    def pending(self) -> list[tuple[int, list[bytes], asyncio.Future[None]]]:
        return [q for q in self.queued if not q[2].done()]


def _records(built: bytes) -> list[Any]:
    from aiokafka.record.default_records import (  # type: ignore[import-untyped]
        DefaultRecordBatch,
    )

    return list(DefaultRecordBatch(built))


def verdicts(key: bytes, count: int) -> list[Message]:
    return [Message("v", key, b"%s-%03d" % (key, i) + b"." * 100, []) for i in range(count)]


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_next_batch_of_a_partition_waits_for_the_previous_ack() -> None:
    producer = RecordingProducer()
    batch = verdicts(b"acct-1", 12)  # ~120 bytes each: several record batches
    task = asyncio.create_task(send_all(producer, batch))
    sent: list[bytes] = []
    while not task.done():
        await settle()
        pending = producer.pending()
        assert len(pending) <= 1, "two batches of one partition queued at once"
        if pending:
            sent += pending[0][1]
            pending[0][2].set_result(None)
    await task
    assert len(producer.queued) > 1
    assert sent == [m.value for m in batch]


async def test_a_failure_is_raised_only_after_every_partition_settles() -> None:
    producer = RecordingProducer(partitions=8)
    keys = [b"acct-1", b"acct-2", b"acct-3", b"acct-4"]
    batch = [m for key in keys for m in verdicts(key, 2)]
    task = asyncio.create_task(send_all(producer, batch))
    await settle()
    first, *others = producer.pending()
    assert others, "the keys should spread over partitions"
    first[2].set_exception(kafka_errors.KafkaTimeoutError())
    await settle()
    assert not task.done(), "raised while other batches were still in flight"
    for _, _, future in others:
        future.set_result(None)
    while producer.pending():
        for _, _, future in producer.pending():
            future.set_result(None)
        await settle()
    with pytest.raises(kafka_errors.KafkaTimeoutError):
        await task
    # nothing queued after the failed batch on its partition
    assert [q for q in producer.queued if q[0] == first[0]][-1] is first


async def test_one_key_stays_on_one_partition_in_order() -> None:
    producer = RecordingProducer(partitions=4, batch_bytes=1 << 20)
    batch = [m for i in range(3) for key in (b"a", b"b", b"c") for m in verdicts(key, 1)[:1]]
    batch = [Message("v", m.key, m.value + bytes([i]), []) for i, m in enumerate(batch)]
    task = asyncio.create_task(send_all(producer, batch))
    await settle()
    for _, _, future in producer.pending():
        future.set_result(None)
    await task
    by_key: dict[bytes, set[int]] = {}
    for partition, values, _ in producer.queued:
        for value in values:
            by_key.setdefault(value[:1], set()).add(partition)
    assert all(len(parts) == 1 for parts in by_key.values())
    for partition, values, _ in producer.queued:
        expected = [m.value for m in batch if by_key[m.value[:1]] == {partition}]
        assert values == expected


@pytest.mark.parametrize("codec", ["none", "zstd"])
async def test_a_batch_of_verdicts_goes_out_in_one_record_batch_per_partition(codec: str) -> None:
    # with 256 KB batches a partition's share of a 2,000-event batch took two produce
    # round trips, one after the other; the batch must still fit the broker's limit
    from aiokafka.record.default_records import (
        DefaultRecordBatch,
    )

    from streams.output import batch_bytes

    limit = 1_000_000
    codes = {"none": 0, "zstd": DefaultRecordBatch.CODEC_ZSTD}
    producer = RecordingProducer(partitions=6, batch_bytes=batch_bytes(limit), codec=codes[codec])
    value = json.dumps({"limits": ["x" * 1_100]}).encode()  # about a verdict's size
    batch = [Message("v", b"acct-%d" % (i % 500), value, []) for i in range(2_000)]
    task = asyncio.create_task(send_all(producer, batch))
    while not task.done():
        await settle()
        for _, _, future in producer.pending():
            future.set_result(None)
    await task
    assert len(producer.queued) == len({p for p, _, _ in producer.queued}) == 6
    assert sum(len(values) for _, values, _ in producer.queued) == 2_000
    assert max(producer.built) <= limit


def test_a_dead_letter_record_fits_the_message_limit_with_its_key_and_headers() -> None:
    from handlers.decide import OutcomeKind
    from limitflow.settings import KafkaSettings
    from schemas.events import DeadLetterError
    from streams.engine import Record, Result
    from streams.output import messages

    settings = KafkaSettings("h:1", "in", "out", "dead", max_message_bytes=4_000)
    source: dict[str, str | int] = {"topic": "in", "partition": 0, "offset": 3}
    raw = b"{" + b"x" * 1_000
    result = Result(
        Record(raw, source),
        OutcomeKind.DEAD_LETTER,
        error=DeadLetterError.INVALID_JSON,
        detail="not valid JSON",
    )

    def size(m: Message) -> int:
        return len(m.key or b"") + len(m.value) + sum(len(n) + len(v) for n, v in m.headers)

    (whole,) = messages([result], settings, lambda _: b"k" * 100)
    assert json.loads(whole.value)["raw"] == raw.decode() and whole.key == b"k" * 100
    (keyed,) = messages([result], settings, lambda _: b"k" * 1_900)  # raw no longer fits
    assert json.loads(keyed.value)["raw"] is None and keyed.key == b"k" * 1_900
    assert size(keyed) <= 4_000
    (unkeyed,) = messages([result], settings, lambda _: b"k" * 2_500)  # over half the room
    assert unkeyed.key is None and size(unkeyed) <= 4_000


@pytest.mark.parametrize("field", ["type", "currency", "occurred_at"])
def test_a_value_a_detail_quotes_does_not_grow_the_dead_letter_past_the_limit(
    field: str,
) -> None:
    # the detail quoted the refused value whole, in Python's repr (U+0085 is \x85, four
    # characters): an 800 KB record made a 2 MB dead letter even without its raw bytes,
    # which the broker refused on every restart (with compression none), so that the
    # partition stopped there
    from handlers.decide import Decider
    from limitflow.settings import KafkaSettings
    from schemas.rules import parse_rules
    from stores.memory import MemoryStore
    from streams.engine import Engine, Record
    from streams.output import messages

    event = {
        "event_id": "e1",
        "account_id": "a",
        "amount": "1.00",
        "currency": "CNY",
        "occurred_at": "2026-01-01T00:00:00Z",
        field: "\x85" * 400_000,
    }
    raw = json.dumps(event, ensure_ascii=False).encode()
    engine = Engine(
        Decider(parse_rules("rules:\n  - {id: r, window: day, max_count: 1}\n")), MemoryStore()
    )
    (result,) = asyncio.run(
        engine.process([Record(raw, {"topic": "in", "partition": 0, "offset": 7})])
    )
    assert result.detail is not None and result.detail.startswith(f"{field}: ")
    limit = 1_000_000
    settings = KafkaSettings("h:1", "in", "out", "dead", max_message_bytes=limit)
    (letter,) = messages([result], settings, lambda _: b"a")
    assert len(letter.value) + sum(len(n) + len(v) for n, v in letter.headers) < limit
    published = json.loads(letter.value)
    assert published["raw"] == raw.decode()  # the detail cut short, the record kept
    assert published["detail"].startswith(f"{field}: ") and len(published["detail"]) <= 1_000
    # and a limit of a few kilobytes still takes the letter, its detail cut shorter
    small = KafkaSettings("h:1", "in", "out", "dead", max_message_bytes=2_000)
    (short,) = messages([result], small, lambda _: b"a")
    assert len(short.value) < 2_000 and json.loads(short.value)["error"] == "invalid_event"


def test_an_overlong_event_id_is_not_repeated_in_the_dead_letter() -> None:
    from handlers.decide import Decider
    from schemas.rules import parse_rules
    from stores.memory import MemoryStore
    from streams.engine import Engine, Record

    engine = Engine(
        Decider(parse_rules("rules:\n  - {id: r, window: day, max_count: 1}\n")), MemoryStore()
    )
    raw = json.dumps({"event_id": "e" * 129, "account_id": "a"}).encode()
    (result,) = asyncio.run(engine.process([Record(raw, {"line": 1})]))
    assert result.error is not None and result.event_id is None


class _Committed:
    """The consumer as ``TransactionalOutput`` asks it: the group's committed offset."""

    def __init__(self, offset: int | None) -> None:
        self.offset = offset
        self.seeks: list[int] = []

    async def committed(self, tp: Any) -> int | None:
        return self.offset

    def seek(self, tp: Any, offset: int) -> None:
        self.seeks.append(offset)


class _Transactions:
    """A transactional producer's calls, recorded."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    async def begin_transaction(self) -> None:
        self.calls.append("begin")

    async def send_offsets_to_transaction(self, offsets: Any, group_id: str) -> None:
        self.calls.append(f"offsets {sorted(offsets.values())}")

    async def commit_transaction(self) -> None:
        self.calls.append("commit")


@pytest.mark.parametrize(
    ("committed", "published"),
    [
        (None, [100, 101, 102, 103]),  # nothing committed yet: all of it
        (100, [100, 101, 102, 103]),
        (102, [102, 103]),  # the failed transaction did commit 100-101: not again
        (104, []),  # all of it committed: no new transaction
        (110, []),  # another member committed further: on from there (below)
    ],
)
async def test_after_a_failed_transaction_only_what_lies_past_the_committed_offset_goes_out(
    monkeypatch: pytest.MonkeyPatch, committed: int | None, published: list[int]
) -> None:
    # After a rewind, the batch that follows a failed transaction starts where that one
    # started and may reach further: whatever it committed must not be published again.
    from aiokafka import TopicPartition

    from streams import output

    tp = TopicPartition("in", 0)
    sent: list[int | None] = []

    async def recorded_send_all(producer: Any, batch: list[Message]) -> None:
        sent.extend(m.offset for m in batch)

    monkeypatch.setattr(output, "send_all", recorded_send_all)
    consumer = _Committed(committed)
    transactional = output.TransactionalOutput(
        lambda _: None,
        consumer,
        "g",
    )
    producer = _Transactions()
    transactional.producers[tp] = producer
    transactional._unsure.add(tp)
    batch = [Message("v", b"a", b"%d" % n, [], n) for n in range(100, 104)]
    await transactional._transact_once(tp, batch, 104)
    assert sent == published
    assert producer.calls == (["begin", "offsets [104]", "commit"] if published else [])
    assert tp not in transactional._unsure
    # Two members that both took the partition for theirs (one dropped from the group
    # without knowing it yet) fence each other's producer in turn. One that found the
    # other had committed past its batch went on from its own position, and published
    # those records' verdicts again (reproduced on noida: 84-658 of 20,000 twice).
    assert consumer.seeks == ([110] if committed == 110 else [])


class _FencedAtBegin(_Transactions):
    async def begin_transaction(self) -> None:
        from aiokafka.errors import ProducerFenced  # type: ignore[import-untyped]

        raise ProducerFenced()

    async def stop(self) -> None:
        return None


async def test_a_transaction_that_failed_before_it_began_checks_the_committed_offset_next() -> None:
    # The producer that fenced this one may have committed since: whatever the step that
    # failed, the next producer reads the committed offset before it publishes.
    from aiokafka import TopicPartition

    from limitflow.errors import PartitionLost
    from streams import output

    tp = TopicPartition("in", 0)
    transactional = output.TransactionalOutput(
        lambda _: None,
        _Committed(None),
        "g",
    )
    transactional.producers[tp] = _FencedAtBegin()
    batch = [Message("v", b"a", b"1", [], 1)]
    with pytest.raises(PartitionLost):
        await transactional._transact(tp, batch, 2)
    assert tp in transactional._unsure
    assert tp not in transactional.producers


class _Unanswered:
    """A consumer whose OffsetFetch never returns, as aiokafka's while the brokers are away."""

    async def committed(self, tp: Any) -> int | None:
        await asyncio.Event().wait()
        return None


class _Startable:
    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None


async def test_a_take_over_the_brokers_do_not_answer_is_an_outage_not_a_hang() -> None:
    # aiokafka retries InitProducerId and OffsetFetch without end while the brokers are
    # unreachable: the take-over of new partitions (exactly-once) hung quietly, with
    # /readyz saying "running", instead of being retried and shown as an outage
    from aiokafka import TopicPartition

    from limitflow.errors import BrokerUnavailable
    from streams.consumer import is_retriable
    from streams.output import TransactionalOutput

    transactional = TransactionalOutput(
        lambda _: _Startable(),
        _Unanswered(),
        "g",
        timeout=0.05,
    )
    with pytest.raises(BrokerUnavailable) as caught:
        await asyncio.wait_for(transactional.on_assigned(frozenset({TopicPartition("in", 0)})), 5)
    assert is_retriable(caught.value)


class _Refused:
    """A transactional producer the brokers refuse (tansu answers InitProducerId with
    UnknownError), ``delay`` seconds into its start; its start and stop recorded."""

    def __init__(self, delay: float, log: list[str]) -> None:
        self.delay, self.log = delay, log

    async def start(self) -> None:
        await asyncio.sleep(self.delay)
        self.log.append("refused")
        raise kafka_errors.UnknownError()

    async def stop(self) -> None:
        self.log.append("stopped")


async def test_a_take_over_the_brokers_refuse_waits_for_every_start_and_says_why() -> None:
    # asyncio.gather raised the first refusal and left the other partitions' starts
    # running: their refusals were never retrieved, and asyncio's shutdown logged each
    # with its traceback after `run`'s one-line reason (seen once in CI on tansu)
    from aiokafka import TopicPartition

    from limitflow.errors import BrokerRejected
    from streams.output import TransactionalOutput

    log: list[str] = []
    delays = {f"limitflow:g:in:{n}": n / 50 for n in range(4)}  # the first refused first
    transactional = TransactionalOutput(
        lambda tid: _Refused(delays[tid], log), _Committed(None), "g"
    )
    partitions = frozenset(TopicPartition("in", n) for n in range(4))
    with pytest.raises(BrokerRejected) as caught:
        await transactional.on_assigned(partitions)
    assert sorted(log) == ["refused"] * 4 + ["stopped"] * 4  # every start ended first
    assert "needs brokers that implement Kafka transactions" in str(caught.value)
    assert transactional.producers == {}


def test_no_two_groups_and_topics_share_a_transactional_id() -> None:
    # joined by "-", which group ids and topic names both hold: group pay-eu on topic
    # events and group pay on topic eu-events were one id, and two unrelated deployments
    # fenced each other batch after batch
    from aiokafka import TopicPartition

    from streams.output import TransactionalOutput

    def transactional_id(group: str, topic: str, partition: int = 0) -> str:
        output = TransactionalOutput(lambda _: _Startable(), _Unanswered(), group)
        return output.transactional_id(TopicPartition(topic, partition))

    assert transactional_id("pay-eu", "events") != transactional_id("pay", "eu-events")
    assert transactional_id("pay-eu-x", "y") != transactional_id("pay", "eu-x-y")
    assert transactional_id("pay-eu", "events", 3) == "limitflow:pay-eu:events:3"


def test_a_record_refused_as_too_large_names_the_setting_to_change() -> None:
    # "Kafka refused: MessageSizeTooLargeError()" on every restart, and nothing more
    from limitflow.errors import BrokerRejected
    from streams.output import translate

    refused = translate(kafka_errors.MessageSizeTooLargeError())
    assert isinstance(refused, BrokerRejected)
    assert "--max-message-bytes (LIMITFLOW_MAX_MESSAGE_BYTES)" in str(refused)
    assert "message.max.bytes" in str(refused)
