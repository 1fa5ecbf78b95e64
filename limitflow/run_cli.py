"""``limitflow run`` and ``limitflow topics create``: the edge of the Kafka runtime.

Settings are read here once (flags over ``LIMITFLOW_*`` environment over defaults) and
every client is built here from them; nothing below reads the environment.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, Final, TypeVar

from limitflow.settings import (
    COMPRESSIONS,
    DEFAULT_STORE,
    METADATA_MAX_AGE_MS,
    SASL_MECHANISMS,
    SECURITY_PROTOCOLS,
    Guarantee,
    KafkaSecurity,
    KafkaSettings,
    RunSettings,
    TopicSettings,
    env_name,
    load_run_settings,
    load_security,
    load_topic_settings,
    tls_context,
    unknown_variables,
    whole_number,
)
from limitflow.stopping import SIGNALS, StopSignals

if TYPE_CHECKING:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer  # type: ignore[import-untyped]
    from aiokafka.admin import AIOKafkaAdminClient  # type: ignore[import-untyped]

    from streams.consumer import VelocityConsumer
    from streams.ops import Health
    from streams.output import Output

EXIT_BROKER = 4
"""Kafka refused a request for good (the store's failures exit with 3)."""

log = logging.getLogger("limitflow.run")
_T = TypeVar("_T")


def _whole_number(raw: str) -> int:
    """A number flag, read as its ``LIMITFLOW_*`` variable is (``whole_number``)."""
    try:
        return whole_number(raw)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _env_help(text: str, option: str) -> str:
    return f"{text} [env {env_name(option)}]"


def _kafka_options(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--bootstrap-servers", help=_env_help("Kafka brokers, HOST:PORT[,…]", "bootstrap_servers"))
    add("--input-topic", help=_env_help("topic of the events", "input_topic"))
    add("--output-topic", help=_env_help("topic the verdicts go to", "output_topic"))
    add("--dead-letter-topic", help=_env_help("topic of rejected input", "dead_letter_topic"))
    add(
        "--partitions",
        type=_whole_number,
        help=_env_help("partitions of created topics (6)", "partitions"),
    )
    add(
        "--replication-factor",
        type=_whole_number,
        help=_env_help("replication factor of created topics (1)", "replication_factor"),
    )
    security = parser.add_argument_group(
        "Kafka security", f"the SASL password is read from {env_name('sasl_password')} only"
    )
    security.add_argument(
        "--security-protocol",
        choices=SECURITY_PROTOCOLS,
        help=_env_help("TLS (SSL), SASL, both, or neither (PLAINTEXT)", "security_protocol"),
    )
    security.add_argument(
        "--sasl-mechanism",
        choices=SASL_MECHANISMS,
        help=_env_help("with SASL_SSL or SASL_PLAINTEXT", "sasl_mechanism"),
    )
    security.add_argument("--sasl-username", help=_env_help("SASL user", "sasl_username"))
    for option, text in (
        ("--ssl-cafile", "CA certificates (PEM) to check the brokers by (the system's)"),
        ("--ssl-certfile", "this client's certificate (PEM), for brokers that ask (mTLS)"),
        ("--ssl-keyfile", "its private key (PEM, unencrypted), if not in --ssl-certfile"),
    ):
        name = option.removeprefix("--").replace("-", "_")
        security.add_argument(option, help=_env_help(text, name))
    tuning = parser.add_argument_group("Kafka client tuning")
    tuning.add_argument(
        "--client-id", help=_env_help("client id the brokers see (limitflow)", "client_id")
    )
    tuning.add_argument(
        "--request-timeout-ms",
        type=_whole_number,
        help=_env_help("per broker request; slower counts as down (30000)", "request_timeout_ms"),
    )
    tuning.add_argument(
        "--max-message-bytes",
        type=_whole_number,
        help=_env_help(
            "largest record published or decided; a larger input record, or a dead letter"
            " that would be larger, is named by its size and hash (1000000)",
            "max_message_bytes",
        ),
    )
    tuning.add_argument(
        "--compression",
        choices=COMPRESSIONS,
        help=_env_help(
            "codec of the record batches published; readers must support it (zstd)",
            "compression",
        ),
    )


def register_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``run`` and ``topics`` to the ``limitflow`` parser."""
    run = commands.add_parser(
        "run",
        help="decide events from a Kafka topic until SIGTERM/SIGINT",
        description="Every option can also be set by the environment variable shown; "
        "a flag overrides it.",
    )
    _kafka_options(run)
    add = run.add_argument
    add("--group-id", help=_env_help("consumer group", "group_id"))
    add("--rules", help=_env_help("rules file (YAML)", "rules"))
    add("--store", help=_env_help(f"state store URL (default {DEFAULT_STORE})", "store"))
    add(
        "--guarantee",
        choices=[g.value for g in Guarantee],
        help=_env_help("at-least-once (default) or exactly-once (Kafka transactions)", "guarantee"),
    )
    add(
        "--create-topics",
        action=argparse.BooleanOptionalAction,
        default=None,
        help=_env_help("create missing topics at start", "create_topics"),
    )
    add(
        "--http-port",
        type=_whole_number,
        help=_env_help("ops port: /healthz /readyz /metrics; 0 = off (0)", "http_port"),
    )
    add("--http-host", help=_env_help("ops address (127.0.0.1)", "http_host"))
    add(
        "--batch-size", type=_whole_number, help=_env_help("records per batch (2000)", "batch_size")
    )
    add("--log-level", help=_env_help("DEBUG, INFO (default), WARNING…", "log_level"))
    add(
        "--log-format",
        choices=["json", "text"],
        help=_env_help("json (default) or text", "log_format"),
    )
    timing = run.add_argument_group("timing")
    for option, text in (
        ("--poll-timeout-ms", "longest wait for records in one poll (500)"),
        ("--fetch-max-wait-ms", "longest a broker may hold an empty fetch (50)"),
        ("--session-timeout-ms", "group session timeout (10000)"),
        ("--max-poll-interval-ms", "group's limit between polls (300000)"),
        ("--retry-initial-ms", "first wait after a retriable failure, then doubled (200)"),
        ("--retry-max-ms", "longest wait between retries (30000)"),
        ("--shutdown-grace-ms", "on SIGTERM, how long an outage may hold the batch (20000)"),
    ):
        name = option.removeprefix("--").replace("-", "_")
        timing.add_argument(option, type=_whole_number, help=_env_help(text, name))
    run.set_defaults(handler=_run_command)

    topics = commands.add_parser("topics", help="manage the Kafka topics limitflow uses")
    topic_commands = topics.add_subparsers(dest="topics_command", required=True)
    create = topic_commands.add_parser(
        "create",
        help="create the input, output and dead-letter topics (existing ones are kept)",
        description="Create the input, output and dead-letter topics; existing ones are kept"
        " as they are. With a --max-message-bytes over 1000000, the topics are made with a"
        " max.message.bytes that takes the records run publishes and decides at that size."
        " Every option can also be set by the environment variable shown; a flag overrides"
        " it.",
    )
    _kafka_options(create)
    create.set_defaults(handler=_topics_create)


def _values(args: argparse.Namespace) -> dict[str, Any]:
    return {k: v for k, v in vars(args).items() if k not in ("handler", "command")}


def _settings(load: Callable[[], _T]) -> _T:
    from limitflow.cli import EXIT_USAGE, CommandFailed
    from limitflow.errors import ConfigError

    try:
        return load()
    except ConfigError as exc:
        raise CommandFailed(str(exc), EXIT_USAGE) from None


# -- clients, built once from the settings ------------------------------------------


def client_security(security: KafkaSecurity) -> dict[str, Any]:
    """The keyword arguments of every aiokafka client for ``security`` (checked when the
    settings were loaded)."""
    kwargs: dict[str, Any] = {"security_protocol": security.security_protocol}
    if security.tls:
        kwargs["ssl_context"] = tls_context(security)
    if security.sasl:
        kwargs["sasl_mechanism"] = security.sasl_mechanism
        kwargs["sasl_plain_username"] = security.sasl_username
        kwargs["sasl_plain_password"] = security.sasl_password
    return kwargs


def env_client_security(env: Mapping[str, str]) -> dict[str, Any]:
    """``client_security`` of the TLS and SASL settings in ``env`` (the ``LIMITFLOW_*``
    variables ``run`` reads), for the sample scripts; a bad one is a ``ConfigError``."""
    return client_security(load_security({}, env))


def _admin(kafka: KafkaSettings) -> AIOKafkaAdminClient:
    from aiokafka.admin import AIOKafkaAdminClient

    return AIOKafkaAdminClient(
        bootstrap_servers=kafka.bootstrap_servers,
        client_id=f"{kafka.client_id}-admin",
        request_timeout_ms=kafka.request_timeout_ms,
        **client_security(kafka.security),
    )


def _consumer(settings: RunSettings) -> AIOKafkaConsumer:
    from aiokafka import AIOKafkaConsumer

    return AIOKafkaConsumer(
        bootstrap_servers=settings.kafka.bootstrap_servers,
        client_id=settings.kafka.client_id,
        group_id=settings.group_id,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        isolation_level="read_committed",
        session_timeout_ms=settings.session_timeout_ms,
        heartbeat_interval_ms=max(100, settings.session_timeout_ms // 3),
        max_poll_interval_ms=settings.max_poll_interval_ms,
        request_timeout_ms=settings.kafka.request_timeout_ms,
        max_partition_fetch_bytes=4 * 1024 * 1024,
        fetch_max_wait_ms=settings.fetch_max_wait_ms,
        # partitions added to the input topic are seen at the next metadata refresh,
        # and only then assigned: with aiokafka's 5 minutes, events keyed to them waited
        # that long while /readyz said running and lag did not count them
        metadata_max_age_ms=METADATA_MAX_AGE_MS,
        **client_security(settings.kafka.security),
    )


def _producer(kafka: KafkaSettings, transactional_id: str | None = None) -> AIOKafkaProducer:
    from aiokafka import AIOKafkaProducer

    from streams.output import batch_bytes, compression_type

    # Plain producer (acks=all) unless transactional: idempotence needs producer ids, which
    # some Kafka-protocol brokers (tansu) do not implement. Order is kept by streams.output
    # sending whole record batches, one in flight per partition (so no lingering either).
    return AIOKafkaProducer(
        bootstrap_servers=kafka.bootstrap_servers,
        client_id=kafka.client_id,
        acks="all",
        linger_ms=0,
        max_batch_size=batch_bytes(kafka.max_message_bytes),
        compression_type=compression_type(kafka.compression),
        request_timeout_ms=kafka.request_timeout_ms,
        transactional_id=transactional_id,
        enable_idempotence=transactional_id is not None,
        **client_security(kafka.security),
    )


class MissingTopics(Exception):
    """A topic ``run`` needs does not exist, and ``--create-topics`` was not given (exit 2).

    Its own class: a ``LookupError`` was caught instead, and every ``KeyError`` or
    ``IndexError`` of a bug (limitflow's, aiokafka's) then ended ``run`` with exit 2, as a
    usage error, its key as the only line and no traceback."""


class StoppedBeforeStart(Exception):
    """A stop was asked for while the brokers could not be reached yet: nothing to finish."""


async def start_retrying(
    what: str,
    build: Callable[[], Any],
    stop: asyncio.Event,
    servers: str,
    retry_ms: tuple[int, int],
    health: Health | None = None,
) -> Any:
    """Start a client built by ``build``, retrying (rebuilt each time) while the brokers
    at ``servers`` cannot be reached, waiting ``retry_ms`` (first, longest) between tries,
    doubled each time; ``limitflow run``'s clients, and the faust app's probe.

    Meanwhile ``health`` shows it (state ``waiting``, ``waiting_on`` ``kafka``, a retry
    counted under the stage ``start``), as an outage is shown once running, and goes
    back to ``starting`` when the client has started. Raises ``StoppedBeforeStart`` once
    ``stop`` is set (it also ends the wait between tries): nothing was consumed, so
    stopping then is no failure."""
    from streams.ops import ConsumerState
    from streams.output import translate

    delay, ceiling = retry_ms[0] / 1000, retry_ms[1] / 1000
    began, tries = time.monotonic(), 0
    while True:
        if stop.is_set():
            raise StoppedBeforeStart(what)
        client = build()
        try:
            await client.start()
            if health is not None and health.state is ConsumerState.WAITING:
                health.set(ConsumerState.STARTING)
            if tries:
                log.info(
                    "%s reached Kafka at %s after %.1fs",
                    what,
                    servers,
                    time.monotonic() - began,
                    extra={"stage": "start", "retries": tries},
                )
            return client
        except Exception as exc:
            error = translate(exc)
            with contextlib.suppress(Exception):
                await (client.close() if hasattr(client, "close") else client.stop())
            if not getattr(error, "retriable", False):
                raise error from exc
            if stop.is_set():
                raise StoppedBeforeStart(what) from None
            tries += 1
            if health is not None:
                health.set(ConsumerState.WAITING, waiting_on="kafka")
                health.metrics.retries.labels("start").inc()
            log.warning(
                "%s cannot reach Kafka at %s; waiting for it, next try in %.1fs: %s",
                what,
                servers,
                delay,
                exc,
                extra={"stage": "start", "bootstrap_servers": servers},
            )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), delay)
            delay = min(ceiling, delay * 2)


async def ask_retrying(
    what: str,
    ask: Callable[[], Awaitable[_T]],
    unreachable: Callable[[BaseException], bool],
    stop: asyncio.Event,
    servers: str,
    retry_ms: tuple[int, int],
    health: Health | None = None,
) -> _T:
    """``ask()`` of a client started already, asked again while it fails with an error
    that is ``unreachable`` (no broker answered), as ``start_retrying`` starts a client: the
    brokers the bootstrap servers named may not be reached (an advertised listener this
    host cannot reach, brokers gone since the start). Their first failure ended ``run``
    with exit 1 and a traceback, where it waits for brokers it cannot reach."""
    from streams.ops import ConsumerState

    delay, ceiling = retry_ms[0] / 1000, retry_ms[1] / 1000
    while True:
        if stop.is_set():
            raise StoppedBeforeStart(what)
        try:
            answer = await ask()
        except Exception as exc:
            if not unreachable(exc):
                raise
            if stop.is_set():
                raise StoppedBeforeStart(what) from None
            if health is not None:
                health.set(ConsumerState.WAITING, waiting_on="kafka")
                health.metrics.retries.labels("start").inc()
            log.warning(
                "%s cannot reach the Kafka brokers that %s named; waiting for them,"
                " next try in %.1fs: %s",
                what,
                servers,
                delay,
                str(exc) or type(exc).__name__,
                extra={"stage": "start", "bootstrap_servers": servers},
            )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), delay)
            delay = min(ceiling, delay * 2)
            continue
        if health is not None and health.state is ConsumerState.WAITING:
            health.set(ConsumerState.STARTING)
        return answer


def _no_broker_answered(exc: BaseException) -> bool:
    """Whether ``exc`` of a request to the brokers says that none of them answered."""
    from aiokafka.errors import KafkaError  # type: ignore[import-untyped]

    from streams.output import translate

    return (
        type(exc) is KafkaError
        or isinstance(exc, OSError)
        or bool(getattr(translate(exc), "retriable", False))
    )


def _version() -> str:
    """The installed distribution's version."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("limitflow")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown"


_HURRIED_CLOSE: Final = 2.0
"""The least seconds each Kafka client is given to close after a stop, and all it is
given once the stop's grace ran out on an outage."""


def _close_within(runner: VelocityConsumer | None) -> float | None:
    """Seconds each Kafka client may take to close after a stop: what is left of the
    stop's grace, at least ``_HURRIED_CLOSE`` (that alone once the grace ran out on an
    outage); None without a stop under way (the clients' own bounds)."""
    if runner is None:
        return None
    if runner.gave_up:
        return _HURRIED_CLOSE
    left = runner.grace_left(time.monotonic())
    return None if left is None else max(_HURRIED_CLOSE, left)


async def _close_clients(
    output: Output | None, consumer: AIOKafkaConsumer | None, runner: VelocityConsumer | None
) -> None:
    """Close the producers, then the consumer, each within what is left of a stop's grace
    when it starts (``_close_within``): the consumer was given what had been left before
    the producers closed, so a stop could take twice what was left (30 s: a batch ending
    5 s into the grace, then brokers that stopped answering), past an orchestrator's grace."""
    if output is not None:
        await output.close(_close_within(runner))
    if consumer is not None:
        await _close_consumer(consumer, _close_within(runner))


def _unanswered_at_close(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """asyncio's handler of unretrieved errors while the Kafka clients close after a stop
    (within what is left of its grace): the requests aiokafka still had in flight fail
    then, and their futures' errors were logged at ERROR with a traceback, for a close
    that went as intended."""
    from aiokafka.errors import KafkaError

    exc = context.get("exception")
    if isinstance(exc, KafkaError | OSError | TimeoutError):
        log.info("a Kafka request was left unanswered at the close: %s", type(exc).__name__)
        return
    loop.default_exception_handler(context)


async def _close_consumer(consumer: AIOKafkaConsumer, within: float | None = None) -> None:
    """Leave the group and close, in 15 s at most (``within``: at most that); with the
    brokers gone this may fail, which must not turn a clean stop into a crash: every
    offset that matters is committed already."""
    try:
        await asyncio.wait_for(consumer.stop(), 15 if within is None else min(15, within))
    except asyncio.CancelledError:
        # aiokafka's fetcher, closing, awaits its own fetch task, which it cancelled, and
        # that cancellation comes out here when the brokers are gone. Only this task's
        # own cancellation goes on.
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            raise
        log.warning("the consumer closed without reaching the brokers")
    except Exception as exc:  # closing: say it, and exit as asked
        log.warning("the consumer did not close cleanly: %s", str(exc) or type(exc).__name__)


async def _topics_create(args: argparse.Namespace) -> int:
    from aiokafka.errors import KafkaConnectionError

    from limitflow.cli import EXIT_OK, CommandFailed
    from limitflow.console import out, say
    from limitflow.errors import BrokerError
    from streams.topics import TopicError, create_topics

    settings: TopicSettings = _settings(lambda: load_topic_settings(_values(args), os.environ))
    for name in unknown_variables(os.environ):  # as run warns (a misspelt partition count)
        say(f"limitflow: {name} is not a limitflow setting: ignored (misspelt?)")
    # a one-shot command says what went wrong in its one line: aiokafka's own log lines
    # (each failed connection, at ERROR) would come before it, raw, on stderr
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    admin = _admin(settings.kafka)
    try:
        await admin.start()
        outcome = await create_topics(admin, settings)
    except (TopicError, BrokerError) as exc:
        raise CommandFailed(str(exc), EXIT_BROKER) from None
    except KafkaConnectionError:
        raise CommandFailed(
            f"cannot reach Kafka at {settings.kafka.bootstrap_servers}:"
            " check --bootstrap-servers (LIMITFLOW_BOOTSTRAP_SERVERS) and that the brokers run",
            EXIT_BROKER,
        ) from None
    except Exception as exc:
        from streams.output import translate

        raise CommandFailed(f"kafka: {translate(exc)}", EXIT_BROKER) from None
    finally:
        await admin.close()
    for name, what in outcome.items():
        out(f"{name}: {what}")
    return EXIT_OK


def _run_command(args: argparse.Namespace) -> int:
    """``limitflow run``. Its stop signals are caught from here on, if the console script
    has not caught them already: a stop before ``serve`` handles them is recorded, and
    ends the run before it consumes anything (exit 0). Those the console script caught
    stay ignored until the process ends (``StopSignals.done``); others are restored."""
    owned = StopSignals.installed is None
    signals = StopSignals.install()
    try:
        return asyncio.run(_run(args, signals))
    finally:
        if owned:
            StopSignals.restore()


async def _run(args: argparse.Namespace, signals: StopSignals) -> int:
    try:
        return await _load_and_serve(args, signals)
    finally:
        signals.done()


async def _load_and_serve(args: argparse.Namespace, signals: StopSignals) -> int:
    stop = signals.attach()
    from limitflow.cli import EXIT_OK, EXIT_STORE, EXIT_USAGE, CommandFailed, _rules
    from limitflow.errors import BrokerError, StoreError
    from streams.engine import fewer_collections
    from streams.ops import OpsUnavailable, configure_logging
    from streams.topics import TopicError

    settings = _settings(lambda: load_run_settings(_values(args), os.environ))
    configure_logging(settings.log_level, settings.log_format)
    for name in unknown_variables(os.environ):
        log.warning("%s is not a limitflow setting: ignored (misspelt?)", name)
    if not settings.create_topics:
        for flag in ("partitions", "replication_factor"):
            if getattr(args, flag, None) is not None:  # a variable may serve topics create
                log.warning(
                    "--%s is for topics created at start: ignored without --create-topics",
                    flag.replace("_", "-"),
                )
    rules = _rules(settings.rules)
    store = await store_unless_stopped(settings.store, rules, stop)
    if store is None:
        name = signals.received.name if signals.received else "a signal"
        log.info("stopped by %s before starting; nothing was consumed", name)
        return EXIT_OK
    try:
        with fewer_collections():
            return await serve(settings, rules, store, signals)
    except StoreError as exc:
        log.error("store failed for good: %s", exc)
        raise CommandFailed(f"store: {exc}", EXIT_STORE) from None
    except BrokerError as exc:
        log.error("kafka failed for good: %s", exc)
        raise CommandFailed(f"kafka: {exc}", EXIT_BROKER) from None
    except TopicError as exc:  # --create-topics refused, as `limitflow topics create` says
        raise CommandFailed(str(exc), EXIT_BROKER) from None
    except MissingTopics as exc:
        raise CommandFailed(str(exc), EXIT_USAGE) from None
    except OpsUnavailable as exc:
        raise CommandFailed(str(exc), EXIT_USAGE) from None
    finally:
        await store.close()  # type: ignore[attr-defined]
    return EXIT_OK


async def store_unless_stopped(
    url: str,
    rules: Any,
    stop: asyncio.Event,
    *,
    consumer: bool = True,
    create: bool = True,
    stopping: Callable[[], bool] | None = None,
) -> object | None:
    """The store of ``url``, opened as ``open_ready_store`` does (for a consumer, whose
    sqlite lock waits are short, see ``CONSUMER_LOCK_WAIT``; ``create``: see
    ``open_ready_store``); None if ``stop`` is set
    first, also while the store's servers are waited for (a store that blocks the loop,
    sqlite waiting for another process's lock, is left when its wait ends, or at once
    where ``stopping`` tells of the stop without the loop: see ``Store.stopping``)."""
    from limitflow.cli import open_ready_store
    from limitflow.errors import StoppedOpening
    from stores.sqlite import CONSUMER_LOCK_WAIT

    if stop.is_set():
        return None
    lock_wait = CONSUMER_LOCK_WAIT if consumer else None
    opening = asyncio.ensure_future(
        open_ready_store(url, rules, lock_wait=lock_wait, create=create, stopping=stopping)
    )
    stopped = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait((opening, stopped), return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        opening.cancel()
        raise
    finally:
        stopped.cancel()
    if not stop.is_set():
        try:
            return opening.result()  # or its CommandFailed
        except StoppedOpening:
            return None
    opening.cancel()
    try:
        store = await opening
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            raise
        return None
    except Exception:  # it failed meanwhile: stopping all the same
        return None
    await store.close()  # type: ignore[attr-defined]
    return None


async def serve(
    settings: RunSettings, rules: Any, store: Any, signals: StopSignals | None = None
) -> int:
    """Run the consumer with ``store`` until SIGTERM/SIGINT (handlers installed here).

    ``signals``: those of ``run``, before these handlers: one received already stops at
    once, and a signal after this returns is logged, not fatal."""

    from handlers.decide import Decider, OutcomeKind
    from stores.base import redacted
    from streams.consumer import VelocityConsumer
    from streams.engine import Engine
    from streams.ops import Health, Metrics, OpsServer
    from streams.output import AtLeastOnceOutput, TransactionalOutput
    from streams.topics import create_topics

    metrics = Metrics()
    health = Health(metrics)
    ops = OpsServer(health, settings.http_host, settings.http_port) if settings.http_port else None
    if ops:
        await ops.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    runner: VelocityConsumer | None = None

    closing = False

    def on_signal(sig: signal.Signals) -> None:
        if closing:
            log.info("received %s: already closing the Kafka clients", sig.name)
            return
        log.info("received %s", sig.name)
        if runner is not None:
            runner.request_stop(now=stop.is_set())
        stop.set()

    if signals is not None:
        signals.take(on_signal)  # and one received already comes now
    else:
        for sig in SIGNALS:
            loop.add_signal_handler(sig, on_signal, sig)
    consumer = producer = None
    output: Output | None = None
    kafka = settings.kafka
    retry_ms = (settings.retry_initial_ms, settings.retry_max_ms)

    waiting = (stop, kafka.bootstrap_servers, retry_ms, health)

    async def start(what: str, build: Callable[[], Any]) -> Any:
        return await start_retrying(what, build, *waiting)

    in_force = {
        "version": _version(),
        "bootstrap_servers": kafka.bootstrap_servers,
        "input_topic": kafka.input_topic,
        "output_topic": kafka.output_topic,
        "dead_letter_topic": kafka.dead_letter_topic,
        "group_id": settings.group_id,
        "guarantee": settings.guarantee.value,
        "security_protocol": kafka.security.security_protocol,
        "sasl_username": kafka.security.sasl_username or None,
        "store": redacted(settings.store),
        "batch_size": settings.batch_size,
        "rules": settings.rules,
        "rules_version": rules.version,
        "ops": f"http://{settings.http_host}:{settings.http_port}/" if settings.http_port else None,
    }
    # the settings in force before the brokers are waited for (which may take long),
    # and again once consuming
    log.info("starting", extra=in_force)
    try:
        if settings.create_topics:
            admin = await start("admin", lambda: _admin(kafka))
            try:
                # a request no broker answers times out (an advertised listener this host
                # cannot reach): waited for, as brokers that cannot be reached are
                await ask_retrying(
                    "admin",
                    lambda: create_topics(admin, settings.topics),
                    lambda exc: isinstance(exc, TimeoutError),
                    *waiting,
                )
            finally:
                await admin.close()
        consumer = await start("consumer", lambda: _consumer(settings))
        # the brokers' metadata: aiokafka says that no broker answered with a bare
        # KafkaError; one of its subclasses that is not retriable (authorisation) is final
        existing = await ask_retrying("consumer", consumer.topics, _no_broker_answered, *waiting)
        missing = [
            t
            for t in (kafka.input_topic, kafka.output_topic, kafka.dead_letter_topic)
            if t not in existing
        ]
        if missing:
            raise MissingTopics(
                f"missing topics {', '.join(missing)}: run `limitflow topics create` "
                "or pass --create-topics"
            )
        if settings.guarantee is Guarantee.EXACTLY_ONCE:
            output = TransactionalOutput(
                lambda tid: _producer(kafka, tid),
                consumer,
                settings.group_id,
                timeout=kafka.request_timeout_ms / 1000,
            )
        else:
            producer = await start("producer", lambda: _producer(kafka))
            output = AtLeastOnceOutput(producer, consumer, timeout=kafka.request_timeout_ms / 1000)
        engine = Engine(Decider(rules), store)
        runner = VelocityConsumer(settings, engine, consumer, output, health, metrics)
        log.info("consuming", extra=in_force)
        runner.subscribe()
        if stop.is_set():
            runner.request_stop()
        started = time.monotonic()
        await runner.run()
        log.info(
            "ran for %.1fs",
            time.monotonic() - started,
            # every kind, none left out for being 0 (a dashboard reads the fields)
            extra={f"{kind.value}s": engine.stats.by_kind.get(kind, 0) for kind in OutcomeKind},
        )
    except StoppedBeforeStart as exc:
        log.info("stopped before the %s could reach Kafka; nothing was consumed", exc)
    finally:
        # the handlers stay until the clients are closed: a second signal during the
        # close (up to 25 s) must not kill the process before it leaves its group
        closing = True
        # each client's close is bounded (10 s the producers, 15 s the consumer), and,
        # after a stop, by what is left of its grace, at least 2 s: a stop that an
        # outage held to the end of its grace (the brokers not answering, and nothing
        # the clients hold needed: the abandoned batch is read again) took up to 25 s
        # more, past an orchestrator's grace
        if _close_within(runner) is not None:
            loop.set_exception_handler(_unanswered_at_close)
        await _close_clients(output, consumer, runner)
        if ops:
            await ops.stop()
        if signals is not None:
            signals.hand_back()
        else:
            for sig in SIGNALS:
                loop.remove_signal_handler(sig)
    return 0
