"""A faust-streaming app whose agent runs the same engine and store as ``limitflow replay``.

For teams that already operate faust workers::

    LIMITFLOW_BOOTSTRAP_SERVERS=127.0.0.1:9092 LIMITFLOW_RULES=examples/rules.yaml \\
        faust -A streams.faust_app worker -l info

Per batch (``Stream.noack_take``): decide every record through ``Engine.process`` (state
committed to the store), publish each verdict (keyed by ``account_id``, ``event_id`` in a
header) or dead letter, wait until the broker has acknowledged every one of them, and only
then ack the input events, so faust never commits an offset whose verdict is not
durable. ``noack_take`` and not ``take``: ``take`` acks its buffered events in a
``finally`` that also runs when the batch failed, which would commit offsets of events
that produced no verdict.

Guarantee: at-least-once. After a crash a batch is delivered again; the store recognises
every event of it and the verdicts published again are identical (same decision, reason,
seq). Exactly-once output (Kafka transactions) is ``limitflow run --guarantee
exactly-once``.

Settings come from ``LIMITFLOW_*`` environment variables, read once here (the edge) into
``FaustSettings``; the app is built on first access to ``streams.faust_app.app``, so
importing this module has no side effects.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import signal
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, cast

import faust
import mode
from aiokafka.errors import KafkaError  # type: ignore[import-untyped]
from faust.exceptions import NotReady
from faust.streams import Stream
from faust.transport.drivers import aiokafka as faust_aiokafka
from faust.types import EventT, StreamT
from mode.supervisors import CrashingSupervisor

from handlers.decide import Decider
from limitflow.errors import ConfigError, LimitflowError
from limitflow.settings import (
    DEFAULT_STORE,
    METADATA_MAX_AGE_MS,
    Guarantee,
    KafkaSecurity,
    KafkaSettings,
    RunSettings,
    TopicSettings,
    check_bootstrap,
    check_compression,
    check_group,
    check_positive,
    check_retry,
    check_topics,
    env_name,
    load_env_settings,
    load_security,
    setting_variables,
    tls_context,
    unknown_variables,
)
from limitflow.stopping import SIGNALS
from schemas.rules import RulesError, RuleSet, load_rules
from stores.base import Store
from streams.consumer import tolerate_empty_assignments
from streams.engine import (
    Engine,
    Record,
    Result,
    fewer_collections,
    oversized,
    process_within,
)
from streams.ops import OffsetResets, quiet_secret_loggers
from streams.output import Message, batch_bytes, compression_type, messages, send_all, translate
from streams.topics import topic_configs

log = logging.getLogger("limitflow.faust")


@dataclass(frozen=True, slots=True)
class FaustSettings:
    """Everything the faust app needs; each field is ``LIMITFLOW_<FIELD>`` in the env."""

    bootstrap_servers: str
    """Comma-separated ``HOST:PORT`` list."""
    rules: str
    """Path of the rules file (YAML)."""
    input_topic: str = "limitflow.events"
    output_topic: str = "limitflow.verdicts"
    dead_letter_topic: str = "limitflow.dead-letters"
    group_id: str = "limitflow-faust"
    """Consumer group, and faust's app id."""
    store: str = DEFAULT_STORE
    batch_size: int = 2_000
    """Most events one ``noack_take`` batch holds."""
    max_message_bytes: int = 1_000_000
    """As for ``limitflow run``: a larger dead letter names its record instead of holding it,
    and the batches published are as large as this allows."""
    compression: str = "zstd"
    """As for ``limitflow run``: the codec of the record batches published, or ``none``."""
    batch_wait_ms: int = 20
    """How long a batch waits to fill before it is processed anyway (bounds latency)."""
    fetch_max_wait_ms: int = 50
    """As for ``limitflow run``: longest a broker may hold a fetch that found nothing
    (faust itself fixes 1,500 ms, which a broker like tansu adds to an event's latency)."""
    partitions: int = 6
    """Partitions of topics the app creates when they are missing."""
    replication_factor: int = 1
    """Replication factor of topics the app creates when they are missing, as for
    ``limitflow topics create`` (faust's own default, 1, was the only one)."""
    session_timeout_ms: int = 10_000
    request_timeout_ms: int = 30_000
    """As for ``limitflow run``: a publish the brokers have not acknowledged by then is
    an outage, retried (faust's own default waits 20 minutes, and a stop with it)."""
    retry_initial_ms: int = 200
    """First wait after a retriable failure; doubled on each further failure."""
    retry_max_ms: int = 30_000
    web_port: int = 6066
    """Port of faust's web server (stats, health); ``worker --without-web`` turns it off."""
    web_bind: str = "127.0.0.1"
    """Address faust's web server listens on: this host alone, as ``run``'s ``http_host``
    (faust's own default, 0.0.0.0, showed its stats pages to every network the host is
    on); ``0.0.0.0`` for probes from outside it, in a container."""
    data_dir: str = ""
    """faust's data directory (unused: no tables); default a folder in the temp dir."""
    security: KafkaSecurity = dataclasses.field(default_factory=KafkaSecurity)
    """As for ``limitflow run``: TLS and SASL (``LIMITFLOW_SECURITY_PROTOCOL``, …)."""

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> FaustSettings:
        """Settings from ``LIMITFLOW_*`` variables over the defaults."""
        guarantee = env.get(env_name("guarantee"), Guarantee.AT_LEAST_ONCE).strip()
        if guarantee != Guarantee.AT_LEAST_ONCE:
            # a setting of `run`'s, which the app has not: ignored, it let an operator who
            # set it believe the output exactly-once
            raise ConfigError(
                f"{env_name('guarantee')}={guarantee}: the faust app publishes at least"
                " once only (docs/faust.md); exactly-once is `limitflow run --guarantee"
                " exactly-once`"
            )
        settings = dataclasses.replace(load_env_settings(cls, env), security=load_security({}, env))
        # the checks of `limitflow run`'s settings, for the same variables
        check_bootstrap(settings.bootstrap_servers)
        check_topics(settings.input_topic, settings.output_topic, settings.dead_letter_topic)
        check_group(settings.group_id)
        for name in (
            "batch_size",
            "max_message_bytes",
            "fetch_max_wait_ms",
            "partitions",
            "replication_factor",
            "session_timeout_ms",
            "request_timeout_ms",
            "retry_initial_ms",
            "retry_max_ms",
        ):
            check_positive(name, getattr(settings, name))
        check_positive("batch_wait_ms", settings.batch_wait_ms, zero_ok=True)
        check_retry(settings.retry_initial_ms, settings.retry_max_ms)
        check_compression(settings.compression)
        if not 0 <= settings.web_port <= 65_535:
            raise ConfigError(f"web_port ({env_name('web_port')}) must be 0..65535")
        if not settings.web_bind.strip():
            raise ConfigError(f"web_bind ({env_name('web_bind')}) must not be empty")
        return settings


