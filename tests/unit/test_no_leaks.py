"""Passwords and cardholder data stay out of messages and logs (a PCI DSS-minded review).

A bucket's key holds its rule's scope values: a careless upstream's card number in a
card rule's key. The dead-letter output carries the original bytes and a verdict its
account and event ids, as the contract asks; nothing else does."""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import subprocess
import sys
from contextlib import closing
from pathlib import Path

import pytest
from botocore.exceptions import ClientError  # type: ignore[import-untyped]
from pymongo.errors import BulkWriteError

from limitflow.errors import ConfigError, ConflictError
from stores.base import key_hint, redacted

ROOT = Path(__file__).resolve().parents[2]
PAN = "4111111111111111"
PASSWORD = "S3cretPW"


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        # urlsplit ends the host part at an unescaped / ? or #: it found no credentials
        ("mongodb://admin:S3cr/etPW@127.0.0.1:1/db", "mongodb://admin:***@127.0.0.1:1/db"),
        ("mongodb://admin:S3c?etPW@h/db?replicaSet=rs0", "mongodb://admin:***@h/db?replicaSet=rs0"),
        ("mongodb://admin:S3c#etPW@h/db", "mongodb://admin:***@h/db"),
        (
            "dynamodb://AKIAEXAMPLE:S3cretPW@lf?region=eu-west-1",
            "dynamodb://AKIAEXAMPLE:***@lf?region=eu-west-1",
        ),
        ("mongodb://h:1/db?appName=me@x", "mongodb://h:***@x"),  # over-masked: no harm
        ("sqlite:////home/a@b/x.db", "sqlite:////home/a@b/x.db"),  # no password
    ],
)
def test_a_password_with_an_unescaped_character_is_hidden_all_the_same(
    url: str, shown: str
) -> None:
    assert redacted(url) == shown


@pytest.mark.parametrize(
    "url",
    [
        "mongodb://admin:S3cr/etPW@127.0.0.1:1/db",
        "mongodb://admin:a=b/c@127.0.0.1:1/db",
        "mongodb://admin:S3c?etPW@127.0.0.1:1/db?replicaSet=rs0",
        "mongodb://admin:S3c#etPW@127.0.0.1:1/db",
        "mongodb://admin:12345/etPW@mongo/db",  # read as host admin, port 12345: DNS asked
    ],
)
def test_a_mongodb_password_not_percent_encoded_is_refused_unshown(url: str) -> None:
    # its rest was read as the database name (and said so, quoted), or as a host
    from stores.mongo import split_url

    with pytest.raises(ConfigError) as refused:
        split_url(url)
    said = str(refused.value)
    assert "etPW" not in said and "a=b" not in said and "12345" not in said, said
    assert said.endswith("must be percent-encoded (%2F %3F %23 %40 %3A)")


def test_a_dynamodb_url_with_credentials_is_refused_unshown() -> None:
    # its table prefix, 'AKIAEXAMPLE:S3cretPW@limitflow', was quoted as not a prefix
    from stores.dynamo import DynamoStore

    with pytest.raises(ConfigError) as refused:
        DynamoStore.from_url(f"dynamodb://AKIAEXAMPLE:{PASSWORD}@limitflow?region=us-east-1")
    assert PASSWORD not in str(refused.value)
    assert "holds no credentials" in str(refused.value)


def test_a_key_is_shown_by_its_rule_and_period_alone() -> None:
    assert key_hint(f"card-month-cny|2026-03|{PAN}") == "bucket card-month-cny|2026-03|…"
    assert key_hint(f"b#card-month-cny|2026-03|{PAN}|x") == "bucket card-month-cny|2026-03|…"
    assert key_hint(f"acct-{PAN}") == "a record"  # an account's or event's id
    assert key_hint(f"a#acct-{PAN}") == "a record"


async def test_a_memory_store_conflict_names_no_scope_value() -> None:
    from handlers.state import Bucket, Writes
    from stores.memory import MemoryStore

    store = MemoryStore()
    key = f"card-month-cny|2026-03|{PAN}"
    writes = Writes(buckets={key: Bucket(1, 100, 2)}, accounts={}, events={})  # not version 1
    with pytest.raises(ConflictError) as conflict:
        await store.commit(writes)
    assert PAN not in str(conflict.value)
    assert "card-month-cny|2026-03|…" in str(conflict.value)


