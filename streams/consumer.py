"""``limitflow run``: events from Kafka in, verdicts out, batch by batch, never early.

One batch at a time: ``getmany`` → ``Engine.process`` (every state change committed to
the store) → publish the verdicts and dead letters and wait for acks → commit offsets
(with ``--guarantee exactly-once``: publish and commit in one transaction per input
partition). An offset is never committed before its verdict and state change are
durable, so a crash, a rebalance or a replay only ever redelivers records; the engine's
idempotency records turn them into the identical verdicts without counting twice.

A retriable failure (``exc.retriable``: store or brokers down, slow or refusing) pauses
the assigned partitions and retries the failed stage with exponential backoff until it
succeeds. A rebalance waits for the batch in hand; if that batch is stuck waiting on an
outage it is abandoned instead: not committed, so the next owner gets it again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from operator import attrgetter
from typing import Any, Final, TypeVar

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition  # type: ignore[import-untyped]
from aiokafka.errors import IllegalStateError, KafkaError  # type: ignore[import-untyped]
from aiokafka.structs import ConsumerRecord  # type: ignore[import-untyped]

from handlers.decide import OutcomeKind
from limitflow.errors import LimitflowError, PartitionLost
from limitflow.settings import RunSettings
from streams.engine import Engine, Record, Result, oversized, process_within
from streams.ops import ConsumerState, Health, Metrics, OffsetResets
from streams.output import Message, Output, messages, translate

log = logging.getLogger("limitflow.consumer")
_LABELS: Final = attrgetter("kind", "error", "decision", "reason")
"""What a result's metrics are labelled by."""

_T = TypeVar("_T")
Batch = Mapping[TopicPartition, list[ConsumerRecord[bytes, bytes]]]


_LAG_EVERY = 2.0
"""Seconds between the lag updates made while a batch waits on an outage."""
_PROBE_EVERY = 2.0
"""Seconds without records after which an idle consumer asks whether the brokers answer."""
_SKIPPED_EVERY = 2.0
"""Seconds between the looks of an idle consumer for offsets to commit past transaction
markers (``_pass_skipped``): not on every empty poll, which at a low rate of events is
most polls."""
_SLOW_AFTER = 5.0
"""Seconds a stage of a batch may go unanswered (the store's commit, the verdicts' acks,
the offsets' commit) before ``/readyz`` says that it waits on it. A healthy batch takes
well under a second; a stage fails, and is retried, only after the request timeout."""
_WATCH_EVERY = 0.5
"""Seconds between the looks at a stage in flight: is it slow, has the stop grace run out."""


_PROBED: Final = frozenset({ConsumerState.RUNNING, ConsumerState.WAITING})
"""States in which an idle consumer probes the brokers (not while joining or stopping)."""


class BatchAbandoned(Exception):
    """The batch in hand is dropped uncommitted (rebalance or stop during an outage)."""


def is_retriable(exc: BaseException) -> bool:
    """Whether trying the same step again may succeed: by type, never by message."""
    return isinstance(exc, LimitflowError) and exc.retriable


_JOIN_AGAIN_AFTER: Final = (1.0, 30.0)
"""Seconds before a member whose join brought an empty assignment joins again: the
first time, and at most (doubled while its joins keep bringing one)."""


def tolerate_empty_assignments(
    consumer: AIOKafkaConsumer, join_again_after: tuple[float, float] = _JOIN_AGAIN_AFTER
) -> None:
    """Treat a group join whose assignment is zero bytes as a failed join, to be tried
    again after a pause, before ``consumer`` joins its group (it must be started, not
    subscribed yet).

    Apache Kafka's classic coordinator sends a member empty bytes when the leader's
    SyncGroup left it out (a member it did not know of when it assigned); noida-db sent
    them once in a chaos test. aiokafka 0.14 fails to decode them, and its coordination
    task, then ``getmany``, raise: ``run`` exited 1 (the faust worker stayed up in no
    group). Read as no partitions, as other clients do, the member stayed idle though
    ready for as long as the group did not change, and a share a broker dropped had no
    owner. So the join is not completed: the member keeps no partitions (aiokafka
    returns no records while a reassignment is in progress), and joins again
    ``join_again_after[0]`` seconds later, doubled up to ``join_again_after[1]`` while
    its joins keep bringing none; the group's next assignment includes it."""
    coordinator: Any = getattr(consumer, "_coordinator", _NOT_AIOKAFKA)  # aiokafka's own
    if coordinator is _NOT_AIOKAFKA:  # a stand-in for aiokafka's consumer (tests)
        return
    if coordinator is None:
        raise RuntimeError("tolerate_empty_assignments: start the consumer first")
    on_join_complete = coordinator._on_join_complete
    do_rejoin_group = coordinator._do_rejoin_group
    empty = False
    pause = join_again_after[0]

    async def complete_unless_empty(
        generation: int, member_id: str, protocol: str, assignment: bytes
    ) -> None:
        nonlocal empty
        if assignment:
            await on_join_complete(generation, member_id, protocol, assignment)
        else:
            empty = True

    async def join_until_assigned(subscription: object) -> bool:
        nonlocal empty, pause
        empty = False
        joined = bool(await do_rejoin_group(subscription))
        if not (joined and empty):
            pause = join_again_after[0] if joined else pause
            return joined
        log.warning(
            "the group coordinator sent no assignment: joining the group again in %.0fs",
            pause,
        )
        # (a close waits for the coordination task, this pause included: it ends it)
        await asyncio.wait([coordinator._closing], timeout=pause)
        pause = min(pause * 2, join_again_after[1])
        coordinator.request_rejoin()  # a later rebalance: the old assignment is not kept
        return False

    coordinator._on_join_complete = complete_unless_empty
    coordinator._do_rejoin_group = join_until_assigned


