"""Settings: flags over LIMITFLOW_* environment over defaults, validated, frozen."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from limitflow.errors import ConfigError
from limitflow.settings import (
    COMPRESSIONS,
    GROUPS,
    Guarantee,
    KafkaSecurity,
    env_name,
    load_run_settings,
    load_topic_settings,
    unknown_variables,
)
from tests.servers import make_certificates
from tests.signals import catches, needs_proc

ROOT = Path(__file__).resolve().parents[2]

REQUIRED = {
    "bootstrap_servers": "127.0.0.1:9092",
    "input_topic": "events",
    "output_topic": "verdicts",
    "dead_letter_topic": "dead",
    "group_id": "limits",
    "rules": "rules.yaml",
}


def env_of(values: dict[str, str]) -> dict[str, str]:
    return {env_name(k): v for k, v in values.items()}


def test_everything_can_come_from_the_environment() -> None:
    settings = load_run_settings(
        {},
        env_of(
            {
                **REQUIRED,
                "guarantee": "exactly-once",
                "http_port": "9100",
                "create_topics": "true",
                "batch_size": "50",
                "fetch_max_wait_ms": "20",
            }
        ),
    )
    assert settings.kafka.bootstrap_servers == "127.0.0.1:9092"
    assert settings.kafka.dead_letter_topic == "dead"
    assert settings.guarantee is Guarantee.EXACTLY_ONCE
    assert settings.http_port == 9100
    assert settings.create_topics is True
    assert settings.batch_size == 50
    assert settings.fetch_max_wait_ms == 20
    assert settings.store == "sqlite:///limitflow.db"


def test_flags_override_the_environment() -> None:
    settings = load_run_settings(
        {"group_id": "from-flag", "batch_size": 7, "create_topics": False, "http_port": None},
        env_of({**REQUIRED, "batch_size": "50", "create_topics": "1", "http_port": "9"}),
    )
    assert settings.group_id == "from-flag"
    assert settings.batch_size == 7
    assert settings.create_topics is False
    assert settings.http_port == 9  # None means "flag not given"


def test_missing_settings_name_flag_and_variable() -> None:
    with pytest.raises(ConfigError) as caught:
        load_run_settings({"bootstrap_servers": "h:1"}, {})
    message = str(caught.value)
    assert "--input-topic (LIMITFLOW_INPUT_TOPIC)" in message
    assert "--group-id (LIMITFLOW_GROUP_ID)" in message


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("guarantee", "twice"),
        ("batch_size", "0"),
        ("batch_size", "many"),
        ("fetch_max_wait_ms", "0"),
        ("http_port", "70000"),
        ("create_topics", "perhaps"),
        ("bootstrap_servers", "no-port"),
        ("output_topic", "events"),
        ("log_format", "xml"),
        ("log_level", "verbose"),  # was a ValueError traceback from logging
        ("bootstrap_servers", "127.0.0.1:9092,"),
        ("compression", "brotli"),  # not a Kafka codec: the producer would fail later
        # an empty variable ran a consumer in group "" on topic "" (tansu created it)
        ("input_topic", ""),
        ("dead_letter_topic", "bad topic"),
        ("output_topic", "x" * 250),
        ("output_topic", ".."),
        ("group_id", ""),
        ("group_id", " "),
        ("retry_max_ms", "100"),  # below retry_initial_ms (200)
        # reached the socket's connect(): `run` ended in an OverflowError traceback
        ("bootstrap_servers", "127.0.0.1:70000"),
        ("bootstrap_servers", "127.0.0.1:0"),
        ("bootstrap_servers", "127.0.0.1:\u0669\u0660\u0669\u0662"),  # Arabic-Indic digits
        # asyncio takes an empty host for every interface: /metrics on the network
        ("http_host", ""),
        ("http_host", " "),
    ],
)
def test_bad_values_are_config_errors(name: str, value: str) -> None:
    with pytest.raises(ConfigError, match=f"{name}|three different topics"):
        load_run_settings({}, env_of({**REQUIRED, name: value}))


@pytest.mark.parametrize(
    ("name", "value", "said"),
    [
        # "'twice' is not a valid Guarantee": the class name, not the choices
        ("guarantee", "twice", "must be one of at-least-once, exactly-once, not 'twice'"),
        # the only setting whose message did not name its variable
        ("bootstrap_servers", "no-port", "expected HOST:PORT[,HOST:PORT…], got 'no-port'"),
    ],
)
def test_a_bad_value_is_named_with_its_variable_and_what_it_takes(
    name: str, value: str, said: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        load_run_settings({}, env_of({**REQUIRED, name: value}))
    assert str(caught.value) == f"{name} (LIMITFLOW_{name.upper()}): {said}"


def test_a_topic_name_kafka_refuses_is_named_with_what_it_takes() -> None:
    with pytest.raises(ConfigError) as caught:
        load_run_settings({}, env_of({**REQUIRED, "input_topic": ""}))
    assert str(caught.value) == (
        "input_topic (LIMITFLOW_INPUT_TOPIC): '' is not a Kafka topic name"
        " (1 to 249 letters, digits, '.', '_' or '-')"
    )


@pytest.mark.parametrize("value", ["abc", "1_000", "1e3", "\u0662"])
def test_a_number_setting_that_is_not_one_says_so_plainly(value: str) -> None:
    # was "invalid literal for int() with base 10: 'abc'"; "1_000" and Arabic-Indic
    # digits were taken by int()
    with pytest.raises(ConfigError) as caught:
        load_run_settings({}, env_of({**REQUIRED, "batch_size": value}))
    assert str(caught.value) == (
        f"batch_size (LIMITFLOW_BATCH_SIZE): expected a whole number, got {value!r}"
    )


@pytest.mark.parametrize("level", ["warn", "WARNING", "fatal", "NOTSET", "debug"])
def test_every_level_logging_knows_is_accepted(level: str) -> None:
    assert load_run_settings({}, env_of({**REQUIRED, "log_level": level})).log_level == level


def test_settings_are_frozen() -> None:
    settings = load_run_settings({}, env_of(REQUIRED))
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.group_id = "other"  # type: ignore[misc]


def test_topic_settings() -> None:
    topics = load_topic_settings({"partitions": 3}, env_of(REQUIRED))
    assert topics.partitions == 3
    assert topics.replication_factor == 1
    assert topics.kafka.input_topic == "events"
    with pytest.raises(ConfigError):
        load_topic_settings({"partitions": 0}, env_of(REQUIRED))


@pytest.mark.parametrize("name", ["request_timeout_ms", "max_message_bytes"])
def test_topics_create_refuses_what_run_refuses(name: str) -> None:
    # `topics create --request-timeout-ms 0` said "cannot reach Kafka" of brokers that run
    for given, env in (({name: 0}, env_of(REQUIRED)), ({}, env_of({**REQUIRED, name: "0"}))):
        with pytest.raises(ConfigError, match=f"{name} \\({env_name(name)}\\) must be > 0"):
            load_topic_settings(given, env)
        with pytest.raises(ConfigError, match=f"{name} \\({env_name(name)}\\) must be > 0"):
            load_run_settings(given, env)


def test_faust_settings_come_from_the_same_loader() -> None:
    from streams.faust_app import FaustSettings

    with pytest.raises(ConfigError) as missing:
        FaustSettings.from_env({})
    assert str(missing.value) == (
        "missing required settings: LIMITFLOW_BOOTSTRAP_SERVERS, LIMITFLOW_RULES"
    )
    env = {"LIMITFLOW_BOOTSTRAP_SERVERS": "127.0.0.1:9092", "LIMITFLOW_RULES": "r.yaml"}
    settings = FaustSettings.from_env({**env, "LIMITFLOW_BATCH_SIZE": " 30 "})
    assert (settings.batch_size, settings.group_id, settings.store) == (
        30,
        "limitflow-faust",
        "sqlite:///limitflow.db",
    )
    with pytest.raises(ConfigError, match="batch_size"):
        FaustSettings.from_env({**env, "LIMITFLOW_BATCH_SIZE": "many"})
    with pytest.raises(ConfigError, match="three different topics"):
        FaustSettings.from_env({**env, "LIMITFLOW_OUTPUT_TOPIC": "limitflow.events"})


@pytest.mark.parametrize(
    ("name", "value"),
    [
        # aiokafka took the empty entry for localhost:9092, another broker
        ("BOOTSTRAP_SERVERS", "127.0.0.1:19092,"),
        ("SESSION_TIMEOUT_MS", "-1"),  # looped on "Heartbeat session expired"
        ("BATCH_SIZE", "0"),
        ("RETRY_INITIAL_MS", "-5"),  # no backoff in an outage
        ("BATCH_WAIT_MS", "-1"),
        ("WEB_PORT", "70000"),
        ("COMPRESSION", "zip"),
        ("INPUT_TOPIC", ""),
        ("GROUP_ID", ""),
        ("RETRY_MAX_MS", "100"),
        ("REPLICATION_FACTOR", "0"),
    ],
)
def test_faust_settings_are_checked_as_run_settings_are(name: str, value: str) -> None:
    from streams.faust_app import FaustSettings

    env = {"LIMITFLOW_BOOTSTRAP_SERVERS": "127.0.0.1:9092", "LIMITFLOW_RULES": "r.yaml"}
    with pytest.raises(ConfigError, match=name.lower()):
        FaustSettings.from_env({**env, f"LIMITFLOW_{name}": value})


_FAUST_APP = [sys.executable, "-c", "import streams.faust_app as m; m.app"]
"""A faust worker's start, as far as limitflow's part of it goes: the app's first access."""


