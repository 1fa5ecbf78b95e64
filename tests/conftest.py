"""Settings and server fixtures for every test directory."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, settings

# The property tests check results, not speed: on a machine busy with other work (CI
# shares its two cores with the brokers and servers of the integration tests) an example
# can take longer than hypothesis's 200 ms deadline, and a test then failed for that alone.
settings.register_profile("limitflow", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("limitflow")


@pytest.fixture(autouse=True)
def signal_actions() -> Iterator[None]:
    """Each test starts with SIGINT and SIGTERM as the session started, and its
    subprocesses inherit that: asyncio's ``remove_signal_handler`` puts Python's SIGINT
    handler back, so a session started with SIGINT ignored (as CI's shell starts it)
    caught it from the first test whose event loop had handled signals, and a test run
    alone saw another start than in the whole suite."""
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    yield
    for sig, action in before.items():
        if signal.getsignal(sig) is not action and action is not None:
            signal.signal(sig, action)


@pytest.fixture(scope="session")
def mongo_uri() -> Iterator[str]:
    """``mongodb://HOST:PORT/…`` of a server that lives for the whole session
    (``LIMITFLOW_MONGO_URI``: one already running)."""
    uri = os.environ.get("LIMITFLOW_MONGO_URI")
    if uri:
        yield uri
        return
    from tests.servers import mongo_server

    with mongo_server() as server:
        yield server.uri


@pytest.fixture(scope="session")
def dynamodb_endpoint() -> Iterator[str]:
    """The endpoint URL of a DynamoDB Local that lives for the whole session; the AWS
    credentials it takes (any) are set in the environment, for subprocesses too."""
    from tests.servers import dynamodb_local

    os.environ.setdefault("AWS_ACCESS_KEY_ID", "test")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "test")
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    with dynamodb_local() as server:
        yield server.endpoint_url