def run_only_variables(env: Mapping[str, str]) -> list[str]:
    """``LIMITFLOW_*`` variables of ``limitflow run``'s settings that the app has not (a
    shared environment may set them for both): ignored here."""
    own = setting_variables(FaustSettings, KafkaSecurity) | {env_name("guarantee")}  # checked
    runs = setting_variables(KafkaSettings, RunSettings, TopicSettings)
    return sorted(name for name in runs - own if name in env)


def source_of(event: EventT[Any], most: int) -> Record:
    """The engine's record for a faust event: its raw bytes and where it came from; in
    its place an ``Oversized`` one when it is over ``most`` bytes (``max_message_bytes``),
    as ``run`` and ``replay`` take none."""
    message = event.message
    raw = event.value if isinstance(event.value, bytes) else b""
    source: dict[str, str | int] = {
        "topic": message.topic,
        "partition": message.partition,
        "offset": message.offset,
    }
    if len(raw) > most:
        return oversized(raw, source, most)
    return Record(raw, source, null=event.value is None)


def _unkeyed(result: Result) -> None:
    """faust hands the agent values only: dead letters go unkeyed."""
    return None


def _retriable(exc: BaseException) -> bool:
    if isinstance(exc, TimeoutError):
        return True
    if isinstance(exc, LimitflowError):
        return exc.retriable
    if isinstance(exc, KafkaError):
        return bool(exc.retriable) or type(exc).__name__ in (
            "KafkaConnectionError",
            "KafkaTimeoutError",
            "RequestTimedOutError",
        )
    return False


