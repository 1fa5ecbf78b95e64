"""What a ``dynamodb://`` store URL names: table prefix, endpoint, region, retention.

Nothing is contacted: ``open_store`` only builds the store."""

from __future__ import annotations

from pathlib import Path

import pytest

from limitflow.errors import ConfigError
from stores import open_store
from stores.dynamo import DynamoStore


def _dynamo(url: str) -> DynamoStore:
    store = open_store(url)
    assert isinstance(store, DynamoStore)
    return store


@pytest.mark.parametrize(
    "url",
    [
        # the retention and the store's own parameters are read alike: an endpoint or a
        # region after a ";" was dropped, and the store talked to AWS in the chain's region
        "dynamodb://p?event_retention_days=2;endpoint_url=http://127.0.0.1:8000;region=eu-west-1",
        "dynamodb://p?endpoint_url=http://127.0.0.1:8000;region=eu-west-1&event_retention_days=2",
        "dynamodb://p?endpoint_url=http://127.0.0.1:8000&region=eu-west-1&event_retention_days=2",
    ],
)
def test_parameters_separated_by_semicolons_are_all_read(url: str) -> None:
    store = _dynamo(url)
    assert (store.table, store.endpoint_url, store.region) == (
        "p-state",
        "http://127.0.0.1:8000",
        "eu-west-1",
    )
    assert store.retention.event_seconds == 2 * 86_400


def test_a_parameter_given_twice_across_separators_is_refused() -> None:
    with pytest.raises(ConfigError, match="region given 2 times"):
        open_store("dynamodb://p?region=us-east-1;region=eu-west-1")


@pytest.mark.parametrize(
    "url",
    [
        # the prefix is the host part: these used the default table limitflow-state
        "dynamodb:///staging?region=eu-west-1",
        "dynamodb:staging?region=eu-west-1",
        "dynamodb://prod/staging?region=eu-west-1",
        "dynamodb://staging#blue",
        # a blank endpoint (an unset variable) was dropped: the store talked to AWS
        "dynamodb://p?endpoint_url=&region=us-east-1",
        "dynamodb://p?endpoint_url",
        "dynamodb://p?region=",
    ],
)
def test_a_url_part_the_store_would_not_use_is_refused(url: str) -> None:
    with pytest.raises(ConfigError):
        open_store(url)


@pytest.mark.parametrize(
    ("url", "table"),
    [
        ("dynamodb://p?region=eu-west-1", "p-state"),
        ("dynamodb://p/?region=eu-west-1", "p-state"),
        ("dynamodb://?region=eu-west-1", "limitflow-state"),
        ("dynamodb://", "limitflow-state"),
    ],
)
def test_the_table_prefix_is_the_host_part_or_the_default(url: str, table: str) -> None:
    assert _dynamo(url).table == table


@pytest.mark.parametrize(
    "endpoint",
    [
        # botocore refused these only at first use, with a ValueError that a load told as
        # "a stored record cannot be read … damaged", and ftp:// as a retriable outage
        "127.0.0.1:8000",
        "localhost:8000",
        "http://127.0.0.1:99999",
        "http:///x",
        "ftp://127.0.0.1:8000",
        "http://my_host:8000",
    ],
)
def test_an_endpoint_the_driver_cannot_use_is_refused_at_once(endpoint: str) -> None:
    with pytest.raises(ConfigError, match="endpoint_url"):
        open_store(f"dynamodb://p?endpoint_url={endpoint}&region=us-east-1")


@pytest.mark.parametrize(
    "endpoint",
    ["http://127.0.0.1:8000", "https://dynamodb.eu-west-1.amazonaws.com", "http://[::1]:8000"],
)
def test_an_http_endpoint_is_taken(endpoint: str) -> None:
    assert _dynamo(f"dynamodb://p?endpoint_url={endpoint}").endpoint_url == endpoint


@pytest.mark.parametrize("config", ["", "[profile broken\nregion = eu-west-1\n"])
def test_an_aws_profile_that_cannot_be_read_is_a_config_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, config: str
) -> None:
    # botocore's ProfileNotFound (or ConfigParseError) came out of open_store as it was:
    # every command ended in a traceback, exit 1
    (tmp_path / "config").write_text(config)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "credentials"))
    monkeypatch.setenv("AWS_PROFILE", "nope")
    with pytest.raises(ConfigError, match=r"nope|config"):
        open_store("dynamodb://p?region=eu-west-1")