def _faust_env(
    tmp_path: Path, store: str | None = None, rules: str | None = None
) -> dict[str, str]:
    """The environment of a faust worker on ``tmp_path``'s rules.yaml (written, unless
    ``rules`` names another file) and ``store``."""
    if rules is None:
        rules = str(tmp_path / "rules.yaml")
        (tmp_path / "rules.yaml").write_text("rules: [{id: r, window: day, max_count: 1}]\n")
    env = {**os.environ, "LIMITFLOW_BOOTSTRAP_SERVERS": "127.0.0.1:9092"}
    env["LIMITFLOW_RULES"] = rules
    if store is not None:
        env["LIMITFLOW_STORE"] = store
    return env


def test_the_faust_app_refuses_exactly_once_rather_than_ignore_it() -> None:
    # a setting of `run`'s, which the app ignored without a word: an operator who set it
    # for a worker (a compose file shared by both, say) believed its output exactly-once
    from streams.faust_app import FaustSettings, run_only_variables

    env = {"LIMITFLOW_BOOTSTRAP_SERVERS": "127.0.0.1:9092", "LIMITFLOW_RULES": "r.yaml"}
    with pytest.raises(ConfigError) as refused:
        FaustSettings.from_env({**env, "LIMITFLOW_GUARANTEE": "exactly-once"})
    assert str(refused.value) == (
        "LIMITFLOW_GUARANTEE=exactly-once: the faust app publishes at least once only"
        " (docs/faust.md); exactly-once is `limitflow run --guarantee exactly-once`"
    )
    FaustSettings.from_env({**env, "LIMITFLOW_GUARANTEE": "at-least-once"})
    shared = {
        **env,
        "LIMITFLOW_GUARANTEE": "at-least-once",
        "LIMITFLOW_HTTP_PORT": "8080",
        "LIMITFLOW_SHUTDOWN_GRACE_MS": "20000",
        "LIMITFLOW_REPLICATION_FACTOR": "3",
        "LIMITFLOW_SSL_CAFILE": "/ca.pem",
        "LIMITFLOW_WEB_PORT": "6066",
    }
    assert run_only_variables(shared) == ["LIMITFLOW_HTTP_PORT", "LIMITFLOW_SHUTDOWN_GRACE_MS"]