class BatchHandler:
    """Decides, publishes and acks batches of faust events; retries what may succeed later."""

    def __init__(self, app: faust.App, engine: Engine, settings: FaustSettings) -> None:
        self.app = app
        self.engine = engine
        self.settings = settings

    async def handle(self, stream: Stream[Any], events: Sequence[EventT[Any]]) -> bool:
        """Process ``events`` and ack them; False when the worker stopped first (no acks)."""
        most = self.settings.max_message_bytes
        records = [source_of(event, most) for event in events]
        delay = self.settings.retry_initial_ms / 1000
        while True:
            try:
                decided = list(
                    messages(await process_within(self.engine, records), self.settings, _unkeyed)
                )
                await self._publish(decided)
                break
            except Exception as exc:
                if not _retriable(exc):
                    raise
                if self._stopping(stream):
                    return False
                log.warning(
                    "batch of %d failed, retrying in %.1fs: %s: %s",
                    len(records),
                    delay,
                    type(exc).__name__,
                    exc,
                )
                deadline = asyncio.get_running_loop().time() + delay
                while (left := deadline - asyncio.get_running_loop().time()) > 0:
                    await asyncio.sleep(min(left, 0.2))  # a stop need not wait out the delay
                    if self._stopping(stream):
                        return False
                delay = min(delay * 2, self.settings.retry_max_ms / 1000)
        for event in events:
            await stream.ack(event)
        return True

    def _stopping(self, stream: Stream[Any]) -> bool:
        """Whether the worker is stopping; if so, the batch in hand is left unacked (it is
        delivered again after the restart, and deduplicated), and faust is told not to
        wait for it.

        faust's stop waits until every message it handed out is acked (``wait_empty``):
        this batch, and the events fetched behind it, which this agent, leaving, will
        never take. faust commits acked offsets only, so dropping them from its list
        loses nothing; without it the worker waited forever after an outage had held up
        its last batch."""
        if not (stream.should_stop or self.app.should_stop):
            return False
        self.app.consumer.unacked.clear()
        return True

    async def _publish(self, records: Sequence[Message]) -> None:
        """Send ``records`` in order and wait until the broker has every one.

        Through ``run``'s ``send_all`` on the aiokafka producer under faust's: it keeps
        each output partition's order even when a request times out and is retried
        (faust's own ``send`` queues everything at once, and aiokafka then sends the
        next record batch of a partition past the one that failed)."""
        if records:
            producer = self.app.producer
            assert isinstance(producer, faust_aiokafka.Producer)  # LimitflowApp's transport
            # bounded: with the brokers gone, aiokafka may wait on metadata or acks
            # without end, and a stop would wait with it. Each request, not the whole:
            # a batch whose verdicts take several record batches per partition (a small
            # max_message_bytes, a slow broker) took longer as a whole, failed with every
            # request acknowledged in time, and was published again and again without end
            timeout = self.settings.request_timeout_ms / 1000
            await send_all(producer._ensure_producer(), records, per_request=timeout)


def load_checked_rules(path: str) -> RuleSet:
    """The rules file, or a ``ConfigError`` naming what is wrong with it."""
    try:
        return load_rules(path)
    except RulesError as exc:
        raise ConfigError(f"rules: {exc}") from None


