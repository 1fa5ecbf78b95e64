"""``limitflow run``, ``topics create`` and the faust app with SASL (PLAIN, SCRAM-SHA-256,
SCRAM-SHA-512), alone and over mutual TLS, against brokers that take no other client
(``tests.servers.kafka_behind_sasl``: tansu behind a listener that authenticates as a
Kafka broker's SASL listener does).

Card issuers' brokers (Confluent Cloud, Amazon MSK, their own) ask for a SASL login, most
often SCRAM over TLS: every client limitflow makes (admin, consumer, producers, faust's)
must log in with the password it reads from ``LIMITFLOW_SASL_PASSWORD`` only.
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.test_kafka_run import (
    Setup,
    check_against_replay,
    make_events,
    produce,
)
from tests.integration.test_kafka_tls import _client as _tls_client
from tests.integration.test_kafka_tls import (
    _waits_for_kafka,
    check_faust_against_replay,
    check_sample_scripts,
    sample_script,
)
from tests.servers import kafka_behind_sasl, make_certificates

pytestmark = pytest.mark.integration

USER, PASSWORD = "limitflow", "pa ss:wörd=,1"
"""A password with what SASL and SCRAM escape or take apart: spaces, ':', '=' and ','."""


@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return make_certificates(tmp_path_factory.mktemp("certificates"))


@pytest.fixture(scope="module")
def sasl() -> Iterator[Any]:
    with kafka_behind_sasl({USER: PASSWORD}) as (broker, front):
        yield broker, front


@pytest.fixture(scope="module")
def sasl_ssl(certificates: dict[str, Path]) -> Iterator[Any]:
    with kafka_behind_sasl({USER: PASSWORD}, certificates) as (broker, front):
        yield broker, front


def _setup(
    broker: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    mechanism: str,
    certificates: dict[str, Path] | None = None,
) -> Setup:
    """A set-up whose runs, topic creation and test clients log in as ``USER``."""
    made = Setup(broker.bootstrap_servers, tmp_path, f"sasl-{random.randrange(10**6)}")
    protocol = "SASL_PLAINTEXT" if certificates is None else "SASL_SSL"
    made.security = [
        *("--security-protocol", protocol, "--sasl-mechanism", mechanism),
        *("--sasl-username", USER),
    ]
    made.client = {
        "security_protocol": protocol,
        "sasl_mechanism": mechanism,
        "sasl_plain_username": USER,
        "sasl_plain_password": PASSWORD,
    }
    if certificates is not None:
        made.security += [
            *("--ssl-cafile", str(certificates["ca"])),
            *("--ssl-certfile", str(certificates["client"])),
            *("--ssl-keyfile", str(certificates["client_key"])),
        ]
        made.client.update(_tls_client(certificates))
        made.client["security_protocol"] = protocol
    monkeypatch.setenv("LIMITFLOW_SASL_PASSWORD", PASSWORD)  # every subprocess's
    return made


@pytest.fixture
def runs() -> Iterator[list[Setup]]:
    made: list[Setup] = []
    yield made
    for setup in made:
        setup.kill_all()


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
async def test_verdicts_over_sasl_equal_replay(
    sasl: Any, mechanism: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, runs: list[Setup]
) -> None:
    broker, front = sasl
    setup = _setup(broker, tmp_path, monkeypatch, mechanism)
    runs.append(setup)
    before = len(front.admitted)
    setup.create_topics()  # logged in too
    lines = make_events(300, seed=51)
    sources = await produce(setup.bootstrap, setup.topics[0], lines, **setup.client)
    proc = setup.run("--batch-size", "50")
    await check_against_replay(setup, lines, sources)
    assert setup.stop(proc) == 0, setup.log(0)
    assert {used for used, _ in front.admitted[before:]} == {mechanism}
    log = setup.log(0)
    started = next(json.loads(x) for x in log.splitlines() if '"msg": "starting"' in x)
    assert (started["security_protocol"], started["sasl_username"]) == ("SASL_PLAINTEXT", USER)
    assert PASSWORD not in log


async def test_scram_over_mutual_tls_equals_replay(
    sasl_ssl: Any,
    certificates: dict[str, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    runs: list[Setup],
) -> None:
    broker, front = sasl_ssl
    setup = _setup(broker, tmp_path, monkeypatch, "SCRAM-SHA-512", certificates)
    runs.append(setup)
    setup.create_topics()
    lines = make_events(300, seed=52)
    sources = await produce(setup.bootstrap, setup.topics[0], lines, **setup.client)
    proc = setup.run("--batch-size", "50")
    await check_against_replay(setup, lines, sources)
    assert setup.stop(proc) == 0, setup.log(0)
    assert ("SCRAM-SHA-512", USER) in front.admitted


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256"])
def test_a_wrong_password_is_refused_and_said_and_run_waits(
    sasl: Any, mechanism: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, runs: list[Setup]
) -> None:
    broker, front = sasl
    setup = _setup(broker, tmp_path, monkeypatch, mechanism)
    runs.append(setup)
    monkeypatch.setenv("LIMITFLOW_SASL_PASSWORD", "not the password")
    refused = front.refused
    proc = setup.run()
    log = _waits_for_kafka(setup, 0)
    assert "Authentication failed: Invalid username or password" in log, log[-2000:]
    assert front.refused > refused
    assert proc.poll() is None  # it waits, as for brokers that are down
    assert setup.stop(proc) == 0
    assert "not the password" not in setup.log(0)


async def test_the_faust_app_over_sasl_equals_replay(
    sasl: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, runs: list[Setup]
) -> None:
    broker, front = sasl
    setup = _setup(broker, tmp_path, monkeypatch, "SCRAM-SHA-256")
    runs.append(setup)
    setup.create_topics()
    lines = make_events(300, seed=53)
    sources = await produce(setup.bootstrap, setup.topics[0], lines, **setup.client)
    before = len(front.admitted)
    log = await check_faust_against_replay(  # its password from the environment
        setup,
        lines,
        sources,
        security_protocol="SASL_PLAINTEXT",
        sasl_mechanism="SCRAM-SHA-256",
        sasl_username=USER,
    )
    # the worker's clients logged in, with the mechanism they were given
    assert {used for used, _ in front.admitted[before:]} == {"SCRAM-SHA-256"}
    assert PASSWORD not in log


def test_the_sample_scripts_take_the_same_sasl_settings(
    sasl: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    broker, front = sasl
    setup = _setup(broker, tmp_path, monkeypatch, "SCRAM-SHA-512")
    setup.create_topics()
    env = {
        **os.environ,
        "LIMITFLOW_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
        "LIMITFLOW_SASL_MECHANISM": "SCRAM-SHA-512",
        "LIMITFLOW_SASL_USERNAME": USER,
    }
    check_sample_scripts(setup, env)
    assert ("SCRAM-SHA-512", USER) in front.admitted
    del env["LIMITFLOW_SASL_PASSWORD"]
    refused = sample_script(setup, env, "consume.py")
    assert refused.returncode == 2
    assert b"sasl_password (LIMITFLOW_SASL_PASSWORD) is required with SASL" in refused.stderr
