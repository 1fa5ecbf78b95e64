"""What a MongoDB outage says: the driver's reason, not its topology description."""

from __future__ import annotations

import pytest
from pymongo.errors import OperationFailure, ServerSelectionTimeoutError

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


def test_a_read_concern_limitflow_would_override_is_refused() -> None:
    # every read goes through a handle with read concern majority, as w above
    import pytest

    from limitflow.errors import ConfigError
    from stores.mongo import split_url

    for option in ("readConcernLevel=local", "readconcernlevel=majorty"):
        with pytest.raises(ConfigError, match="always reads with readConcernLevel=majority"):
            split_url(f"mongodb://h:1/lf?{option}")
    assert split_url("mongodb://h:1/lf?readConcernLevel=majority")[1] == "lf"


def test_a_refused_login_says_where_the_password_comes_from() -> None:
    # was: "MongoDB refused the request: Authentication failed., full error: {…}"
    from pymongo.errors import OperationFailure

    from limitflow.errors import StoreRejected

    real = OperationFailure(  # what MongoDB says
        "Authentication failed.",
        18,
        {"ok": 0.0, "errmsg": "Authentication failed.", "code": 18},
    )
    emulated = OperationFailure(  # what mongoeco says: no code
        "Authentication failed", None, {"ok": 0.0, "errmsg": "Authentication failed"}
    )
    for driver in (real, emulated):
        error = _translate(driver)
        assert isinstance(error, StoreRejected)
        assert str(error).startswith("MongoDB refused the login: Authentication failed")
        assert str(error).endswith(
            "(check the user the URL names, and its password: LIMITFLOW_STORE_PASSWORD, or the URL)"
        )
    other = OperationFailure("not authorized on lf", 13, {"errmsg": "not authorized on lf"})
    assert str(_translate(other)).startswith("MongoDB refused the request: not authorized")


def test_a_mechanism_shows_in_messages_and_a_secret_option_does_not() -> None:
    from stores.base import redacted

    url = "mongodb://app@h:1/lf?authMechanism=SCRAM-SHA-256&authMechanismProperties=TOKEN:x"
    assert redacted(url) == (
        "mongodb://app@h:1/lf?authMechanism=SCRAM-SHA-256&authMechanismProperties=***"
    )


def test_a_url_without_a_database_logs_in_where_any_client_would() -> None:
    # the driver was given the default database, limitflow, as the URL's path: a user
    # created in admin (MongoDB's own default for a URL without one) could not log in
    from pymongo import AsyncMongoClient

    from stores.mongo import MongoStore

    for url, source in (
        ("mongodb://app:pw@h:1", "admin"),
        ("mongodb://app:pw@h:1/?replicaSet=rs0", "admin"),
        ("mongodb://app:pw@h:1/risk", "risk"),
        ("mongodb://app:pw@h:1/?authSource=users", "users"),
    ):
        store = MongoStore.from_url(url)
        assert store.database_name == ("risk" if "/risk" in url else "limitflow")
        plain: AsyncMongoClient[dict[str, object]] = AsyncMongoClient(url, connect=False)
        for client in (store.client, plain):
            credentials = client.options.pool_options._credentials
            assert credentials is not None and credentials.source == source, url


def test_a_database_name_reaches_the_driver_as_limitflow_reads_it() -> None:
    # the name went to the driver decoded: a%3Fb was refused ("MongoDB URI options are
    # key=value pairs"), a%2Bb and a+b too (the driver reads + as a space: "Bad database
    # name"), and a%2541 was logged in to as aA
    from stores.mongo import MongoStore

    for path, name in (("a%3Fb", "a?b"), ("a%2Bb", "a+b"), ("a+b", "a+b"), ("a%2541", "a%41")):
        store = MongoStore.from_url(f"mongodb://app:pw@h:1/{path}?replicaSet=rs0")
        assert store.database_name == name
        credentials = store.client.options.pool_options._credentials
        assert credentials is not None and credentials.source == name, path


def test_a_majority_read_before_the_member_can_serve_one_is_retriable() -> None:
    # every read is at read concern majority: a primary just started or elected answers
    # ReadConcernMajorityNotAvailableYet (134) until it has a majority snapshot, which
    # PyMongo retries once and then raises; it was StoreRejected, and `run` stopped
    from pymongo.errors import OperationFailure

    said = "Read concern majority reads are currently not possible."
    error = _translate(
        OperationFailure(
            said,
            134,
            {
                "ok": 0,
                "errmsg": said,
                "code": 134,
                "codeName": "ReadConcernMajorityNotAvailableYet",
            },
        )
    )
    assert isinstance(error, StoreUnavailable) and error.retriable


def test_a_read_the_server_gave_up_is_retriable() -> None:
    # a find whose cursor a failover forgot (its getMore: CursorNotFound, CursorKilled),
    # whose plan was killed, or that mongos could not route while a shard elects its
    # primary: the same read sent again is answered. They were StoreRejected, and `run`
    # stopped (exit 3). Made as PyMongo makes them from the server's reply
    from pymongo.helpers_shared import _check_command_response

    for code, name in [
        (43, "CursorNotFound"),
        (133, "FailedToSatisfyReadPreference"),
        (175, "QueryPlanKilled"),
        (237, "CursorKilled"),
    ]:
        reply = {"ok": 0, "code": code, "codeName": name, "errmsg": name}
        with pytest.raises(OperationFailure) as caught:
            _check_command_response(reply, 21)
        error = _translate(caught.value)
        assert isinstance(error, StoreUnavailable) and error.retriable, name