async def open_engine(settings: FaustSettings, rules: RuleSet) -> Engine:
    """An engine on a ready store (embedded stores are created; servers must be set up)."""
    from limitflow.cli import CommandFailed, open_ready_store
    from stores.sqlite import CONSUMER_LOCK_WAIT

    try:
        store = await open_ready_store(settings.store, rules, lock_wait=CONSUMER_LOCK_WAIT)
    except CommandFailed as exc:
        raise ConfigError(str(exc)) from None
    assert isinstance(store, Store)
    return Engine(Decider(rules), store)


def check_store(settings: FaustSettings, rules: RuleSet) -> bool:
    """Open the store once before faust starts, as ``limitflow run`` opens it at start, and
    close it: a store that cannot be reached or is not initialised, or a rule whose
    counters it keeps under another meaning, is then a ``CommandFailed`` (one line and
    ``run``'s exit code) rather than the agent's crash. The rules' meanings are kept here
    (``Store.keep_rules``), so that the agent's start only reads them: it took a sqlite
    file's write lock, and a lock held by another process then crashed the worker. Any
    access to the app, ``faust … --help`` too, comes here. False if SIGINT or SIGTERM came
    first, as ``run`` stops for them then. On an event loop of its own, left as faust
    found it, and so are the signals' handlers."""
    from limitflow.run_cli import store_unless_stopped

    async def opened_and_closed() -> bool:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in SIGNALS:
            loop.add_signal_handler(sig, stop.set)
        try:
            store = await store_unless_stopped(settings.store, rules, stop)
        finally:
            for sig in SIGNALS:
                loop.remove_signal_handler(sig)
        if store is None:
            return False
        assert isinstance(store, Store)
        await store.close()
        return True

    before = {sig: signal.getsignal(sig) for sig in SIGNALS}
    loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(opened_and_closed())
    finally:
        loop.close()
        for sig, handler in before.items():
            signal.signal(sig, handler)


class _ConsumerThread(faust_aiokafka.AIOKafkaConsumerThread):
    def _create_worker_consumer(self, transport: Any) -> Any:
        consumer = super()._create_worker_consumer(transport)
        # faust passes fetch_max_wait_ms=1500 with no setting to change it; aiokafka reads
        # this attribute when the consumer starts and builds its fetcher from it
        consumer._fetch_max_wait_ms = cast(LimitflowApp, self.app).limitflow.fetch_max_wait_ms
        # faust reads read_uncommitted unless it is in a transaction itself: a payment
        # whose upstream transaction aborted (one that never happened) was decided and
        # counted. Read committed events only, as ``limitflow run`` does
        consumer._isolation_level = "read_committed"
        return consumer

    async def stop(self) -> None:
        """mode's, once the thread has started its service: mode's stop does nothing
        before then, and a SIGTERM a few milliseconds into a worker's start, while this
        thread was starting, left it running for ever, and the worker never exited."""
        thread = self._thread
        deadline = time.monotonic() + 10
        # polled: the thread sets ``_started`` in its own event loop, not in this one
        while (  # noqa: ASYNC110
            thread is not None
            and thread.is_alive()
            and not self._started.is_set()
            and time.monotonic() < deadline
        ):
            await asyncio.sleep(0.01)
        if self.thread_loop.is_closed():  # a crash ended the thread: nothing to stop
            return
        await super().stop()

    async def on_start(self) -> None:
        """faust's, then a group join that brings an assignment of zero bytes is tried
        again (see ``streams.consumer.tolerate_empty_assignments``): aiokafka's
        coordination task failed on it, and the worker, still up, was left in no group
        (90 s in a test). faust subscribes after this start, so its first join is
        covered too."""
        await super().on_start()
        tolerate_empty_assignments(self._consumer)

    async def _commit(self, offsets: Any) -> bool:
        """faust's commit, bounded: aiokafka retries a commit without end while the group
        coordinator is unreachable, and faust's shutdown commits before it ends, so a
        stop during a broker outage waited for the brokers. A commit that times out
        failed: the offsets stay where they were, and those events come again."""
        timeout = cast(LimitflowApp, self.app).limitflow.request_timeout_ms / 1000
        try:
            return bool(await asyncio.wait_for(super()._commit(offsets), timeout))
        except TimeoutError:
            log.warning("offset commit timed out after %.0fs: brokers unreachable", timeout)
            return False

    @mode.Service.timer(1.0)
    async def _group_refused(self) -> None:
        """Stop the worker when aiokafka holds an error of its group coordination for
        its user (a join the group refused for good: a session timeout outside the
        brokers' bounds). aiokafka's ``getmany`` takes it; faust never does, and the
        coordination waits for that without end: the worker stayed up for ever, in no
        group, deciding nothing, after one line of aiokafka's."""
        # (no coordinator before the consumer has started: aiokafka's is None until then)
        coordinator = getattr(self._consumer, "_coordinator", None)
        held = getattr(coordinator, "_pending_exception", None)
        if held is None or self.should_stop or self.app.should_stop:
            return
        error = translate(held)
        log.critical("kafka failed for good: %s", error)
        # the app's crash, on its loop, stops the worker (exit 1)
        asyncio.run_coroutine_threadsafe(self.app.crash(error), self.parent_loop)

    async def on_thread_stop(self) -> None:
        """faust's, but a consumer closed without its brokers does not kill the thread:
        aiokafka's fetcher awaits the fetch task it cancelled, and that cancellation comes
        out of ``stop()`` (the same as in ``limitflow run``'s close)."""
        try:
            await super().on_thread_stop()
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise
            log.warning("the consumer closed without reaching the brokers")


