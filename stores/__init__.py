"""State store backends, chosen by URL in one place: ``open_store``."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from urllib.parse import parse_qs, urlsplit

from limitflow.errors import ConfigError
from stores.base import DAY, LATEST_EXPIRY, RETENTION_PARAMS, Retention, Store, redacted

SCHEMES = ("memory", "sqlite", "mongodb", "dynamodb")


def _retention(query: dict[str, list[str]]) -> Retention:
    """``bucket_retention_days`` / ``event_retention_days`` from a store URL's query."""
    defaults = Retention()
    return Retention(
        bucket_seconds=_seconds(query, "bucket_retention_days", defaults.bucket_seconds),
        event_seconds=_seconds(query, "event_retention_days", defaults.event_seconds),
    )


def _seconds(query: dict[str, list[str]], name: str, default: int) -> int:
    """A retention in whole seconds, at least one. Zero or less would write every record
    already expired: each limit reads as empty, a resend is decided again. A longer one
    than ``LATEST_EXPIRY`` seconds is taken as that: no record expires later anyway
    (and ``1e308`` days is a number of seconds past what a float holds)."""
    given = query.pop(name, None)
    if not given:
        return default
    if len(given) > 1:  # the first one was taken, and an appended override ignored
        raise ConfigError(f"{name}: given {len(given)} times; give it once")
    try:
        days = float(given[0])
    except ValueError:
        raise ConfigError(f"{name}: {given[0]!r} is not a number of days") from None
    if not math.isfinite(days) or days * DAY < 1:
        raise ConfigError(f"{name}: {given[0]!r} must be a finite number of days, at least 1 s")
    return int(min(days * DAY, LATEST_EXPIRY))


def embedded(url: str) -> tuple[Retention, str | None]:
    """The retention a store URL gives, and its file for ``sqlite:///PATH`` (else None),
    with every check ``open_store`` makes of an embedded store's URL before it opens it
    (a sqlite file is made as it is opened): a ``ConfigError``."""
    parts = urlsplit(url)
    # MongoDB URIs may separate options with ";" too: read them all as the driver does;
    # blank ones too (dropped, `?bucket_retention_days=` kept the default without a word)
    query = parse_qs(parts.query.replace(";", "&"), keep_blank_values=True)
    retention = _retention(query)
    if parts.scheme in ("memory", "sqlite") and query:
        # the server stores refuse options they do not know; so do these: a misspelt
        # retention must not silently keep the default
        raise ConfigError(
            f"{redacted(url)}: unknown option {', '.join(sorted(query))}"
            f" ({' and '.join(sorted(RETENTION_PARAMS))} are known)"
        )
    if parts.scheme == "memory" and (parts.netloc or parts.path):
        raise ConfigError(f"{redacted(url)}: expected memory:// (it takes no host or path)")
    if parts.scheme != "sqlite":
        return retention, None
    # SQLAlchemy's convention: sqlite:///relative.db, sqlite:////absolute/path.db
    path = url[len("sqlite:///") :].split("?", 1)[0] if url.startswith("sqlite:///") else ""
    if not path:
        raise ConfigError(f"{redacted(url)}: expected sqlite:///PATH")
    return retention, path


def open_store(
    url: str,
    clock: Callable[[], float] = time.time,
    *,
    lock_wait: float | None = None,
    password: str | None = None,
    wal: bool = True,
) -> Store:
    """Build the store a URL names: ``memory://``, ``sqlite:///PATH``, ``mongodb://…``,
    ``dynamodb://PREFIX?endpoint_url=…``. Nothing is contacted until first use.

    ``clock`` is the wall clock used only for record expiry (tests inject one).
    ``lock_wait``: seconds a sqlite store waits for another process's write lock before
    a commit fails as unavailable (default ``stores.sqlite.LOCK_WAIT``).
    ``password``: of a MongoDB store whose URL names its user alone (other stores have
    none: not used).
    ``wal``: a sqlite file is switched to WAL (else left in its journal mode, for a
    command that writes nothing: see ``stores.sqlite._open``).
    """
    parts = urlsplit(url)
    retention, path = embedded(url)
    if parts.scheme == "memory":
        from stores.memory import MemoryStore

        return MemoryStore(retention, clock)
    if path is not None:
        from stores.sqlite import LOCK_WAIT, SqliteStore

        return SqliteStore(
            path,
            retention,
            clock=clock,
            lock_wait=LOCK_WAIT if lock_wait is None else lock_wait,
            wal=wal,
        )
    try:
        if parts.scheme in ("mongodb", "mongodb+srv"):
            from stores.mongo import MongoStore

            return MongoStore.from_url(url, retention, clock, password=password)
        if parts.scheme == "dynamodb":
            from stores.dynamo import DynamoStore

            return DynamoStore.from_url(url, retention, clock)
    except ValueError as exc:  # the drivers' word on a port or host they cannot use
        raise ConfigError(f"{redacted(url)}: {exc}") from None
    raise ConfigError(
        f"{redacted(url)}: unknown store; use one of {', '.join(s + '://' for s in SCHEMES)}"
    )
