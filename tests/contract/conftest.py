"""One store contract, every backend: ``SUPPORTED_STORES`` parametrizes ``store_url``.

memory and sqlite need nothing; mongodb and dynamodb start a real server (or the best
local emulator) once per session (``tests/conftest.py``).
"""

from __future__ import annotations

import itertools
import os
from pathlib import Path

import pytest

SUPPORTED_STORES = ["memory", "sqlite", "mongodb", "dynamodb"]
_names = itertools.count()


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