class _ReadOffsets(defaultdict[Any, int | None]):
    """faust's offsets read last, by partition, with offset 0 kept truthy.

    faust's fetch loop notes a gap in a partition's offsets only after a truthy read
    offset (``if gap > 1 and r_offset``). A ``read_committed`` consumer skips offsets
    (the markers that end transactions, the records of aborted ones): after a record at
    offset 0, those were never noted, faust found no offset it could commit past them,
    and the partition's committed offset stayed at 1 until a restart (which then
    decided everything since again, as duplicates)."""

    def __setitem__(self, tp: Any, offset: int | None) -> None:
        super().__setitem__(tp, _ZERO if offset == 0 and type(offset) is int else offset)


class _Zero(int):
    """0, but true (``_ReadOffsets``)."""

    def __bool__(self) -> bool:
        return True


_ZERO: Final = _Zero(0)


class _Consumer(faust_aiokafka.Consumer):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._read_offset = _ReadOffsets(lambda: None)

    def _new_consumer_thread(self) -> _ConsumerThread:
        return _ConsumerThread(self, loop=self.loop, beacon=self.beacon)


class _Transport(faust_aiokafka.Transport):
    Consumer = _Consumer


class LimitflowApp(faust.App):
    """A faust app whose Kafka consumers wait at most ``fetch_max_wait_ms`` for a fetch,
    and which waits for its brokers before it starts."""

    def __init__(self, *args: Any, limitflow: FaustSettings, **kwargs: Any) -> None:
        self.limitflow = limitflow
        self._stopping = asyncio.Event()
        self._resets = contextlib.ExitStack()
        super().__init__(*args, **kwargs)

    def _new_transport(self) -> Any:
        return _Transport(self.conf.broker_consumer, self)

    async def on_start(self) -> None:
        """Wait until the brokers answer, then start as faust does.

        mode runs the app's own ``on_start`` before it starts the app's children
        (producer, consumer, agents): faust's producer, started with its brokers
        unreachable, raised "Unable to bootstrap" and the worker exited 1. Here the worker
        waits as ``limitflow run`` does, retrying a bootstrap with backoff; a stop
        meanwhile ends the wait, and mode then starts none of the children."""
        from limitflow.run_cli import StoppedBeforeStart, start_retrying

        settings = self.limitflow
        # `-l debug` (set up by now; this before the probe, which signs in too): aiokafka's
        # DEBUG records hold the SASL password as sent, the drivers' the credentials or
        # the documents written
        level = logging.getLogger().level
        logging.getLogger("aiokafka").setLevel(max(logging.INFO, level))
        quiet_secret_loggers(level)
        try:
            probe = await start_retrying(
                "worker",
                self._probe,
                self._stopping,
                settings.bootstrap_servers,
                (settings.retry_initial_ms, settings.retry_max_ms),
            )
        except StoppedBeforeStart:
            log.info("stopped before the worker could reach Kafka; nothing was consumed")
            return
        await probe.close()
        log.info("Kafka at %s answers: starting", settings.bootstrap_servers)
        # a committed offset the brokers no longer hold: aiokafka says so at INFO, which
        # `-l warn` hides, and reads on from the earliest offset kept; a warning here
        self._resets.enter_context(OffsetResets(None, "limitflow.faust").installed())
        await super().on_start()

    def _probe(self) -> Any:
        """An admin client: its start asks a bootstrap server for the cluster's metadata."""
        from aiokafka.admin import AIOKafkaAdminClient  # type: ignore[import-untyped]

        from limitflow.run_cli import client_security

        return AIOKafkaAdminClient(
            bootstrap_servers=self.limitflow.bootstrap_servers,
            client_id=f"{self.limitflow.group_id}-probe",
            request_timeout_ms=self.limitflow.request_timeout_ms,
            **client_security(self.limitflow.security),
        )

    @property
    def stopping(self) -> bool:
        """Whether the worker has begun to stop (set first thing in ``on_stop``)."""
        return self._stopping.is_set()

    async def on_stop(self) -> None:
        self._stopping.set()
        await super().on_stop()
        self._resets.close()

    async def on_restart(self) -> None:
        self._stopping.clear()  # as mode clears its own events for a restart
        await super().on_restart()


