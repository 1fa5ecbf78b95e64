"""Operating the consumer: its state, JSON logs, Prometheus metrics and the ops endpoint.

The endpoint is a minimal HTTP/1.1 server on asyncio streams (``GET`` and ``HEAD`` only,
one request per connection), so no web framework is needed for three read-only paths:

    /healthz   200 while the process is working or waiting out an outage; 503 once failed
    /readyz    200 once the consumer has joined its group and while its last store and
               broker operations succeeded; 503 while starting, waiting on an outage
               (retrying), stopping or failed. A consumer without records asks the
               brokers every 2 s whether they answer (``waiting_on: fetch`` if not).
    /metrics   Prometheus text format
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import json
import logging
import os
import socket
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any, Final

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

log = logging.getLogger("limitflow.ops")


class ConsumerState(enum.Enum):
    """Where the consumer is in its life."""

    STARTING = "starting"
    RUNNING = "running"
    WAITING = "waiting"
    """A retriable failure (store or broker): consumption paused, retrying with backoff."""
    STOPPING = "stopping"
    STOPPED = "stopped"
    FAILED = "failed"


_LIVE: Final = frozenset(
    {ConsumerState.STARTING, ConsumerState.RUNNING, ConsumerState.WAITING, ConsumerState.STOPPING}
)
_STANDARD_ATTRS: Final = frozenset(
    logging.LogRecord("", 0, "", 0, "", (), None).__dict__.keys() | {"message", "asctime"}
)


class JsonFormatter(logging.Formatter):
    """One JSON object a line: time, level, logger, message and any ``extra`` fields."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        doc.update(_extras(record))
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return json.dumps(doc, default=str)


def _extras(record: logging.LogRecord) -> dict[str, Any]:
    """The ``extra`` fields of a record: what it says beyond its message."""
    return {
        key: value
        for key, value in record.__dict__.items()
        if key not in _STANDARD_ATTRS and not key.startswith("_")
    }