def test_the_faust_app_creates_missing_topics_with_the_replication_factor_set(
    tmp_path: Path,
) -> None:
    # faust's own default, 1, was the only one: on a cluster, the verdict and dead-letter
    # topics the app made for itself had a single replica, one broker's loss away from
    # losing verdicts. In a subprocess: a faust app changes process-wide state.
    env = _faust_env(tmp_path, f"sqlite:///{tmp_path / 'x.db'}")
    env["LIMITFLOW_REPLICATION_FACTOR"] = "3"
    env["LIMITFLOW_HTTP_PORT"] = "8080"  # `run`'s: said to be ignored
    shown = subprocess.run(
        [*_FAUST_APP[:-1], _FAUST_APP[-1] + "; print(m.app.conf.topic_replication_factor)"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    assert shown.stdout.split() == ["3"]
    assert "LIMITFLOW_HTTP_PORT is a setting of `limitflow run`, not of the faust app" in (
        shown.stderr
    )


def test_a_faust_worker_with_a_bad_setting_says_so_in_one_line(tmp_path: Path) -> None:
    env = _faust_env(tmp_path, rules=str(tmp_path / "missing.yaml"))
    worker = subprocess.run(_FAUST_APP, env=env, capture_output=True, check=False, timeout=60)
    assert worker.returncode == 2
    assert worker.stderr.decode().strip().splitlines() == [
        f"limitflow: rules: cannot read rules file {tmp_path / 'missing.yaml'}: "
        "No such file or directory"
    ]


def test_a_faust_worker_whose_store_is_unusable_says_so_in_one_line(tmp_path: Path) -> None:
    # the store was opened only by the agent, which crashed the worker (exit 1) in a page
    # of tracebacks: now it is opened before faust starts, and said as `limitflow run` does
    (tmp_path / "other.db").write_bytes(b"not a database, but a file of another program")
    env = _faust_env(tmp_path, f"sqlite:///{tmp_path / 'other.db'}")
    worker = subprocess.run(_FAUST_APP, env=env, capture_output=True, check=False, timeout=60)
    assert worker.returncode == 3
    (line,) = worker.stderr.decode().strip().splitlines()
    assert line.startswith(
        f"limitflow: store: SQLite {tmp_path / 'other.db'}: file is not a database"
    )


@needs_proc
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_faust_worker_stopped_while_it_opens_its_store_ends_in_one_line(
    tmp_path: Path, sig: signal.Signals
) -> None:
    # SIGINT gave exit 1 with "Aborted!" and asyncio's complaints; SIGTERM 143 in silence
    env = _faust_env(tmp_path, "mongodb://127.0.0.1:1/x")  # 30 s of server selection
    worker = subprocess.Popen(
        [*_FAUST_APP[:-1], _FAUST_APP[-1] + "; print('started')"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        # once it catches both, as it opens the store: a fixed 4 s was, on a slow
        # machine, still in the imports, where a SIGINT ignored by CI's shell was lost
        deadline = time.monotonic() + 60
        while not catches(worker.pid, signal.SIGTERM) and time.monotonic() < deadline:
            assert worker.poll() is None, worker.communicate()[1].decode()
            time.sleep(0.01)
        time.sleep(0.5)  # into the wait for the server
        worker.send_signal(sig)
        out, err = worker.communicate(timeout=20)
    finally:
        worker.kill()
        worker.communicate()
    assert worker.returncode == 0, err.decode()
    assert err.decode() == "limitflow: stopped before starting; nothing was consumed\n"
    assert out == b""


def test_a_faust_app_keeps_its_rules_before_faust_starts(tmp_path: Path) -> None:
    # the agent's start took the write lock to keep them: a lock held by another process
    # crashed the worker. Now it only reads them
    env = _faust_env(tmp_path, f"sqlite:///{tmp_path / 'state.db'}")
    subprocess.run(_FAUST_APP, env=env, check=True, timeout=60)
    with closing(sqlite3.connect(tmp_path / "state.db")) as db:
        kept = db.execute("SELECT name FROM meta WHERE name LIKE 'rule:%'").fetchall()
    assert kept == [("rule:r:day",)]


_FAUST_CONSUMER_WAIT = """
import asyncio, os
from streams.faust_app import FaustSettings, build_app

async def main():
    app = build_app(FaustSettings.from_env(os.environ))
    consumer = app.consumer._thread._create_worker_consumer(app.transport)
    print(app.limitflow.fetch_max_wait_ms, consumer._fetch_max_wait_ms)
    # and, as `limitflow run`'s: read committed events only (faust's own read_uncommitted
    # decided events of aborted upstream transactions), metadata refreshed every 30 s
    print(consumer._isolation_level, consumer._client._metadata_max_age_ms)
    await consumer.stop()

asyncio.run(main())
"""


@pytest.mark.parametrize(
    ("setting", "expected"),
    [("70", "70 70 read_committed 30000"), (None, "50 50 read_committed 30000")],
)
def test_the_faust_consumer_waits_for_fetches_as_long_as_the_setting_says(
    setting: str | None, expected: str
) -> None:
    # faust builds its aiokafka consumer with fetch_max_wait_ms=1500 and no setting for it;
    # the app's own transport puts LIMITFLOW_FETCH_MAX_WAIT_MS in its place (aiokafka
    # builds the fetcher from this attribute when the consumer starts). In a subprocess:
    # a faust app changes process-wide state (signal handlers, recursion limit).
    env = {
        **os.environ,
        "LIMITFLOW_BOOTSTRAP_SERVERS": "127.0.0.1:9",
        "LIMITFLOW_RULES": "examples/rules.yaml",
    }
    env.pop("LIMITFLOW_FETCH_MAX_WAIT_MS", None)
    if setting is not None:
        env["LIMITFLOW_FETCH_MAX_WAIT_MS"] = setting
    done = subprocess.run(
        [sys.executable, "-c", _FAUST_CONSUMER_WAIT],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert done.stdout.split() == expected.split()


def test_run_help_names_every_setting_and_its_variable() -> None:
    # the README sends people to --help for the LIMITFLOW_ variables; it hid ten of them
    from limitflow.settings import KafkaSecurity, KafkaSettings, RunSettings

    shown = subprocess.run(
        [sys.executable, "-m", "limitflow", "run", "--help"],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "COLUMNS": "200"},
    ).stdout
    names = {f.name for f in dataclasses.fields(RunSettings) if f.name not in ("kafka",)}
    names |= {f.name for f in dataclasses.fields(KafkaSettings) if f.name != "security"}
    names |= {f.name for f in dataclasses.fields(KafkaSecurity) if f.name != "sasl_password"}
    for name in sorted(names):
        assert f"--{name.replace('_', '-')}" in shown, name
        assert env_name(name) in shown, name
    # no flag for the password: it would show in the process list
    assert "--sasl-password" not in shown
    assert env_name("sasl_password") in shown


@pytest.mark.parametrize("codec", [c for c in COMPRESSIONS if c != "none"])
async def test_every_offered_compression_can_publish(codec: str) -> None:
    # aiokafka's codecs come from an optional package (cramjam): without it a producer
    # with the default compression cannot even be built, and `run` dies at start
    from aiokafka.producer.producer import AIOKafkaProducer  # type: ignore[import-untyped]

    producer = AIOKafkaProducer(bootstrap_servers="127.0.0.1:9", compression_type=codec)
    await producer.stop()  # never started: nothing to connect to or close


def test_a_misspelt_variable_is_named_and_known_ones_are_not() -> None:
    # LIMITFLOW_GUARANTE=exactly-once was ignored without a word: run went on at-least-once
    env = {
        "LIMITFLOW_GUARANTE": "exactly-once",
        "LIMITFLOW_BATCHSIZE": "abc",
        "LIMITFLOW_GUARANTEE": "exactly-once",
        "LIMITFLOW_PARTITIONS": "6",  # topics create's
        "LIMITFLOW_WEB_PORT": "6066",  # the faust app's
        "LIMITFLOW_TANSU_BIN": "/x",  # the test servers'
        "LIMITFLOW_SSL_CAFILE": "/ca.pem",
        "LIMITFLOW_SECURITY": "SSL",  # a group of settings, not one: read by nothing
        "PATH": "/bin",
    }
    assert unknown_variables(env) == [
        "LIMITFLOW_BATCHSIZE",
        "LIMITFLOW_GUARANTE",
        "LIMITFLOW_SECURITY",
    ]


def test_a_missing_setting_names_the_misspelt_variables_set() -> None:
    # the warning naming them came only once the settings were loaded: with the setting
    # they were meant for missing, never
    given = {k: v for k, v in REQUIRED.items() if k != "group_id"}
    with pytest.raises(ConfigError) as missing:
        load_run_settings({}, {**env_of(given), "LIMITFLOW_GROUPID": "g", "LIMITFLOW_X": ""})
    assert str(missing.value) == (
        "missing required settings: --group-id (LIMITFLOW_GROUP_ID) (LIMITFLOW_GROUPID,"
        " LIMITFLOW_X are set, but not a limitflow setting: misspelt?)"
    )
    from streams.faust_app import FaustSettings

    with pytest.raises(ConfigError) as faust:
        FaustSettings.from_env({"LIMITFLOW_RULES": "r.yaml", "LIMITFLOW_BOOTSTRAP": "h:1"})
    assert str(faust.value) == (
        "missing required settings: LIMITFLOW_BOOTSTRAP_SERVERS (LIMITFLOW_BOOTSTRAP is set,"
        " but not a limitflow setting: misspelt?)"
    )


def test_every_variable_limitflow_or_its_tests_read_is_known() -> None:
    from streams.faust_app import FaustSettings

    faust = {
        env_name(spec.name): ""
        for cls in (FaustSettings, KafkaSecurity)
        for spec in dataclasses.fields(cls)
        if spec.name not in GROUPS
    }
    assert unknown_variables(faust) == []
    read: set[str] = set()
    for path in [*ROOT.glob("tests/**/*.py"), *ROOT.glob("benchmarks/*.py"), *ROOT.glob("*.yml")]:
        read |= set(re.findall(r"LIMITFLOW_[A-Z][A-Z0-9_]*", path.read_text(encoding="utf-8")))
    # misspelt on purpose, above and in test_cli's test of topics create
    misspelt_above = {
        "LIMITFLOW_GUARANTE",
        "LIMITFLOW_BATCHSIZE",
        "LIMITFLOW_PARTITION",
        "LIMITFLOW_SECURITY",
        "LIMITFLOW_GROUPID",
        "LIMITFLOW_X",
        "LIMITFLOW_BOOTSTRAP",
    }
    assert unknown_variables(dict.fromkeys(read - misspelt_above, "")) == []


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        (
            "mongodb://app:s3cret@db:27017/lf?replicaSet=rs0",
            "mongodb://app:***@db:27017/lf?replicaSet=rs0",
        ),
        ("mongodb://app@db/lf", "mongodb://app@db/lf"),  # no password: nothing to hide
        (
            "mongodb://db/?authMechanismProperties=AWS_SESSION_TOKEN:tok;retryWrites=true",
            "mongodb://db/?authMechanismProperties=***&retryWrites=true",
        ),
        (
            "sqlite:////var/lib/lf.db?event_retention_days=30",
            "sqlite:////var/lib/lf.db?event_retention_days=30",
        ),
        ("memory://", "memory://"),
        (
            "dynamodb://lf?endpoint_url=http://h:8000&region=eu-west-1",
            "dynamodb://lf?endpoint_url=http://h:8000&region=eu-west-1",
        ),
    ],
)
def test_a_store_url_is_logged_without_its_secrets(url: str, shown: str) -> None:
    # run's start line now gives the store URL: a password, or a token in an option,
    # must not reach the logs
    from stores.base import redacted

    assert redacted(url) == shown


# -- TLS and SASL ---------------------------------------------------------------------------


def test_plaintext_is_the_default_and_needs_nothing_more() -> None:
    from limitflow.run_cli import client_security

    security = load_run_settings({}, env_of(REQUIRED)).kafka.security
    assert security == KafkaSecurity()
    assert client_security(security) == {"security_protocol": "PLAINTEXT"}


async def test_sasl_settings_reach_every_client_and_the_password_is_never_shown() -> None:
    env = env_of(
        {
            **REQUIRED,
            "security_protocol": "SASL_PLAINTEXT",
            "sasl_mechanism": "SCRAM-SHA-512",
            "sasl_username": "limitflow",
            "sasl_password": " pa ss ",  # as given: spaces are part of a password
        }
    )
    settings = load_run_settings({}, env)
    assert settings.kafka.security.sasl_password == " pa ss "
    assert " pa ss " not in repr(settings)
    async with every_client(settings) as clients:
        for client in clients:
            assert client._security_protocol == "SASL_PLAINTEXT"
            assert client._sasl_mechanism == "SCRAM-SHA-512"
            assert (client._sasl_plain_username, client._sasl_plain_password) == (
                "limitflow",
                " pa ss ",
            )


@contextlib.asynccontextmanager
async def every_client(settings: Any) -> AsyncIterator[list[Any]]:
    """The aiokafka clients (their connection layer) that ``run`` makes, never started."""
    from limitflow.run_cli import _admin, _consumer, _producer

    admin, consumer = _admin(settings.kafka), _consumer(settings)
    producers = [_producer(settings.kafka), _producer(settings.kafka, "limitflow-txn-0")]
    try:
        yield [admin._client, consumer._client, *(p.client for p in producers)]
    finally:
        await admin.close()
        await consumer.stop()
        for producer in producers:
            await producer.stop()


async def test_tls_settings_reach_every_client_with_the_ca_given(tmp_path: Path) -> None:
    import ssl

    ca = make_certificates(tmp_path)["ca"]
    env = env_of({**REQUIRED, "security_protocol": "SSL", "ssl_cafile": str(ca)})
    settings = load_run_settings({}, env)
    async with every_client(settings) as clients:
        for client in clients:
            assert client._security_protocol == "SSL"
            context = client._ssl_context
            assert context.verify_mode is ssl.CERT_REQUIRED and context.check_hostname
            subjects = [c["subject"] for c in context.get_ca_certs()]
            assert subjects == [((("commonName", "test-ca"),),)]


@pytest.mark.parametrize(
    ("values", "said"),
    [
        ({"security_protocol": "TLS"}, "security_protocol (LIMITFLOW_SECURITY_PROTOCOL) must be"),
        ({"security_protocol": "SASL_SSL"}, "sasl_mechanism (LIMITFLOW_SASL_MECHANISM) must be"),
        (
            {"security_protocol": "SASL_SSL", "sasl_mechanism": "SCRAM-SHA-256"},
            "sasl_username (LIMITFLOW_SASL_USERNAME) is required with SASL",
        ),
        (
            {
                "security_protocol": "SASL_SSL",
                "sasl_mechanism": "SCRAM-SHA-256",
                "sasl_username": "u",
            },
            "sasl_password (LIMITFLOW_SASL_PASSWORD) is required with SASL",
        ),
        (
            {"sasl_username": "u", "sasl_password": "hunter2-secret"},
            "sasl_username, sasl_password set, but security_protocol",
        ),
        ({"ssl_cafile": "/etc/ca.pem"}, "ssl_cafile set, but security_protocol"),
        (
            {"security_protocol": "SSL", "ssl_keyfile": "/k.pem"},
            "ssl_keyfile (LIMITFLOW_SSL_KEYFILE) needs ssl_certfile",
        ),
        (
            {"security_protocol": "SSL", "ssl_cafile": "/nowhere/ca.pem"},
            "TLS: ssl_cafile (LIMITFLOW_SSL_CAFILE) /nowhere/ca.pem:",
        ),
    ],
)
def test_security_settings_that_would_not_connect_or_protect_less_are_refused(
    values: dict[str, str], said: str
) -> None:
    with pytest.raises(ConfigError) as refused:
        load_run_settings({}, env_of({**REQUIRED, **values}))
    assert said in str(refused.value)
    assert "hunter2-secret" not in str(refused.value)


def test_the_faust_app_takes_the_same_security_settings(tmp_path: Path) -> None:
    import faust

    from streams.faust_app import FaustSettings, faust_credentials

    base = {"bootstrap_servers": "127.0.0.1:9092", "rules": "rules.yaml"}
    assert FaustSettings.from_env(env_of(base)).security == KafkaSecurity()
    assert faust_credentials(KafkaSecurity()) is None
    ca = str(make_certificates(tmp_path)["ca"])
    tls = FaustSettings.from_env(env_of({**base, "security_protocol": "SSL", "ssl_cafile": ca}))
    credentials = faust_credentials(tls.security)
    assert isinstance(credentials, faust.SSLCredentials)
    assert credentials.context.get_ca_certs()[0]["subject"] == ((("commonName", "test-ca"),),)
    sasl = FaustSettings.from_env(
        env_of(
            {
                **base,
                "security_protocol": "SASL_SSL",
                "sasl_mechanism": "SCRAM-SHA-256",
                "sasl_username": "limitflow",
                "sasl_password": "s3cret",
                "ssl_cafile": ca,
            }
        )
    )
    credentials = faust_credentials(sasl.security)
    assert isinstance(credentials, faust.SASLCredentials)
    assert (credentials.username, credentials.password) == ("limitflow", "s3cret")
    assert credentials.mechanism.value == "SCRAM-SHA-256"
    assert credentials.protocol.value == "SASL_SSL"
    with pytest.raises(ConfigError, match="sasl_password"):
        FaustSettings.from_env(
            env_of({**base, "security_protocol": "SASL_SSL"})
            | env_of({"sasl_mechanism": "PLAIN", "sasl_username": "u"})
        )


def test_an_encrypted_private_key_is_refused_in_one_line_without_a_prompt(
    tmp_path: Path,
) -> None:
    # OpenSSL asked for its passphrase ("Enter PEM pass phrase:", on the terminal, once
    # per client); without one the command said "[Errno 22] Invalid argument"
    made = make_certificates(tmp_path)
    encrypted = tmp_path / "client.enc.key"
    key = ["-in", str(made["client_key"]), "-aes256", "-passout", "pass:pw", "-out", str(encrypted)]
    subprocess.run(["openssl", "rsa", *key], check=True, capture_output=True)
    topics = ["--input-topic", "a", "--output-topic", "b", "--dead-letter-topic", "c"]
    tls = ["--security-protocol", "SSL", "--ssl-certfile", str(made["client"]), "--ssl-keyfile"]
    command = [sys.executable, "-m", "limitflow", "topics", "create"]
    done = subprocess.run(
        [*command, "--bootstrap-servers", "127.0.0.1:9", *topics, *tls, str(encrypted)],
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
        start_new_session=True,  # no terminal to prompt on
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == [
        f"limitflow: TLS: ssl_keyfile (LIMITFLOW_SSL_KEYFILE) {encrypted}: the private key is"
        " encrypted; limitflow takes an unencrypted one (PEM), kept as a secret"
    ]


@pytest.mark.parametrize("raw", ["1_000", "+5", "\u0663", "0x10"])
def test_a_number_flag_takes_what_its_variable_takes(
    raw: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # argparse's int took `--batch-size 1_000` (and `+5`, Arabic-Indic digits), which
    # LIMITFLOW_BATCH_SIZE refuses: the same setting read two ways
    from limitflow.cli import build_parser

    with pytest.raises(ConfigError, match="expected a whole number"):
        load_run_settings({}, env_of({**REQUIRED, "batch_size": raw}))
    with pytest.raises(SystemExit) as refused:
        build_parser().parse_args(["run", "--batch-size", raw])
    assert refused.value.code == 2
    assert f"argument --batch-size: expected a whole number, got {raw!r}" in capsys.readouterr().err
    args = build_parser().parse_args(["run", "--batch-size", " 12 ", "--http-port", "8080"])
    assert (args.batch_size, args.http_port) == (12, 8080)