def faust_credentials(security: KafkaSecurity) -> Any:
    """``broker_credentials`` for faust from the settings ``limitflow run`` reads too;
    None for PLAINTEXT."""
    context = tls_context(security) if security.tls else None
    if security.sasl:
        return faust.SASLCredentials(
            username=security.sasl_username,
            password=security.sasl_password,
            ssl_context=context,
            mechanism=security.sasl_mechanism,
        )
    return None if context is None else faust.SSLCredentials(context)


_FAUST_REQUEST_TIMEOUT: Final = 90.0
"""faust's own ``broker_request_timeout``, seconds."""


def build_app(settings: FaustSettings, rules: RuleSet | None = None) -> faust.App:
    """The faust app: one agent over the input topic, publishing verdicts and dead letters;
    on ``rules``, or the rules file of ``settings``."""
    if rules is None:
        rules = load_checked_rules(settings.rules)
    session = settings.session_timeout_ms / 1000
    app = LimitflowApp(
        settings.group_id,
        limitflow=settings,
        broker=",".join(f"kafka://{hp.strip()}" for hp in settings.bootstrap_servers.split(",")),
        autodiscover=False,
        store="memory://",
        topic_disable_leader=True,
        topic_partitions=settings.partitions,
        topic_replication_factor=settings.replication_factor,
        consumer_auto_offset_reset="earliest",
        # as `limitflow run`'s: partitions added to the input topic waited 5 minutes
        consumer_metadata_max_age_ms=METADATA_MAX_AGE_MS,
        broker_session_timeout=session,
        # faust refuses a session longer than its request timeout (90 s), and
        # LIMITFLOW_SESSION_TIMEOUT_MS has none of its own (run takes up to the brokers'
        # 30 minutes): the worker's consumer crashed at start, in tracebacks naming
        # faust's settings, where the session asked for runs
        broker_request_timeout=max(_FAUST_REQUEST_TIMEOUT, session),
        broker_heartbeat_interval=max(session / 10, 0.1),
        broker_commit_interval=1.0,
        producer_request_timeout=settings.request_timeout_ms / 1000,
        # as `limitflow run`'s: faust's own 16 KB batches held ~11 verdicts each
        producer_max_batch_size=batch_bytes(settings.max_message_bytes),
        producer_compression_type=compression_type(settings.compression),
        web_port=settings.web_port,
        web_bind=settings.web_bind,
        datadir=settings.data_dir
        or os.path.join(tempfile.gettempdir(), f"limitflow-faust-{settings.group_id}"),
        key_serializer="raw",
        value_serializer="raw",
        broker_credentials=faust_credentials(settings.security),
    )
    # as `limitflow topics create` makes them: with a LIMITFLOW_MAX_MESSAGE_BYTES over 1 MB,
    # topics of the brokers' ~1 MB refused the dead letters the app published
    configs = topic_configs(settings.max_message_bytes)
    source = app.topic(
        settings.input_topic,
        key_type=bytes,
        value_type=bytes,
        key_serializer="raw",
        value_serializer="raw",
        allow_empty=True,
        config=configs,
    )
    sinks = [
        app.topic(name, key_serializer="raw", value_serializer="raw", config=configs)
        for name in (settings.output_topic, settings.dead_letter_topic)
    ]

    @app.task  # type: ignore[untyped-decorator]
    async def declare_topics() -> None:
        # a new user is not left to create topics by hand; existing ones are kept as they are
        for topic in (source, *sinks):
            try:
                await topic.maybe_declare()
            except NotReady:
                # a SIGTERM during the start stops the producer before this task runs:
                # the worker exited 1 with a traceback, though it had consumed nothing.
                # The next start declares them
                if app.stopping:
                    return
                raise

    # CrashingSupervisor: a failed agent stops the worker instead of being restarted in
    # place, where it would not see its unacked events again until a rebalance
    @app.agent(source, supervisor_strategy=CrashingSupervisor)
    async def decide(channel_stream: StreamT[Any]) -> None:
        stream = cast(Stream[Any], channel_stream)  # noack_take is not on the StreamT protocol
        engine = await open_engine(settings, rules)
        handler = BatchHandler(app, engine, settings)
        try:
            with fewer_collections():  # the worker's process is this agent's
                # faust reads a ``within`` of 0 as no bound (wait until the batch is
                # full): nothing was decided, and a stop waited for ever on the events
                # held. 0 ms means no wait: 1 ms
                async for events in stream.noack_take(
                    settings.batch_size, within=max(settings.batch_wait_ms, 1) / 1000
                ):
                    if not await handler.handle(stream, events):
                        break
        finally:
            await engine.store.close()

    return app


def __getattr__(name: str) -> Any:
    """``streams.faust_app.app``, built from the environment on first access."""
    if name == "app":
        from limitflow.cli import CommandFailed

        try:
            settings = FaustSettings.from_env(os.environ)
            rules = load_checked_rules(settings.rules)  # read once, for both
            app = build_app(settings, rules)
            if not check_store(settings, rules):
                print("limitflow: stopped before starting; nothing was consumed", file=sys.stderr)
                raise SystemExit(0)
        except (ConfigError, RulesError) as exc:
            # one line for a bad variable or rules file, as `limitflow run` gives
            print(f"limitflow: {exc}", file=sys.stderr)
            raise SystemExit(2) from None
        except CommandFailed as exc:  # the store, as `limitflow run` says it
            print(f"limitflow: {exc}", file=sys.stderr)
            raise SystemExit(exc.code) from None
        for variable in unknown_variables(os.environ):
            log.warning("%s is not a limitflow setting: ignored (misspelt?)", variable)
        for variable in run_only_variables(os.environ):
            log.warning(
                "%s is a setting of `limitflow run`, not of the faust app: ignored", variable
            )
        globals()["app"] = app
        return app
    raise AttributeError(name)
