"""One store contract, every backend: ``SUPPORTED_STORES`` parametrizes ``store_url``.

memory and sqlite need nothing; mongodb and dynamodb start a real server (or the best
local emulator) once per session through ``tests.servers``.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

SUPPORTED_STORES = ["memory", "sqlite", "mongodb", "dynamodb"]
_names = itertools.count()


@pytest.fixture(scope="session")
def mongo_uri() -> Iterator[str]:
    from tests.servers import mongo_server

    with mongo_server() as server:
        yield server.uri


@pytest.fixture(scope="session")
def dynamodb_endpoint() -> Iterator[str]:
    from tests.servers import dynamodb_local

    os.environ.setdefault("AWS_ACCESS_KEY_ID", "test")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "test")
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    with dynamodb_local() as server:
        yield server.endpoint_url


@pytest.fixture(params=SUPPORTED_STORES)
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A URL naming a fresh, empty store of one backend."""
    name = f"t{os.getpid()}x{next(_names)}"
    kind = request.param
    if kind == "memory":
        return "memory://"
    if kind == "sqlite":
        return f"sqlite:///{tmp_path / 'state.db'}"
    if kind == "mongodb":
        uri = request.getfixturevalue("mongo_uri").rstrip("/")
        return f"{uri}/{name}"
    endpoint = request.getfixturevalue("dynamodb_endpoint")
    return f"dynamodb://{name}?endpoint_url={endpoint}&region=us-east-1"