_NOT_AIOKAFKA: Final = object()


class _Listener(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, owner: VelocityConsumer) -> None:
        self.owner = owner

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        await self.owner.partitions_revoked(frozenset(revoked))

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        await self.owner.partitions_assigned(frozenset(assigned))


class VelocityConsumer:
    """Runs the consume → decide → publish → commit loop until asked to stop."""

    def __init__(
        self,
        settings: RunSettings,
        engine: Engine,
        consumer: AIOKafkaConsumer,
        output: Output,
        health: Health,
        metrics: Metrics,
    ) -> None:
        self.settings = settings
        self.engine = engine
        self.consumer = consumer
        self.output = output
        self.health = health
        self.metrics = metrics
        self._batch_lock = asyncio.Lock()
        self._interrupt = asyncio.Event()
        """Set to wake a retry wait: a rebalance started or a stop was asked for."""
        self._wake = asyncio.Event()
        """Set, for good, to end the poll in hand: a stop was asked for or a rebalance
        callback failed (``_poll``)."""
        self._revoking = False
        self._stop_requested_at: float | None = None
        self._positions: dict[TopicPartition, int] = {}
        self._owned: set[TopicPartition] = set()
        """Partitions between their ``partitions_assigned`` (taken over) and their
        ``partitions_revoked``: the only ones whose records are decided."""
        self._lag_asked = 0.0
        self._skipped_looked = 0.0
        self._fed: set[TopicPartition] = set()
        """Partitions records came from since ``_pass_skipped`` last looked."""
        self._failure: BaseException | None = None
        """A non-retriable error met in a rebalance callback, for ``run`` to raise."""
        self._round_trips = engine.store.round_trips
        self._expired = engine.store.expired_deleted
        self._conflicts = engine.stats.conflicts
        self._heard_at = time.monotonic()
        """When the brokers last answered: a batch arrived, or an idle probe succeeded."""
        self._brokers_lost_at: float | None = None
        self.gave_up = False
        """Whether a stop's grace ran out with a batch waiting on an outage: the Kafka
        clients then close in haste (nothing they hold is needed: the batch comes again)."""

    # -- life cycle ---------------------------------------------------------------

    def subscribe(self) -> None:
        tolerate_empty_assignments(self.consumer)
        self.consumer.subscribe([self.settings.kafka.input_topic], listener=_Listener(self))

    def request_stop(self, *, now: bool = False) -> None:
        """Stop after the batch in hand (``now``: abandon it if it is waiting on an outage)."""
        if self._stop_requested_at is None:
            log.info("stop requested: finishing the batch in hand")
            self._stop_requested_at = time.monotonic()
            self.health.set(ConsumerState.STOPPING)
        if now:
            self._stop_requested_at = -float("inf")
        self._interrupt.set()
        self._wake.set()

    @property
    def stopping(self) -> bool:
        return self._stop_requested_at is not None

    def grace_left(self, now: float) -> float | None:
        """Seconds left of a stop's grace (``--shutdown-grace-ms``) at ``now``: none left
        (<= 0) once it is over or a second stop was asked for; None without a stop."""
        if self._stop_requested_at is None:
            return None
        return self.settings.shutdown_grace_ms / 1000 - (now - self._stop_requested_at)

    async def run(self) -> None:
        """Consume until ``request_stop``; raises a non-retriable error it cannot handle.

        Ready (RUNNING) once the group has given this member its partitions (maybe none,
        when the group has more members than partitions), not before it has joined."""
        try:
            with OffsetResets(self.metrics.offset_resets).installed():
                await self._consume()
        except BaseException:
            self.health.set(ConsumerState.FAILED)
            raise
        self.health.set(ConsumerState.STOPPED)
        log.info("stopped")

    async def _consume(self) -> None:
        timeout = self.settings.poll_timeout_ms
        while not self.stopping:
            self._raise_failure()
            batch = await self._poll(timeout)
            if batch is None:  # a stop, or a failure, came first
                continue
            if batch:
                self._brokers_answered()
                async with self._batch_lock:
                    # a poll that waited while the group rebalanced may return records
                    # of partitions revoked meanwhile: another member's now. Deciding
                    # them took them back for a batch (under exactly-once, fencing the
                    # new owner's producer), and the lag metric of a partition no
                    # longer assigned then crashed `run` (aiokafka's assertion)
                    owned = {tp: recs for tp, recs in batch.items() if tp in self._owned}
                    if owned:
                        await self._handle(owned)
                self._fed.update(batch)
                await self._pass_skipped(quiet_only=True)
            else:
                await self._probe_brokers()
                await self._pass_skipped()
            await self._update_lag()

    async def _pass_skipped(self, *, quiet_only: bool = False) -> None:
        """While no records come, commit the positions the consumer has moved past
        records it never returned: the markers that end transactions (and the records of
        aborted ones), which a ``read_committed`` consumer skips. A batch commits the
        offset after its last record; with input written in transactions the marker
        after it stayed uncommitted, and the lag (limitflow's and that of every tool
        reading the group's offsets) stayed at 1 a partition for good.

        ``quiet_only`` (records came): only the partitions no records came from since
        the last look. Looked at only when no poll brought anything, a partition gone
        quiet kept its marker uncommitted for as long as another one had traffic (a few
        events a second kept every poll from coming back empty); a busy partition's next
        batch commits past its markers anyway."""
        now = time.monotonic()
        if self.stopping or self._revoking or now - self._skipped_looked < _SKIPPED_EVERY:
            return
        self._skipped_looked = now
        fed, self._fed = self._fed, set()
        ahead: dict[TopicPartition, int] = {}
        looked = [
            tp for tp in self._owned if self._still_reading(tp) and not (quiet_only and tp in fed)
        ]
        # no batch yet since they were assigned: the group's offset, which the consumer may
        # have moved past too (the marker after a restart's last batch, a partition whose
        # input was all aborted) and which, taken for where it reads, stayed behind for good
        await self._group_offsets([tp for tp in looked if tp not in self._positions])
        for tp in looked:
            committed = self._positions.get(tp)
            if committed is None:  # the coordinator did not answer at once: next look
                continue
            with contextlib.suppress(IllegalStateError, TimeoutError):
                # known at once for a partition being read (bounded all the same)
                position = await asyncio.wait_for(self.consumer.position(tp), 0.5)
                if position > committed:
                    ahead[tp] = position
        if not ahead:
            return
        done: set[TopicPartition] = set()
        async with self._batch_lock:
            # looking took turns of the event loop: a rebalance may have revoked some of
            # them meanwhile (committing one then, under exactly-once, took it back with a
            # new transactional producer, fencing its new owner), or ``_rejoin`` paused them
            ahead = {tp: offset for tp, offset in ahead.items() if self._still_reading(tp)}
            if not ahead:
                return
            try:
                # as a batch of no records: under exactly-once, a transaction of the
                # offsets alone, with all that a batch's has (fencing, unsure partitions)
                await self._retrying(
                    "publish", lambda: self.output.deliver({tp: [] for tp in ahead}, ahead, done)
                )
            except (BatchAbandoned, PartitionLost) as exc:
                if isinstance(exc, PartitionLost):
                    self._rejoin({tp for tp in ahead if tp not in done})
        for tp in done:  # every one of them, when ``deliver`` returned
            self._positions[tp] = max(self._positions.get(tp, 0), ahead[tp])
        self._count_commits(done)
        if done:
            log.debug(
                "offsets moved past transaction markers",
                extra={"offsets": _offsets({tp: ahead[tp] for tp in done})},
            )

    async def _group_offsets(self, partitions: list[TopicPartition]) -> None:
        """Keep the group's committed offset of each of ``partitions`` (0 if it has none)
        in ``_positions`` while it is read; those the coordinator does not answer within
        0.5 s are asked again at the next look. Asked all at once: one after another, a
        slow coordinator held the consume loop 0.5 s a partition."""
        if not partitions:
            return
        # each answer on its own: under one gather, one refusal, or one answer later
        # than the bound (a broker answers a connection's requests in turn), lost them all
        asking = {asyncio.ensure_future(self.consumer.committed(tp)): tp for tp in partitions}
        try:
            await asyncio.wait(asking, timeout=0.5)
        finally:
            for task in asking:
                task.cancel()
            await asyncio.gather(*asking, return_exceptions=True)
        for task, tp in asking.items():
            if task.cancelled() or isinstance(task.exception(), KafkaError | TimeoutError):
                continue
            committed = task.result()
            if self._still_reading(tp):  # not revoked (or paused) meanwhile
                self._positions.setdefault(tp, committed or 0)

    async def _poll(self, wait_ms: int) -> Batch | None:
        """``getmany``, or None as soon as a stop is asked for or a rebalance callback
        fails. While the group rebalances, aiokafka's ``getmany`` waits for the new
        assignment whatever its timeout, for as long as the join takes (for ever, if
        the brokers went away meanwhile): a SIGTERM then went unheeded. Nothing taken is
        lost by giving up the wait: offsets are only committed after their batch."""
        fetch = asyncio.ensure_future(
            self.consumer.getmany(timeout_ms=wait_ms, max_records=self.settings.batch_size)
        )
        woken = asyncio.ensure_future(self._wake.wait())
        try:
            await asyncio.wait((fetch, woken), return_when=asyncio.FIRST_COMPLETED)
        finally:
            woken.cancel()
        if fetch.done():
            try:
                batch: Batch = fetch.result()
            except KafkaError as exc:
                if exc.retriable:
                    raise
                # a join the group refused for good (a session timeout outside the brokers'
                # bounds): a traceback, exit 1, where it is one line and exit 4
                raise translate(exc) from exc
            return batch
        fetch.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await fetch
        return None

    def _still_reading(self, tp: TopicPartition) -> bool:
        """``tp`` is this member's and being read: not revoked, and not paused (held in
        an outage, or no longer this member's: ``_rejoin``)."""
        return (
            tp in self._owned
            and tp in self.consumer.assignment()
            and tp not in self.consumer.paused()
        )

    def _raise_failure(self) -> None:
        if self._failure is not None:
            failure, self._failure = self._failure, None
            raise failure

    # -- rebalancing ----------------------------------------------------------------

    async def partitions_revoked(self, revoked: frozenset[TopicPartition]) -> None:
        """Let the batch in hand finish (or, if stuck on an outage, be abandoned)."""
        # not ready until the group assigns again (a join that never completes showed
        # ready, with the partitions it had lost)
        self.health.set_rebalancing(True)
        self.health.assigned -= frozenset(_names(revoked))
        self._revoking = True
        if self.health.state is ConsumerState.WAITING:
            self._interrupt.set()
        try:
            async with self._batch_lock:
                self._owned -= revoked
                await self.output.on_revoked(revoked)
        finally:
            self._revoking = False
            if not self.stopping:
                self._interrupt.clear()
        for tp in revoked:
            self._positions.pop(tp, None)
            with contextlib.suppress(KeyError):
                self.metrics.lag.remove(str(tp.partition))
        if revoked:
            log.info("partitions revoked", extra={"partitions": _names(revoked)})
        else:  # aiokafka calls this before every join, the first one included
            log.info("joining the group", extra={"group_id": self.settings.group_id})

    async def partitions_assigned(self, assigned: frozenset[TopicPartition]) -> None:
        self.health.assigned = frozenset(_names(assigned))
        self.health.set_rebalancing(False)
        if self.health.state is ConsumerState.STARTING:
            self.health.set(ConsumerState.RUNNING)
        if assigned:
            # aiokafka starts fetching new partitions from their committed offsets as soon
            # as they are assigned, before this callback ends. Under exactly-once those
            # offsets may be stale until ``on_assigned`` has fenced the previous owner
            # (its committing transaction completes); a batch read from them would be
            # published a second time. So nothing is read until the output has taken the
            # partitions over and set their positions.
            self.consumer.pause(*assigned)
            if self.stopping:
                # a rebalance that completes while run stops (its loop over, the group
                # not left yet): nothing more is read, so they are not taken over (that
                # opened producers under exactly-once after the output's close)
                log.info(
                    "partitions assigned while stopping: left paused for their next owner",
                    extra={"partitions": _names(assigned)},
                )
                return
            try:
                await self._retrying(
                    "assign", lambda: self.output.on_assigned(assigned), pause=False
                )
            except Exception as exc:
                # aiokafka would only log an error raised here, and go on fetching: the
                # partitions stay paused (their previous owner maybe not fenced) and
                # ``run`` raises it
                self._failure = exc
                self._interrupt.set()
                self._wake.set()
                return
            still = assigned & self.consumer.assignment()
            self._owned |= still
            self.consumer.resume(*still)
        log.info("partitions assigned", extra={"partitions": _names(assigned)})

    # -- one batch ----------------------------------------------------------------

    async def _handle(self, batch: Batch) -> None:
        started = time.perf_counter()
        topics = self.settings.kafka
        order = sorted(batch, key=lambda tp: (tp.topic, tp.partition))
        for tp in order:  # committed up to the batch, if nothing later is known yet
            self._positions.setdefault(tp, batch[tp][0].offset)
        most = topics.max_message_bytes
        records = [
            Record(
                r.value if r.value is not None else b"",
                {"topic": r.topic, "partition": r.partition, "offset": r.offset},
                null=r.value is None,
            )
            if r.value is None or len(r.value) <= most
            else oversized(
                r.value, {"topic": r.topic, "partition": r.partition, "offset": r.offset}, most
            )
            for tp in order
            for r in batch[tp]
        ]
        keys = {(r.partition, r.offset): r.key for tp in order for r in batch[tp]}
        done: set[TopicPartition] = set()
        """Partitions whose verdicts and offset are committed (``Output.deliver``)."""
        decided_of: dict[TopicPartition, list[Result]] = {}
        self.metrics.events.inc(len(records))
        self.metrics.batch_size.observe(len(records))
        try:
            decided = time.perf_counter()
            results = await self._retrying("decide", lambda: process_within(self.engine, records))
            delivering = time.perf_counter()
            self.metrics.decision_seconds.observe(delivering - decided)
            self._count_store_work()

            def key_of(result: Result) -> bytes | None:
                src = result.record.source
                return keys.get((int(src["partition"]), int(src["offset"])))

            out: dict[TopicPartition, list[Message]] = {tp: [] for tp in order}
            position = 0
            for tp in order:
                chunk = decided_of[tp] = results[position : position + len(batch[tp])]
                position += len(batch[tp])
                out[tp] = list(messages(chunk, topics, key_of))
            offsets = {tp: batch[tp][-1].offset + 1 for tp in order}
            await self._retrying("publish", lambda: self.output.deliver(out, offsets, done))
        except (BatchAbandoned, PartitionLost) as exc:
            # Under exactly-once each partition commits in its own transaction: those done
            # are published and committed, and reading them again would publish their
            # verdicts a second time to read_committed readers. Only the rest go back.
            for tp in done:
                self._positions[tp] = offsets[tp]
            self._count_commits(done)
            if done:  # published and committed: counted, as they are never read again
                self._count_results([r for tp in order if tp in done for r in decided_of[tp]])
            self._rewind({tp: recs for tp, recs in batch.items() if tp not in done}, exc)
            if isinstance(exc, PartitionLost):
                self._rejoin({tp for tp in batch if tp not in done})
            return
        self._count_commits(done)
        self._count_results(results)
        for tp in order:
            self._positions[tp] = offsets[tp]
        self.health.last_batch_at = time.monotonic()
        finished = time.perf_counter()
        self.metrics.batch_seconds.observe(finished - started)
        log.debug(
            "batch committed",
            extra={
                "records": len(records),
                "offsets": _offsets(offsets),
                "decide_ms": round((delivering - decided) * 1000, 1),
                "deliver_ms": round((finished - delivering) * 1000, 1),
            },
        )

    def _rewind(self, batch: Batch, why: BaseException) -> None:
        """Put the uncommitted batch back: partitions still ours are read again from it.

        Under exactly-once, a partition whose transaction failed may yet have committed
        (``TransactionalOutput``): its next transaction publishes only what lies past the
        committed offset."""
        if not batch:
            return
        assigned = self.consumer.assignment()
        for tp, recs in batch.items():
            if tp in assigned:
                with contextlib.suppress(IllegalStateError):
                    self.consumer.seek(tp, recs[0].offset)
        log.warning(
            "batch abandoned uncommitted; it will be redelivered and deduplicated",
            extra={
                "reason": str(why),
                "first_offsets": _offsets({tp: r[0].offset for tp, r in batch.items()}),
            },
        )

    def _rejoin(self, lost: set[TopicPartition]) -> None:
        """Another member has taken ``lost`` over (it fenced this member's producer, or
        the group refused this member's commit): this member's session ended while it
        ran, and until its next heartbeat told it so (a third of the session timeout)
        it went on reading them and, under exactly-once, fencing the new owner's
        producer in turn, batch after batch, each side abandoning its own (17 batches
        each in 20 s in a test). They are paused now, and the member rejoins the group
        at once: its new assignment says what is its own (and resumes it)."""
        self.consumer.pause(*(lost & self.consumer.assignment()))
        coordinator = getattr(self.consumer, "_coordinator", None)  # aiokafka's own
        if coordinator is not None:
            coordinator.request_rejoin()
        log.warning(
            "partitions no longer this member's (its group session ended, in an outage or"
            " while it stalled; another member may have them): paused, rejoining the group",
            extra={"partitions": _names(frozenset(lost))},
        )

    async def _retrying(
        self, stage: str, attempt: Callable[[], Awaitable[_T]], *, pause: bool = True
    ) -> _T:
        """``attempt()`` until it succeeds, backing off on retriable failures."""
        delay = self.settings.retry_initial_ms / 1000
        ceiling = self.settings.retry_max_ms / 1000
        failures = 0
        outage_started = 0.0
        paused: set[TopicPartition] = set()
        try:
            while True:
                try:
                    outcome = await self._watched(stage, attempt)
                except Exception as exc:
                    if not is_retriable(exc):
                        raise
                    failures += 1
                    self.metrics.retries.labels(stage).inc()
                    if failures == 1:
                        outage_started = time.monotonic()
                        if pause:
                            # not those paused already (``_rejoin``'s lost ones, which
                            # only the group's next assignment may resume): resuming
                            # them after the retry had them read and decided again
                            paused = self.consumer.assignment() - self.consumer.paused()
                            self.consumer.pause(*paused)
                    if not self.stopping:
                        # after each failure, not the first alone: the watch of a slow
                        # attempt sets RUNNING again as it ends, and /readyz said ready
                        # through the backoff and the next attempt's first 5 s
                        self.health.set(ConsumerState.WAITING, waiting_on=stage)
                    log.warning(
                        "%s failed, retrying in %.1fs: %s",
                        stage,
                        delay,
                        exc,
                        extra={"stage": stage, "attempt": failures, "error": type(exc).__name__},
                    )
                    await self._wait(delay, stage)
                    delay = min(ceiling, delay * 2) * random.uniform(0.8, 1.0)  # noqa: S311
                    continue
                if failures:
                    log.info(
                        "%s recovered after %d retries in %.1fs",
                        stage,
                        failures,
                        time.monotonic() - outage_started,
                        extra={"stage": stage, "retries": failures},
                    )
                return outcome
        finally:
            if paused:
                self.consumer.resume(*(paused & set(self.consumer.assignment())))
            if failures and self.health.state is ConsumerState.WAITING:
                self.health.set(ConsumerState.RUNNING)

    async def _watched(self, stage: str, attempt: Callable[[], Awaitable[_T]]) -> _T:
        """``attempt()``, watched while it is in flight.

        With the brokers gone, a publish or an offset commit waits out the whole request
        timeout (30 s by default) before it fails and the outage shows: ``/readyz`` said
        ready all along, and a stop waited for it past its grace. Here a stage left
        unanswered for ``_SLOW_AFTER`` s is logged and shown as waiting on it, and a stop
        whose grace runs out meanwhile abandons the batch (not committed: it is read
        again after the restart, and the store recognises what it already decided).

        The stage runs in this task, watched by a timer: run in a task of its own, it
        waited for a turn of the event loop first, and the p99 latency grew by ~6 ms."""
        watch = _Watch(self, stage)
        try:
            outcome = await attempt()
        except asyncio.CancelledError:
            if watch.abandoned and watch.task.uncancel() == 0:  # the watch's cancel alone
                self.gave_up = True
                raise BatchAbandoned(
                    f"stop grace period expired while waiting on {stage}"
                ) from None
            raise
        finally:
            watch.end()
        return outcome

    def _grace_expired(self, now: float) -> bool:
        """Whether a stop was asked for and its grace is over."""
        left = self.grace_left(now)
        return left is not None and left <= 0

    async def _wait(self, delay: float, stage: str) -> None:
        """Sleep ``delay`` unless a rebalance or an expired stop grace abandons the batch."""
        deadline = time.monotonic() + delay
        while (left := deadline - time.monotonic()) > 0:
            if self._revoking and stage != "assign":
                raise BatchAbandoned("partitions are being revoked during an outage")
            if self._grace_expired(time.monotonic()):
                self.gave_up = True
                raise BatchAbandoned("stop grace period expired during an outage")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._interrupt.wait(), timeout=min(left, 1.0))
            # woken (or not): the flags say why at the next pass. Left set while stopping,
            # the event ended every later wait at once, and the wait spun on the CPU for
            # the whole grace period; a second signal sets it again
            self._interrupt.clear()
            await self._keep_membership()
            await self._lag_during_outage()

    async def _keep_membership(self) -> None:
        """Poll while paused so a long outage does not exceed ``max_poll_interval_ms``."""
        if self._batch_lock.locked() and not self._revoking:
            with contextlib.suppress(KafkaError):
                stray = await self.consumer.getmany(timeout_ms=0)
                for tp, recs in stray.items():  # should not happen while paused; never drop
                    with contextlib.suppress(IllegalStateError):
                        self.consumer.seek(tp, recs[0].offset)

    # -- metrics ------------------------------------------------------------------

    def _count_results(self, results: list[Result]) -> None:
        # counted per label set first: a child's lookup (labels()) costs microseconds,
        # once per event it was ~4% of a backlog's drain
        counts = Counter(map(_LABELS, results))
        for (kind, error, decision, reason), count in counts.items():
            if kind is OutcomeKind.DEAD_LETTER:
                assert error is not None
                self.metrics.dead_letters.labels(error.value).inc(count)
            else:
                self.metrics.verdicts.labels(
                    str(decision),
                    str(reason) if reason else "none",
                    "true" if kind is OutcomeKind.DUPLICATE else "false",
                ).inc(count)

    def _count_commits(self, done: set[TopicPartition]) -> None:
        """The offset commits that made ``done`` committed: one, or one transaction a
        partition under exactly-once (counted once a batch, whatever its partitions)."""
        if done:
            self.metrics.commits.inc(len(done) if self.output.commits_each_partition else 1)

    def _count_store_work(self) -> None:
        store, conflicts = self.engine.store, self.engine.stats.conflicts
        self.metrics.store_round_trips.inc(max(0, store.round_trips - self._round_trips))
        self.metrics.store_expired_deleted.inc(max(0, store.expired_deleted - self._expired))
        self.metrics.store_conflicts.inc(max(0, conflicts - self._conflicts))
        self._round_trips, self._expired = store.round_trips, store.expired_deleted
        self._conflicts = conflicts

    async def _lag_during_outage(self) -> None:
        """Keep the lag metric current while a batch waits: the paused partitions are
        not fetched, so their high-water marks are asked of the broker (when it answers),
        at most every ``_LAG_EVERY`` seconds. A backlog is what an outage builds: on every
        assigned partition, not only those of the batch in hand (the others kept the lag
        they had before the outage, 0 while events waited on them)."""
        now = time.monotonic()
        if now - self._lag_asked < _LAG_EVERY or not self._positions:
            return
        if self._revoking or self.stopping:  # they must not wait on a broker's answer
            return
        self._lag_asked = now
        with contextlib.suppress(KafkaError, TimeoutError, IllegalStateError):
            ends = await asyncio.wait_for(
                self.consumer.end_offsets(list(self.consumer.assignment())), _LAG_EVERY
            )
            await self._set_lag(ends)

    async def _set_lag(self, marks: Mapping[TopicPartition, int]) -> None:
        """The lag of each partition of ``marks`` (its high-water mark) still assigned:
        from where its last batch ended, or, for one no batch came from yet, from where
        the consumer reads it."""
        positions = {tp: self._positions[tp] for tp in marks if tp in self._positions}
        unread = [tp for tp in marks if tp not in positions]
        if unread:
            # known at once for a partition assigned and fetched from; bounded all the
            # same (a position being reset waits on the brokers). A group error it raises
            # is the coordinator's, which getmany would raise: not swallowed
            asking = asyncio.gather(*(self.consumer.position(tp) for tp in unread))
            with contextlib.suppress(IllegalStateError, TimeoutError):
                found = await asyncio.wait_for(asking, 0.5)
                positions.update(zip(unread, found, strict=True))
        assigned = self.consumer.assignment()  # a rebalance may have ended meanwhile
        for tp, position in positions.items():
            if tp in assigned:
                self.metrics.lag.labels(str(tp.partition)).set(max(0, marks[tp] - position))

    async def _probe_brokers(self) -> None:
        """Ask the brokers for the assigned partitions' end offsets (or for metadata,
        with none assigned) after ``_PROBE_EVERY`` s without records.

        ``getmany`` never fails: aiokafka's fetcher logs a fetch that fails and tries
        again, and ``getmany`` returns nothing. Without this, an idle consumer would stay
        ready through a whole broker outage, and nothing would show it."""
        now = time.monotonic()
        if now - self._heard_at < _PROBE_EVERY or self.health.state not in _PROBED:
            return
        self._heard_at = now
        assigned = list(self.consumer.assignment())
        try:
            if assigned:
                await asyncio.wait_for(self.consumer.end_offsets(assigned), _PROBE_EVERY)
            else:
                await asyncio.wait_for(self.consumer.topics(), _PROBE_EVERY)
        except (KafkaError, TimeoutError, OSError) as exc:
            self.metrics.retries.labels("fetch").inc()
            if self._brokers_lost_at is None:
                self._brokers_lost_at = now
                log.warning(
                    "brokers at %s do not answer: %s",
                    self.settings.kafka.bootstrap_servers,
                    str(exc) or type(exc).__name__,
                    extra={"stage": "fetch", "error": type(exc).__name__},
                )
                if self.health.state is ConsumerState.RUNNING:
                    self.health.set(ConsumerState.WAITING, waiting_on="fetch")
            return
        self._brokers_answered()

    def _brokers_answered(self) -> None:
        self._heard_at = time.monotonic()
        if self._brokers_lost_at is None:
            return
        log.info(
            "brokers answer again after %.1fs",
            self._heard_at - self._brokers_lost_at,
            extra={"stage": "fetch"},
        )
        self._brokers_lost_at = None
        if self.health.state is ConsumerState.WAITING and self.health.waiting_on == "fetch":
            self.health.set(ConsumerState.RUNNING)

    async def _update_lag(self) -> None:
        """The lag of every assigned partition whose high-water mark a fetch has brought:
        from where its last batch ended, or, for one no batch came from yet, from where
        the consumer reads it (a backlog of several partitions showed only the lag of
        those a batch had come from, 335 of ~2,800 records)."""
        marks: dict[TopicPartition, int] = {}
        for tp in self.consumer.assignment():  # aiokafka asserts on one no longer assigned
            highwater = self.consumer.highwater(tp)
            if highwater is not None:
                marks[tp] = highwater
        await self._set_lag(marks)


