"""Publishing a decided batch and committing its offsets, under either guarantee.

Both strategies keep one invariant: an input offset is committed only after the verdict
or dead letter of every record before it is delivered (acks=all) and its state change
is in the store (``Engine.process`` returned). aiokafka errors are translated here into
``BrokerUnavailable`` (retriable), ``PartitionLost`` or ``BrokerRejected``.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple, Protocol

import msgspec
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition  # type: ignore[import-untyped]
from aiokafka import errors as kafka_errors
from aiokafka.partitioner import DefaultPartitioner  # type: ignore[import-untyped]

from handlers.decide import OutcomeKind
from limitflow.errors import BrokerRejected, BrokerUnavailable, PartitionLost
from schemas.verdicts import DeadLetter, dead_letter, encode_dead_letter
from streams.engine import Oversized, Result

log = logging.getLogger("limitflow.output")

_LOST = (
    kafka_errors.ProducerFenced,
    kafka_errors.CommitFailedError,
    kafka_errors.InvalidProducerEpoch,
    kafka_errors.IllegalStateError,
    kafka_errors.IllegalGenerationError,
    kafka_errors.UnknownMemberIdError,
    kafka_errors.RebalanceInProgressError,
)
_SEQUENCE_LOST = (kafka_errors.OutOfOrderSequenceNumber, kafka_errors.UnknownProducerId)
"""What a broker answers a transactional producer whose sequence numbers it no longer
knows for a partition (an output topic deleted and made again, its records deleted):
fatal to that producer (aiokafka's sender stops), not to a new one."""
_ID_LOST = (kafka_errors.InvalidProducerIdMapping,)
"""What the transaction coordinator answers a producer whose transactional id it no
longer knows (Apache Kafka forgets one it heard nothing of for
``transactional.id.expiration.ms``, 7 days by default: an input partition that long
quiet): fatal to that producer (aiokafka's sender stops, raising a bare ``KafkaError``
from it), not to a new one, whose ``InitProducerId`` maps the id again."""
_STOP_TIMEOUT = 10.0
# the producer's own default: murmur2 of the key like Java clients, random without a key
_partitioner = DefaultPartitioner()


def _python_partition(key: bytes, partitions: list[int]) -> int:
    return int(_partitioner(key, partitions, partitions))


try:  # the same murmur2 in C: ~0.1 µs a key instead of ~2.6 (4% of a backlog's drain)
    from streams._fastkafka import partition as _partition
except ImportError:  # built without a C compiler
    _partition = _python_partition


_RECORD_OVERHEAD = 1024
"""Bytes left for a record's framing within ``max_message_bytes`` (generous)."""


def batch_bytes(max_message_bytes: int) -> int:
    """The producer's ``max_batch_size`` for records of at most ``max_message_bytes``: a
    broker's limit on a record batch is its limit on a record (``message.max.bytes``), so
    a batch as large as that, less room for a compressed batch's framing (a codec may
    make data that does not compress a little larger).

    One batch then carries a whole output partition's share of a decided batch (~470 KB
    for 2,000 verdicts over 6 partitions), one produce round trip where 256 KB batches,
    sent one after another to keep the order, took two. With zstd (the default
    ``compression``) a `limitflow run` pipeline went from 19,740-20,274 to 22,185-22,293
    events/s in runs taken in turn (2026-11-25; README, Benchmarks). A record larger than
    this still goes, alone in its batch."""
    return max(max_message_bytes - _RECORD_OVERHEAD, 1)


def compression_type(compression: str) -> str | None:
    """The producer's ``compression_type`` for a ``compression`` setting: aiokafka takes
    None, not "none", for batches sent as they are."""
    return None if compression == "none" else compression


class Message(NamedTuple):
    """One record to publish."""

    topic: str
    key: bytes | None
    value: bytes
    headers: list[tuple[str, bytes]]
    offset: int | None = None
    """The offset of the input record it answers, when it answers one."""


class Destinations(Protocol):
    """Where verdicts and dead letters go (``KafkaSettings``, the faust app's settings)."""

    @property
    def output_topic(self) -> str: ...
    @property
    def dead_letter_topic(self) -> str: ...
    @property
    def max_message_bytes(self) -> int: ...


def messages(
    results: Sequence[Result], settings: Destinations, key_of: Callable[[Result], bytes | None]
) -> Iterator[Message]:
    """The verdict or dead letter of each result, in order.

    Verdicts are keyed by ``account_id`` (one account's verdicts share an output
    partition, in input order); an ``Oversized`` record's dead letter names it by size
    and SHA-256; dead letters keep the input record's key (unless it
    takes over half of ``max_message_bytes``), and fit within it with their key and
    headers (see ``encode_dead_letter``). Headers:
    ``event_id`` when known, and ``source`` = ``topic:partition:offset`` of the input.
    """
    for result in results:
        src = result.record.source
        headers = [("source", f"{src['topic']}:{src['partition']}:{src['offset']}".encode())]
        at = src["offset"]
        offset = at if isinstance(at, int) else None
        if result.event_id is not None:
            headers.insert(0, ("event_id", result.event_id.encode()))
        if result.kind is OutcomeKind.DEAD_LETTER:
            assert result.error is not None and result.detail is not None
            record = result.record
            letter = dead_letter(result.error, result.detail, record.raw, src, result.event_id)
            if isinstance(record, Oversized):  # by size and hash: its bytes were not kept
                letter = msgspec.structs.replace(
                    letter, raw=None, raw_size=record.size, raw_sha256=record.sha256
                )
            headers.append(("error", result.error.value.encode()))
            key, value = fitted_dead_letter(
                letter, result.record.raw, key_of(result), headers, settings.max_message_bytes
            )
            yield Message(settings.dead_letter_topic, key, value, headers, offset)
        else:
            assert result.verdict is not None and result.account_id is not None
            yield Message(
                settings.output_topic,
                result.account_id.encode(),
                result.verdict,
                headers,
                offset,
            )


def fitted_dead_letter(
    letter: DeadLetter,
    raw: bytes,
    key: bytes | None,
    headers: Sequence[tuple[str, bytes]],
    max_bytes: int,
) -> tuple[bytes | None, bytes]:
    """(key, value) of a dead letter record that fits in ``max_bytes`` with its headers.

    Without the raw record if need be (``encode_dead_letter``), and unkeyed if the input
    key alone takes over half the room: a broker refuses a larger record on every retry.
    """
    if key is not None and len(key) > max_bytes // 2:
        key = None
    room = max_bytes - _RECORD_OVERHEAD - len(key or b"")
    room -= sum(len(name) + len(data) for name, data in headers)
    return key, encode_dead_letter(letter, raw, room)


def translate(exc: BaseException) -> BaseException:
    """The limitflow error an aiokafka (or timeout) error stands for."""
    if isinstance(exc, _LOST):
        return PartitionLost(f"partition ownership lost: {exc!r}")
    if isinstance(exc, (TimeoutError, kafka_errors.KafkaTimeoutError)) or (
        isinstance(exc, kafka_errors.KafkaError) and exc.retriable
    ):
        return BrokerUnavailable(f"Kafka unavailable: {exc!r}")
    if isinstance(exc, kafka_errors.MessageSizeTooLargeError):
        # refused again on every retry: the batch is never committed
        return BrokerRejected(
            f"Kafka refused a record as too large ({exc!r}): --max-message-bytes"
            " (LIMITFLOW_MAX_MESSAGE_BYTES) must not exceed the brokers' message.max.bytes"
            " or the output topics' max.message.bytes"
        )
    if isinstance(exc, kafka_errors.InvalidSessionTimeoutError):
        # refused at every join: a consumer that cannot join its group decides nothing
        return BrokerRejected(
            "Kafka refused the group's session timeout, --session-timeout-ms"
            " (LIMITFLOW_SESSION_TIMEOUT_MS): it must lie within the brokers'"
            " group.min.session.timeout.ms and group.max.session.timeout.ms"
            " (Apache Kafka's defaults: 6000 and 1800000)"
        )
    if isinstance(exc, kafka_errors.KafkaError):
        return BrokerRejected(f"Kafka refused: {exc!r}")
    return exc


@contextlib.contextmanager
def kafka_errors_translated() -> Iterator[None]:
    """Re-raise aiokafka errors as their limitflow equivalents (``raise … from exc``)."""
    try:
        yield
    except (kafka_errors.KafkaError, TimeoutError) as exc:
        raise translate(exc) from exc


async def send_all(
    producer: AIOKafkaProducer, batch: Sequence[Message], *, per_request: float | None = None
) -> None:
    """Publish ``batch`` keeping each output partition's order, and wait for every ack.

    aiokafka keeps one record batch in flight per partition, but when one expires (no
    answer within the request timeout: a hung broker) it fails that batch and sends the
    next one queued for the partition. A later verdict would then land before an earlier
    one that the retry sends again. So each partition's messages go out as record batches
    one after another, the next queued only once the previous is acknowledged, and a
    failure is raised only after every partition has settled: when the caller retries,
    nothing of the failed attempt is still queued behind it.

    ``per_request``: the longest wait for a topic's partitions, and for each record batch to
    be queued and acknowledged (a ``TimeoutError`` past it); not for the whole of
    ``batch``, which may take several record batches per partition one after another,
    and longer than that as a whole, its brokers being well. None: aiokafka's own
    request timeout alone.
    """
    by_partition: dict[tuple[str, int], list[Message]] = {}
    partitions: dict[str, list[int]] = {}
    placed: dict[tuple[str, bytes], int] = {}  # one account's verdicts: hash its key once
    for m in batch:
        choices = partitions.get(m.topic)
        if choices is None:
            async with asyncio.timeout(per_request):
                choices = partitions[m.topic] = sorted(await producer.partitions_for(m.topic))
        if m.key is None:
            partition = _partitioner(None, choices, choices)
        elif (partition := placed.get((m.topic, m.key), -1)) < 0:
            partition = placed[m.topic, m.key] = _partition(m.key, choices)
        by_partition.setdefault((m.topic, partition), []).append(m)
    outcomes = await asyncio.gather(
        *(_send_in_order(producer, tp, ms, per_request) for tp, ms in by_partition.items()),
        return_exceptions=True,
    )
    for outcome in outcomes:
        if isinstance(outcome, BaseException):
            raise outcome


async def _send_in_order(
    producer: AIOKafkaProducer,
    tp: tuple[str, int],
    batch: Sequence[Message],
    per_request: float | None = None,
) -> None:
    topic, partition = tp
    sent = 0
    while sent < len(batch):
        builder = producer.create_batch()
        for m in batch[sent:]:  # the first always fits: a builder takes one of any size
            if builder.append(key=m.key, value=m.value, timestamp=None, headers=m.headers) is None:
                break
            sent += 1
        async with asyncio.timeout(per_request):
            ack = await producer.send_batch(builder, topic, partition=partition)
            # shielded from the timeout: the record batch's future is aiokafka's to settle
            await (ack if per_request is None else asyncio.shield(ack))


class Output(abc.ABC):
    """Delivers one decided batch and commits its offsets, all or (per partition) nothing."""

    commits_each_partition: bool = False
    """Whether ``deliver`` commits each partition's offset on its own (a transaction
    each), not all of them in one commit: ``limitflow_offset_commits_total`` counts each."""

    async def on_assigned(self, partitions: frozenset[TopicPartition]) -> None:  # noqa: B027
        """Called when partitions are assigned, before their records are fetched."""

    async def on_revoked(self, partitions: frozenset[TopicPartition]) -> None:  # noqa: B027
        """Called after the batch in hand is finished or abandoned, before they move."""

    @abc.abstractmethod
    async def deliver(
        self,
        batch: Mapping[TopicPartition, list[Message]],
        offsets: Mapping[TopicPartition, int],
        done: set[TopicPartition],
    ) -> None:
        """Publish ``batch`` then commit ``offsets`` (next offset to read, per partition).

        Adds each partition to ``done`` once its offset is committed, so a retry after a
        partial failure redoes only the rest.
        """

    async def close(self, within: float | None = None) -> None:  # noqa: B027
        """Flush and release the producers, each in ``_STOP_TIMEOUT`` s at most
        (``within``: at most that)."""


class AtLeastOnceOutput(Output):
    """One shared producer (acks=all); offsets committed by the consumer after delivery.

    A crash between delivery and commit publishes the same verdicts again on restart
    (identical bytes, from the idempotency records); nothing is ever lost.
    """

    def __init__(
        self, producer: AIOKafkaProducer, consumer: AIOKafkaConsumer, *, timeout: float = 30.0
    ) -> None:
        self.producer = producer
        self.consumer = consumer
        self.timeout = timeout
        """Longest wait for an offset commit (aiokafka retries one without end while the
        group coordinator is unreachable, which would hold a stop for the whole outage)."""

    async def deliver(
        self,
        batch: Mapping[TopicPartition, list[Message]],
        offsets: Mapping[TopicPartition, int],
        done: set[TopicPartition],
    ) -> None:
        todo = [tp for tp in batch if tp not in done]
        with kafka_errors_translated():
            await send_all(self.producer, [m for tp in todo for m in batch[tp]])
            # a commit that timed out may still land later, even after a later commit:
            # the offset then moves back, which only redelivers (the same verdicts)
            await asyncio.wait_for(
                self.consumer.commit({tp: offsets[tp] for tp in todo}), self.timeout
            )
        done.update(todo)

    async def close(self, within: float | None = None) -> None:
        await _stop_quietly(self.producer, within)


class TransactionalOutput(Output):
    """A transactional producer per input partition: verdicts and offset in one transaction.

    The ``transactional_id`` is fixed per (group, topic, partition), so the member that
    takes a partition over fences the previous owner's producer and aborts its open
    transaction (``InitProducerId``) before reading from the committed offset.
    """

    commits_each_partition = True

    def __init__(
        self,
        make_producer: Callable[[str], AIOKafkaProducer],
        consumer: AIOKafkaConsumer,
        group_id: str,
        *,
        timeout: float = 30.0,
    ) -> None:
        self.make_producer = make_producer
        self.consumer = consumer
        self.group_id = group_id
        self.timeout = timeout
        """Request timeout: a transaction (start, publish, offsets, commit) that takes
        twice as long counts as a broker outage; aiokafka would wait without end."""
        self.producers: dict[TopicPartition, AIOKafkaProducer] = {}
        self._unsure: set[TopicPartition] = set()
        """Partitions whose last transaction failed, perhaps after the coordinator had
        committed it: before publishing again, the committed offset says."""

    def transactional_id(self, tp: TopicPartition) -> str:
        """``limitflow:GROUP:TOPIC:PARTITION``. A topic name has no ``:``, so no other
        (group, topic) pair gives the same id: joined by ``-``, which both may hold,
        group ``pay-eu`` with topic ``events`` and group ``pay`` with ``eu-events`` had
        one id, and two unrelated deployments fenced each other batch after batch."""
        return f"limitflow:{self.group_id}:{tp.topic}:{tp.partition}"

    async def _producer(self, tp: TopicPartition) -> AIOKafkaProducer:
        producer = self.producers.get(tp)
        if producer is None:
            transactional_id = self.transactional_id(tp)
            producer = self.make_producer(transactional_id)
            try:
                await producer.start()
            except BaseException as exc:
                await _stop_quietly(producer)
                refused = translate(exc)
                lost = _replaceable(exc)
                if isinstance(refused, BrokerRejected) and lost is not None:
                    # a connection closed during its coordinator lookup (a broker
                    # restarting): aiokafka raised it as a bare KafkaError, which ended
                    # `run` saying the brokers had no transactions
                    raise BrokerUnavailable(
                        f"a transactional producer ({transactional_id}) did not start: {lost!r}"
                    ) from exc
                if isinstance(refused, BrokerRejected):
                    # what a broker without transactions answers to InitProducerId (tansu:
                    # UnknownError): say what it means, not only the error's name
                    raise BrokerRejected(
                        f"the brokers refused a transactional producer ({transactional_id}):"
                        " --guarantee exactly-once needs brokers that implement Kafka"
                        f" transactions; {refused}"
                    ) from exc
                raise
            self.producers[tp] = producer
        return producer

    async def on_assigned(self, partitions: frozenset[TopicPartition]) -> None:
        # aiokafka retries InitProducerId and OffsetFetch without end while the brokers
        # are unreachable: a deadline turns that into an outage, which the consumer logs,
        # shows on /readyz and retries, instead of a take-over that hangs quietly
        with kafka_errors_translated():
            await asyncio.wait_for(self._take_over(partitions), 2 * self.timeout)

    async def _take_over(self, partitions: frozenset[TopicPartition]) -> None:
        # Fence the previous owners first: their open transactions are aborted and
        # committing ones completed, so the committed offsets read next are final. Every
        # start is waited for, and the first failure raised: with gather's default, the
        # other starts' failures (brokers without transactions refuse them all) were
        # never retrieved, and asyncio's shutdown logged each with its traceback.
        started = await asyncio.gather(
            *(self._producer(tp) for tp in partitions), return_exceptions=True
        )
        for outcome in started:
            if isinstance(outcome, BaseException):
                raise outcome
        for tp in partitions:
            committed = await self.consumer.committed(tp)
            if committed is not None:
                self.consumer.seek(tp, committed)

    async def on_revoked(self, partitions: frozenset[TopicPartition]) -> None:
        self._unsure -= partitions  # the next owner starts from the committed offset
        await asyncio.gather(*(self._discard(tp) for tp in partitions))

    async def _discard(self, tp: TopicPartition, within: float | None = None) -> None:
        producer = self.producers.pop(tp, None)
        if producer is not None:
            await _stop_quietly(producer, within)

    async def deliver(
        self,
        batch: Mapping[TopicPartition, list[Message]],
        offsets: Mapping[TopicPartition, int],
        done: set[TopicPartition],
    ) -> None:
        todo = [tp for tp in batch if tp not in done]
        outcomes = await asyncio.gather(
            *(self._transact(tp, batch[tp], offsets[tp]) for tp in todo), return_exceptions=True
        )
        failures: list[BaseException] = []
        for tp, outcome in zip(todo, outcomes, strict=True):
            if outcome is None:
                done.add(tp)
            else:
                failures.append(outcome)
        # a lost partition outranks a retriable failure: retrying cannot bring it back
        for failure in failures:
            if not getattr(failure, "retriable", False):
                raise failure
        if failures:
            raise failures[0]

    async def _transact(self, tp: TopicPartition, batch: list[Message], offset: int) -> None:
        try:
            with kafka_errors_translated():
                # aiokafka retries a transactional producer's requests without end while
                # the brokers are unreachable: a deadline turns that into an outage
                await asyncio.wait_for(self._transact_once(tp, batch, offset), 2 * self.timeout)
        except BaseException as exc:
            # A fresh producer (same transactional_id) aborts whatever this one left open,
            # or completes its commit if that had reached the coordinator; and whoever
            # fenced this one may have committed since: the next transaction reads the
            # committed offset first, however this one failed.
            self._unsure.add(tp)
            # cancelled (a stop's grace ran out on an outage): the brokers are not
            # answering, and the stop is not to wait the whole close for them
            await self._discard(tp, 1.0 if isinstance(exc, asyncio.CancelledError) else None)
            replaceable = _replaceable(exc) if isinstance(exc, BrokerRejected) else None
            if isinstance(replaceable, _ID_LOST):
                # a partition quiet for longer than the brokers keep its transactional id:
                # its next event ended `run` with exit 4, for good
                raise BrokerUnavailable(
                    "the transaction coordinator no longer knows this producer's id (its"
                    " transactional id expired: transactional.id.expiration.ms?): retrying"
                    f" with a new one: {replaceable!r}"
                ) from replaceable
            if replaceable is not None:
                # a broker restarting while the producer looked its coordinator up
                raise BrokerUnavailable(
                    f"the producer stopped on {replaceable!r}: retrying with a new one"
                ) from replaceable
            if isinstance(exc.__cause__, _SEQUENCE_LOST):
                # the new producer the retry starts numbers from 0 again: an output topic
                # deleted and made again mid-run ended `run` with exit 4, for good, where
                # at-least-once waited for the topic and went on
                raise BrokerUnavailable(
                    "the brokers no longer know this producer's sequence numbers (an output"
                    f" topic deleted and made again?): retrying with a new one: {exc.__cause__!r}"
                ) from exc.__cause__
            raise

    async def _transact_once(self, tp: TopicPartition, batch: list[Message], offset: int) -> None:
        producer = await self._producer(tp)
        if tp in self._unsure:
            # the new producer has fenced the old one: its transaction is now either
            # committed or aborted, and a committed one moved the group's offset
            committed = await self.consumer.committed(tp)
            self._unsure.discard(tp)
            if committed is not None and committed >= offset:
                if committed > offset:
                    # another member (one that fenced this producer while both took the
                    # partition for theirs) published and committed further: read on
                    # from there, not from this member's own position, else its next
                    # transaction publishes those records' verdicts a second time
                    self.consumer.seek(tp, committed)
                return  # published and committed already: not again
            if committed is not None:
                # after a rewind the batch may start before what that transaction
                # committed (then extend past it): those records' verdicts are out
                batch = [m for m in batch if m.offset is None or m.offset >= committed]
        await producer.begin_transaction()
        self._unsure.add(tp)
        await send_all(producer, batch)
        await producer.send_offsets_to_transaction({tp: offset}, self.group_id)
        await producer.commit_transaction()
        self._unsure.discard(tp)

    async def close(self, within: float | None = None) -> None:
        await asyncio.gather(*(self._discard(tp, within) for tp in list(self.producers)))


def _replaceable(exc: BaseException) -> BaseException | None:
    """The error among ``exc``'s causes that stopped a transactional producer, and that a
    new one overcomes: the coordinator no longer knows its id (``_ID_LOST``), or a
    retriable one (a connection closed during a coordinator lookup) that aiokafka raised
    as a bare ``KafkaError`` from it, ending its sender or its start."""
    cause, seen = exc.__cause__, set[int]()
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, _ID_LOST) or (
            isinstance(cause, kafka_errors.KafkaError) and cause.retriable
        ):
            found: BaseException = cause
            return found
        seen.add(id(cause))
        cause = cause.__cause__
    return None


