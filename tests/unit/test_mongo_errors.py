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


def test_a_write_concern_limitflow_would_override_is_refused() -> None:
    # every write goes through a handle with w=majority: w=1, or a misspelt w=majorty
    # (PyMongo takes any string as a tag-set name), was overridden without a word,
    # though the docs said such a URL is refused
    import pytest

    from limitflow.errors import ConfigError
    from stores.mongo import split_url

    for option in ("w=majorty", "w=1", "W=0"):
        with pytest.raises(ConfigError, match="always writes with w=majority"):
            split_url(f"mongodb://app:pw@h:1/lf?{option}")
    assert split_url("mongodb://h:1/lf?w=majority")[1] == "lf"
    with pytest.raises(ConfigError, match="at most 63 bytes"):
        split_url(f"mongodb://h:1/{'a' * 64}")
    assert split_url(f"mongodb://h:1/{'a' * 63}")[1] == "a" * 63