class TextFormatter(logging.Formatter):
    """A line for people: time, level, logger, message, then the ``extra`` fields as
    ``key=value`` (the topic, the partitions, the URL a line is about)."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        extras = _extras(record)
        if not extras:
            return line
        fields = " ".join(f"{k}={json.dumps(v, default=str)}" for k, v in extras.items())
        head, sep, rest = line.partition("\n")  # a traceback stays below the line
        return f"{head} [{fields}]{sep}{rest}"


class KafkaClientThrottle(logging.Filter):
    """Let each of aiokafka's messages through once per ``every`` seconds.

    While the brokers are away aiokafka logs every failed reconnect and metadata update at
    ERROR, ~100 lines a second; the consumer reports the outage itself (``waiting_on``,
    its own warnings). The first of a kind goes through, the same kind again only after
    ``every`` seconds, with ``suppressed`` saying how many were left out meanwhile."""

    def __init__(self, every: float = 10.0, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.every = every
        self.clock = clock
        self._kinds: dict[tuple[str, str], tuple[float, int]] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.name.startswith("aiokafka"):
            return True
        # the message before its arguments (as text: a record's msg may be any object)
        kind = (record.name, str(record.msg))
        now = self.clock()
        seen = self._kinds.get(kind)
        if seen is not None and now - seen[0] < self.every:
            self._kinds[kind] = (seen[0], seen[1] + 1)
            return False
        if seen is not None and seen[1]:
            record.suppressed = seen[1]
        if len(self._kinds) > 1_000:  # kinds keyed by message: bounded all the same
            self._kinds.clear()
        self._kinds[kind] = (now, 0)
        return True


def unseen_fence(record: logging.LogRecord) -> bool:
    """False for asyncio's report of a fenced producer's failure that no one retrieved.

    aiokafka sets a fenced transactional producer's failure on futures of its own (the
    transaction's waiter, its batches' drain waiters) that no one awaits once the producer
    is discarded; asyncio then logged each, when collected, at ERROR with a traceback
    (1-2 lines a takeover, 21-23 while members fenced each other until a heartbeat),
    while ``run`` has handled the fence and said so ("batch abandoned …: partition
    ownership lost: ProducerFenced")."""
    if record.name != "asyncio" or not record.exc_info or record.exc_info[1] is None:
        return True
    exc = record.exc_info[1]
    return not (
        str(record.msg).startswith("Future exception was never retrieved")
        and type(exc).__module__.startswith("aiokafka")
        and type(exc).__name__ in ("ProducerFenced", "InvalidProducerEpoch")
    )


class OffsetResets(logging.Filter):
    """aiokafka's word that a partition's fetch offset is out of range, made a warning
    of limitflow's (logged as ``name``) and counted (``limitflow_offset_resets_total``,
    where the runtime has metrics: ``counter``).

    The brokers no longer hold that offset: retention deleted the records there before
    they were decided (a consumer stopped for longer than the topic's retention), or
    the topic was deleted and made again. The consumer reads on from the earliest offset
    kept (``auto_offset_reset=earliest``): records deleted are never decided, and those
    of a re-created topic are read and deduplicated. aiokafka says so at INFO, which the
    log's level for aiokafka (WARNING) left out: records were skipped without a word."""

    LOGGER: Final = "aiokafka.consumer.fetcher"

    def __init__(self, counter: Counter | None, name: str = "limitflow.consumer") -> None:
        super().__init__()
        self.counter = counter
        self.logger_name = name

    def filter(self, record: logging.LogRecord) -> bool:
        text = str(record.msg)
        if not (text.startswith("Fetch offset") and "out of range" in text):
            return True
        args = record.args if isinstance(record.args, tuple) else ()
        offset, tp = (*args, None, None)[:2]
        partition = getattr(tp, "partition", None)
        if self.counter is not None:
            self.counter.labels(str(partition)).inc()
        record.levelno, record.levelname = logging.WARNING, "WARNING"
        record.name = self.logger_name  # limitflow's word now, not aiokafka's
        topic = getattr(tp, "topic", None)
        where = f"{topic}:{partition}" if partition is not None else str(tp)
        record.msg = (
            f"input partition {where}: offset {offset} is out of range: the brokers no longer"
            " hold it (deleted by retention, or the topic made again); reading goes on from"
            " the earliest offset kept, and records deleted before they were decided are not"
        )
        record.args = ()
        # the fetcher's logger lets INFO through for this record alone: a warning now, it
        # shows only where limitflow's own warnings do (not at --log-level ERROR)
        return logging.getLogger(self.logger_name).isEnabledFor(logging.WARNING)

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        """This filter on aiokafka's fetcher logger, which is set to let its INFO through
        (its only message at INFO is this one) while the block runs."""
        fetcher = logging.getLogger(self.LOGGER)
        level = fetcher.level
        fetcher.setLevel(logging.INFO)
        fetcher.addFilter(self)
        try:
            yield
        finally:
            fetcher.removeFilter(self)
            fetcher.setLevel(level)


def configure_logging(level: str, fmt: str) -> None:
    """Send every log record to stderr as JSON (``fmt="json"``) or plain text, aiokafka's
    repeated ones throttled (``KafkaClientThrottle``), asyncio's reports of fences
    already handled left out (``unseen_fence``)."""
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    handler.addFilter(KafkaClientThrottle())
    handler.addFilter(unseen_fence)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # aiokafka logs every failed reconnect at ERROR; the consumer reports outages itself
    logging.getLogger("aiokafka").setLevel(max(logging.WARNING, root.level))
    quiet_secret_loggers(root.level)


SECRET_LOGGERS: Final = ("botocore", "aiobotocore", "boto3", "urllib3", "pymongo")
"""Drivers whose DEBUG records hold credentials (botocore's signed request headers, an
AWS session token among them) or the documents written (pymongo's commands: bucket
keys, whose scope values may be a card number, which PCI DSS keeps out of logs)."""


def quiet_secret_loggers(level: int) -> None:
    """Keep the ``SECRET_LOGGERS`` at INFO or above, whatever the log's level."""
    for name in SECRET_LOGGERS:
        logging.getLogger(name).setLevel(max(logging.INFO, level))


class Metrics:
    """The consumer's Prometheus metrics, in a registry of their own."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.events = Counter(
            "limitflow_events",
            "Input records consumed (a batch read again after an outage or a rebalance"
            " counts again; verdicts and dead letters count each record once per publish)",
            registry=r,
        )
        self.verdicts = Counter(
            "limitflow_verdicts",
            "Verdicts published, by decision and reason (duplicates repeat the original's)",
            ["decision", "reason", "duplicate"],
            registry=r,
        )
        self.dead_letters = Counter(
            "limitflow_dead_letters", "Dead letters published, by error", ["error"], registry=r
        )
        self.batch_size = Histogram(
            "limitflow_batch_size",
            "Records per batch",
            buckets=(1, 10, 50, 100, 250, 500, 1000, 2000, 5000, 10000),
            registry=r,
        )
        self.decision_seconds = Histogram(
            "limitflow_decision_seconds",
            "Time to decide and durably store one batch (Engine.process), retries included",
            registry=r,
        )
        self.batch_seconds = Histogram(
            "limitflow_batch_seconds",
            "Time from a batch's arrival to its offsets being committed",
            registry=r,
        )
        self.offset_resets = Counter(
            "limitflow_offset_resets",
            "Fetch offsets the brokers no longer hold (deleted by retention, or past the"
            " end of a re-created topic), by input partition: reading went on from the"
            " earliest offset kept, and deleted records were never decided",
            ["partition"],
            registry=r,
        )
        self.lag = Gauge(
            "limitflow_consumer_lag",
            "Records not yet consumed, by input partition (high watermark - position)",
            ["partition"],
            registry=r,
        )
        self.store_round_trips = Counter(
            "limitflow_store_round_trips", "Requests sent to the state store", registry=r
        )
        self.store_conflicts = Counter(
            "limitflow_store_conflicts",
            "Commits refused because another writer changed a record they read (another"
            " member on a shared bucket, or a zombie): the batch's rest is read and decided"
            " again. Many mean contention on hot buckets",
            registry=r,
        )
        self.store_expired_deleted = Counter(
            "limitflow_store_expired_deleted",
            "Expired buckets and records deleted by the consumer's commits (sqlite)",
            registry=r,
        )
        self.retries = Counter(
            "limitflow_retries",
            "Retriable failures, by stage (start, assign, decide, publish, fetch)",
            ["stage"],
            registry=r,
        )
        self.commits = Counter(
            "limitflow_offset_commits",
            "Offset commits that succeeded (under exactly-once: transactions, one for each"
            " input partition of a batch)",
            registry=r,
        )
        self.state = Gauge(
            "limitflow_consumer_state", "1 for the consumer's current state", ["state"], registry=r
        )

    def set_state(self, state: ConsumerState) -> None:
        for each in ConsumerState:
            self.state.labels(each.value).set(1 if each is state else 0)


class Health:
    """What the ops endpoint reports; updated by the consumer."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics
        self.state = ConsumerState.STARTING
        self.assigned: frozenset[str] = frozenset()
        self.waiting_on: str | None = None
        self.last_batch_at: float | None = None
        self.rebalancing = False
        """Between a revocation (aiokafka's, before every join) and the next assignment:
        the member owns nothing and is joining its group again (``set_rebalancing``)."""
        metrics.set_state(self.state)

    def set(self, state: ConsumerState, waiting_on: str | None = None) -> None:
        self.state = state
        self.waiting_on = waiting_on
        self.metrics.set_state(self._shown_state)

    def set_rebalancing(self, rebalancing: bool) -> None:
        self.rebalancing = rebalancing
        self.metrics.set_state(self._shown_state)

    @property
    def _joining(self) -> bool:
        """Running, but joining the group again: shown as waiting on it."""
        return self.state is ConsumerState.RUNNING and self.rebalancing

    @property
    def _shown_state(self) -> ConsumerState:
        return ConsumerState.WAITING if self._joining else self.state

    @property
    def live(self) -> bool:
        return self.state in _LIVE

    @property
    def ready(self) -> bool:
        return self._shown_state is ConsumerState.RUNNING

    def describe(self) -> dict[str, Any]:
        return {
            "state": self._shown_state.value,
            "waiting_on": "group" if self._joining else self.waiting_on,
            "assigned": sorted(self.assigned),
            "seconds_since_last_batch": None
            if self.last_batch_at is None
            else round(time.monotonic() - self.last_batch_at, 3),
        }


class OpsUnavailable(Exception):
    """The ops endpoint cannot listen where it was told to (port taken, no such address)."""


class OpsServer:
    """``/healthz``, ``/readyz`` and ``/metrics`` over HTTP on ``host:port``."""

    patience_s: float = 5.0
    """How long a client has to send its request, and then to take the answer: one that
    stops reading is cut off (on Python 3.12 and later ``stop`` waits for every open
    connection, so one held open for good held the shutdown with it)."""

    def __init__(self, health: Health, host: str, port: int) -> None:
        self.health = health
        self.host = host
        self.port = port
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        try:
            self._server = await asyncio.start_server(self._serve, self.host, self.port)
        except OSError as exc:  # also socket.gaierror: a host name that does not resolve
            code = None if isinstance(exc, socket.gaierror) else exc.errno
            reason = os.strerror(code) if code else (exc.strerror or str(exc))
            raise OpsUnavailable(
                f"ops endpoint {self.host}:{self.port}: {reason}"
                " (set --http-port / LIMITFLOW_HTTP_PORT to a free port, or 0 for none;"
                " --http-host to an address of this machine)"
            ) from None
        self.port = self._server.sockets[0].getsockname()[1]
        log.info("ops endpoint listening", extra={"url": f"http://{self.host}:{self.port}/"})

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        patience = self.patience_s
        try:
            request = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), patience)
            parts = request.decode("latin-1").split("\r\n", 1)[0].split(" ")
            if len(parts) == 3 and parts[0] and parts[1] and parts[2].startswith("HTTP/"):
                method, path = parts[0], parts[1].split("?", 1)[0]
                # HEAD is GET without the body (a monitor's check; the body made it a
                # malformed answer), and a 405 says what is allowed, as HTTP requires
                status, ctype, body = self._answer("GET" if method == "HEAD" else method, path)
            else:  # not "METHOD TARGET HTTP/x": no method to refuse, the request is bad
                method, status, ctype = "", "400 Bad Request", "text/plain"
                body = b"a request line is METHOD TARGET HTTP/1.1\n"
            allow = "Allow: GET, HEAD\r\n" if status.startswith("405") else ""
            writer.write(
                f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\n{allow}"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode("latin-1")
                + (b"" if method == "HEAD" else body)
            )
            await asyncio.wait_for(writer.drain(), patience)
        except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, OSError):
            pass
        finally:
            writer.close()  # sends what is buffered first: a client that reads nothing
            try:  # waits for ever then, unless cut off
                await asyncio.wait_for(writer.wait_closed(), patience)
            except TimeoutError:
                writer.transport.abort()
            except OSError:
                pass

    def _answer(self, method: str, path: str) -> tuple[str, str, bytes]:
        if method != "GET":
            return "405 Method Not Allowed", "text/plain", b"GET or HEAD only\n"
        if path == "/metrics":
            return "200 OK", CONTENT_TYPE_LATEST, generate_latest(self.health.metrics.registry)
        if path in ("/healthz", "/readyz"):
            ok = self.health.live if path == "/healthz" else self.health.ready
            body = json.dumps(self.health.describe()).encode() + b"\n"
            return ("200 OK" if ok else "503 Service Unavailable"), "application/json", body
        return "404 Not Found", "text/plain", b"try /healthz, /readyz or /metrics\n"