class _Watch:
    """Looks at a stage of a batch every ``_WATCH_EVERY`` s while it is in flight (a
    timer: nothing runs while the stage answers in time): unanswered for ``_SLOW_AFTER``
    s, it is logged and shown as waiting; once a stop's grace has run out, the task
    running it is cancelled."""

    def __init__(self, consumer: VelocityConsumer, stage: str) -> None:
        task = asyncio.current_task()
        assert task is not None  # a stage runs in the consume loop's task
        self.task = task
        self.consumer = consumer
        self.stage = stage
        self.started = time.monotonic()
        self.slow = False
        self.abandoned = False
        self._timer = asyncio.get_running_loop().call_later(_WATCH_EVERY, self._look)

    def _look(self) -> None:
        consumer = self.consumer
        now = time.monotonic()
        left = consumer.grace_left(now)
        if left is not None and left <= 0:
            self.abandoned = True
            self.task.cancel()
            return
        if not self.slow and now - self.started >= _SLOW_AFTER:
            self.slow = True
            log.warning(
                "%s: no answer after %.0fs; still waiting (store or brokers slow or"
                " unreachable, or an error retried, such as a topic that no longer exists)",
                self.stage,
                now - self.started,
                extra={"stage": self.stage},
            )
            if not consumer.stopping:
                consumer.health.set(ConsumerState.WAITING, waiting_on=self.stage)
        self._timer = asyncio.get_running_loop().call_later(_WATCH_EVERY, self._look)

    def end(self) -> None:
        """The stage is over, however it ended: answered, failed (a retriable failure
        sets WAITING again at once; a lost partition is rewound, and the consumer goes
        on) or abandoned. Readiness must not stay at "waiting" on it."""
        self._timer.cancel()
        if not self.slow:
            return
        health = self.consumer.health
        if health.state is ConsumerState.WAITING and health.waiting_on == self.stage:
            health.set(ConsumerState.RUNNING)
        log.info(
            "%s: over after %.1fs",
            self.stage,
            time.monotonic() - self.started,
            extra={"stage": self.stage},
        )


def _names(partitions: frozenset[TopicPartition]) -> list[str]:
    return sorted(f"{tp.topic}:{tp.partition}" for tp in partitions)


def _offsets(offsets: Mapping[TopicPartition, int]) -> dict[str, int]:
    return {f"{tp.topic}:{tp.partition}": offset for tp, offset in offsets.items()}
