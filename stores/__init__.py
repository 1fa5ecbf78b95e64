"""State store backends, chosen by URL in one place: ``open_store``."""

from __future__ import annotations

import time
from collections.abc import Callable
from urllib.parse import parse_qs, urlsplit

from limitflow.errors import ConfigError
from stores.base import DAY, Retention, Store

SCHEMES = ("memory", "sqlite", "mongodb", "dynamodb")


def _retention(query: dict[str, list[str]]) -> Retention:
    """``bucket_retention_days`` / ``event_retention_days`` from a store URL's query."""
    defaults = Retention()
    try:
        bucket_days = query.pop("bucket_retention_days", None)
        event_days = query.pop("event_retention_days", None)
        return Retention(
            bucket_seconds=int(float(bucket_days[0]) * DAY)
            if bucket_days
            else defaults.bucket_seconds,
            event_seconds=int(float(event_days[0]) * DAY) if event_days else defaults.event_seconds,
        )
    except ValueError as exc:
        raise ConfigError(f"retention days must be numbers: {exc}") from None


def open_store(url: str, clock: Callable[[], float] = time.time) -> Store:
    """Build the store a URL names: ``memory://``, ``sqlite:///PATH``, ``mongodb://…``,
    ``dynamodb://PREFIX?endpoint_url=…``. Nothing is contacted until first use.

    ``clock`` is the wall clock used only for record expiry (tests inject one).
    """
    parts = urlsplit(url)
    query = parse_qs(parts.query)
    retention = _retention(query)
    if parts.scheme == "memory":
        from stores.memory import MemoryStore

        return MemoryStore(retention, clock)
    if parts.scheme == "sqlite":
        from stores.sqlite import SqliteStore

        # SQLAlchemy's convention: sqlite:///relative.db, sqlite:////absolute/path.db
        path = url[len("sqlite:///") :].split("?", 1)[0] if url.startswith("sqlite:///") else ""
        if not path:
            raise ConfigError(f"{url}: expected sqlite:///PATH")
        return SqliteStore(path, retention, clock=clock)
    if parts.scheme in ("mongodb", "mongodb+srv"):
        from stores.mongo import MongoStore

        return MongoStore.from_url(url, retention, clock)
    if parts.scheme == "dynamodb":
        from stores.dynamo import DynamoStore

        return DynamoStore.from_url(url, retention, clock)
    raise ConfigError(f"{url}: unknown store; use one of {', '.join(s + '://' for s in SCHEMES)}")
