"""What a MongoDB outage says: the driver's reason, not its topology description."""

from __future__ import annotations

from pymongo.errors import ServerSelectionTimeoutError

from limitflow.errors import StoreUnavailable
from stores.mongo import _translate


def test_an_unreachable_server_is_one_short_reason() -> None:
    # `limitflow store init --store mongodb://127.0.0.1:1/db` printed ~700 characters of
    # driver internals after 30 s, the reason buried in them
    driver = ServerSelectionTimeoutError(
        "127.0.0.1:1: [Errno 111] Connect call failed ('127.0.0.1', 1) (configured timeouts:"
        " socketTimeoutMS: 20000.0ms, connectTimeoutMS: 20000.0ms), Timeout: 30s, Topology"
        " Description: <TopologyDescription id: 1, topology_type: Unknown, servers: [...]>"
    )
    error = _translate(driver)
    assert isinstance(error, StoreUnavailable)
    assert str(error) == (
        "MongoDB unavailable: 127.0.0.1:1: [Errno 111] Connect call failed ('127.0.0.1', 1)"
    )