async def _stop_quietly(producer: AIOKafkaProducer, within: float | None = None) -> None:
    """Stop ``producer`` in ``_STOP_TIMEOUT`` s at most (``within``: at most that)."""
    bound = _STOP_TIMEOUT if within is None else min(_STOP_TIMEOUT, within)
    try:
        with contextlib.suppress(kafka_errors.KafkaError):
            await asyncio.wait_for(producer.stop(), bound)
        return
    except TimeoutError:
        pass
    # stop() waits for the batches in hand to be sent, and gave up on brokers that do not
    # answer (an outage in the middle of a transaction) after marking the producer closed:
    # its sender, its client's connections and metadata task lived on for good, a stop()
    # again doing nothing, two sockets and four tasks more after every such outage. Fail
    # those batches (no one waits for them: the transaction is abandoned), then end the
    # sender and the client.
    with contextlib.suppress(Exception):
        _fail_batches(producer._message_accumulator)
    sender = producer._sender
    with contextlib.suppress(Exception):
        if sender is not None:
            await asyncio.wait_for(sender.close(), 1.0)
    with contextlib.suppress(Exception):
        await asyncio.wait_for(producer.client.close(), 1.0)


def _fail_batches(accumulator: Any) -> None:
    """Fail the batches an aiokafka producer's ``accumulator`` holds, which ends the wait of
    its ``stop`` for them, and retrieve their failures: no one awaits them any more, and
    asyncio would log each at ERROR when it is collected."""
    batches = [b for held in accumulator._batches.values() for b in held]
    batches += list(accumulator._pending_batches)
    accumulator.fail_all(kafka_errors.KafkaConnectionError("producer stopped in an outage"))
    for batch in batches:
        futures = [batch.future, batch._drain_waiter, *(f for f, _ in batch._msg_futures)]
        for future in futures:
            if future.done() and not future.cancelled():
                future.exception()