def test_a_damaged_sqlite_record_is_refused_without_its_key_or_values(tmp_path: Path) -> None:
    # 'bucket card-month-cny|2026-03|<PAN>: (<PAN>x, 243550, 1, …) is not a bucket's row'
    # on stderr, and in run's log and the faust worker's crash log
    event = {
        "event_id": "e1",
        "account_id": "a1",
        "card_id": PAN,
        "amount": "10.00",
        "currency": "CNY",
        "occurred_at": "2026-03-14T01:00:00Z",
    }
    source = tmp_path / "events.jsonl"
    source.write_text(json.dumps(event) + "\n")
    args = [
        *(sys.executable, "-m", "limitflow", "replay"),
        *("--rules", str(ROOT / "examples" / "rules.yaml"), "--input", str(source)),
        *("--output", "v.jsonl", "--dead-letter", "d.jsonl"),
        *("--store", f"sqlite:///{tmp_path / 's.db'}"),
    ]
    assert subprocess.run(args, cwd=tmp_path, capture_output=True).returncode == 0
    for column, value in (("count", f"{PAN}x"), ("amount", -1)):
        with closing(sqlite3.connect(tmp_path / "s.db")) as db:
            db.execute(f"UPDATE buckets SET {column} = ? WHERE key LIKE 'card-month%'", (value,))
            db.commit()
        refused = subprocess.run(args, cwd=tmp_path, capture_output=True)
        said = refused.stderr.decode()
        assert refused.returncode == 3, said
        assert PAN not in said, said
        assert "bucket card-month-cny|2026-03|…: a row that is not a bucket's" in said
        with closing(sqlite3.connect(tmp_path / "s.db")) as db:
            db.execute(f"UPDATE buckets SET {column} = 0 WHERE key LIKE 'card-month%'")
            db.commit()
    with closing(sqlite3.connect(tmp_path / "s.db")) as db:  # a driver's error: its type
        db.execute("UPDATE events SET type = ?", (f"card {PAN}",))
        db.commit()
    refused = subprocess.run(args, cwd=tmp_path, capture_output=True)
    assert refused.returncode == 3
    assert PAN not in refused.stderr.decode()
    assert "a stored record cannot be read (ValueError)" in refused.stderr.decode()


def test_a_mongodb_bulk_write_error_is_said_by_its_codes_not_its_documents() -> None:
    # PyMongo's text of it holds each failed document ('op'): a bucket's key and counts
    from stores.mongo import _translate

    op = {"_id": f"card-month-cny|2026-03|{PAN}", "count": 1, "version": 2}
    for code, name in ((112, "WriteConflict"), (10107, "NotWritablePrimary"), (2, "BadValue")):
        error = BulkWriteError(
            {
                "writeErrors": [
                    {"index": 0, "code": code, "codeName": name, "errmsg": PAN, "op": op}
                ],
                "writeConcernErrors": [],
                "nInserted": 0,
            }
        )
        said = str(_translate(error))
        assert PAN not in said, said
        assert f"error {code} {name}" in said


def test_a_dynamodb_conflict_is_logged_without_the_key_s_scope_values(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from stores.dynamo import _cancellation

    reasons = [
        {
            "Code": "ConditionalCheckFailed",
            "Item": {"pk": {"S": f"b#card-month-cny|2026-03|{PAN}"}, "version": {"N": "3"}},
        }
    ]
    error = ClientError(
        {"Error": {"Code": "TransactionCanceledException"}, "CancellationReasons": reasons},
        "TransactWriteItems",
    )
    with caplog.at_level(logging.INFO, logger="limitflow.stores.dynamo"):
        result = _cancellation(error)
    assert isinstance(result, ConflictError)
    logged = caplog.text
    assert "card-month-cny|2026-03|…" in logged
    assert PAN not in logged and PAN not in str(result)


def test_debug_logging_leaves_the_drivers_that_log_secrets_at_info() -> None:
    # botocore's DEBUG records hold signed request headers (an AWS session token among
    # them), pymongo's the documents written
    from streams.ops import SECRET_LOGGERS, configure_logging

    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        configure_logging("DEBUG", "json")
        for name in SECRET_LOGGERS:
            assert logging.getLogger(name).getEffectiveLevel() == logging.INFO, name
            assert not logging.getLogger(f"{name}.sub").isEnabledFor(logging.DEBUG)
    finally:
        root.handlers[:], root.level = handlers, level
        for name in (*SECRET_LOGGERS, "aiokafka"):
            logging.getLogger(name).setLevel(logging.NOTSET)


def test_a_mongodb_password_can_come_from_the_environment_instead_of_the_url() -> None:
    # `store init`, `replay`, `rules check --store` had the password on their command
    # line, where `ps` and the shell's history show it
    from stores import open_store
    from stores.mongo import MongoStore

    store = open_store("mongodb://app@127.0.0.1:1/lf", password="p/w@x")
    assert isinstance(store, MongoStore)
    credentials = store.client.options.pool_options._credentials
    assert credentials is not None
    assert (credentials.username, credentials.password) == ("app", "p/w@x")
    with pytest.raises(ConfigError, match="the URL names no user"):
        open_store("mongodb://127.0.0.1:1/lf", password="x")
    with pytest.raises(ConfigError, match="give one") as both:
        open_store(f"mongodb://app:{PASSWORD}@127.0.0.1:1/lf", password="x")
    assert PASSWORD not in str(both.value)
    assert isinstance(open_store("memory://", password="x"), object)  # no password there


def test_store_init_reads_the_password_variable_and_shows_no_password(tmp_path: Path) -> None:
    env = {**os.environ, "LIMITFLOW_STORE_PASSWORD": PASSWORD}
    done = subprocess.run(
        [sys.executable, "-m", "limitflow", "store", "init", "--store", "mongodb://127.0.0.1:1/lf"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        timeout=60,
    )
    assert done.returncode == 3
    assert "LIMITFLOW_STORE_PASSWORD is set, and the URL names no user" in done.stderr.decode()
