"""``limitflow run``, ``topics create`` and the faust app over TLS, with client
certificates, against a real TLS server in front of tansu
(``tests.servers.kafka_behind_tls``).

A card issuer's brokers take no plain connection: each of limitflow's clients (admin,
consumer, producers, faust's) must check the brokers' certificate and offer its own.
"""

from __future__ import annotations

import json
import os
import random
import signal
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.faust_worker import faust_worker
from tests.integration.test_kafka_run import (
    REPO,
    Setup,
    check_against_replay,
    make_events,
    produce,
)
from tests.servers import kafka_behind_tls, make_certificates

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return make_certificates(tmp_path_factory.mktemp("certificates"))


@pytest.fixture(scope="module")
def broker(certificates: dict[str, Path]) -> Iterator[Any]:
    with kafka_behind_tls(certificates) as handle:
        yield handle


def _client(certificates: dict[str, Path]) -> dict[str, Any]:
    context = ssl.create_default_context(cafile=certificates["ca"])
    context.load_cert_chain(certificates["client"], certificates["client_key"])
    return {"security_protocol": "SSL", "ssl_context": context}


@pytest.fixture
def setup(broker: Any, certificates: dict[str, Path], tmp_path: Path) -> Iterator[Setup]:
    made = Setup(broker.bootstrap_servers, tmp_path, f"tls-{random.randrange(10**6)}")
    made.security = [
        *("--security-protocol", "SSL", "--ssl-cafile", str(certificates["ca"])),
        *("--ssl-certfile", str(certificates["client"])),
        *("--ssl-keyfile", str(certificates["client_key"])),
    ]
    made.client = _client(certificates)
    made.create_topics()  # over TLS too
    yield made
    made.kill_all()


async def test_verdicts_over_tls_with_client_certificates_equal_replay(
    setup: Setup, certificates: dict[str, Path]
) -> None:
    lines = make_events(400, seed=31)
    sources = await produce(setup.bootstrap, setup.topics[0], lines, **setup.client)
    proc = setup.run("--batch-size", "50")
    await check_against_replay(setup, lines, sources)
    assert setup.stop(proc) == 0, setup.log(0)
    started = next(json.loads(x) for x in setup.log(0).splitlines() if '"msg": "starting"' in x)
    assert started["security_protocol"] == "SSL"


def _waits_for_kafka(setup: Setup, index: int, seconds: float = 20) -> str:
    """The log of run ``index`` once it has said it cannot reach Kafka (it waits on)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        log = setup.log(index)
        if "cannot reach Kafka" in log:
            return log
        time.sleep(0.2)
    raise AssertionError(setup.log(index)[-2000:])


def test_brokers_whose_certificate_the_ca_did_not_sign_are_never_trusted(
    setup: Setup, tmp_path: Path
) -> None:
    other = make_certificates(tmp_path / "other")  # another CA, same names
    setup.security[setup.security.index("--ssl-cafile") + 1] = str(other["ca"])
    proc = setup.run()
    log = _waits_for_kafka(setup, 0)
    assert "CERTIFICATE_VERIFY_FAILED" in log, log[-2000:]
    assert proc.poll() is None  # it waits, as for brokers that are down
    assert setup.stop(proc) == 0


def test_a_client_without_its_certificate_is_refused_by_the_brokers(setup: Setup) -> None:
    setup.security = setup.security[:4]  # protocol and CA, no client certificate
    proc = setup.run()
    _waits_for_kafka(setup, 0)
    assert proc.poll() is None
    assert setup.stop(proc) == 0


async def test_the_faust_app_over_tls_with_client_certificates_equals_replay(
    setup: Setup, certificates: dict[str, Path]
) -> None:
    lines = make_events(300, seed=32)
    sources = await produce(setup.bootstrap, setup.topics[0], lines, **setup.client)
    await check_faust_against_replay(
        setup,
        lines,
        sources,
        security_protocol="SSL",
        ssl_cafile=str(certificates["ca"]),
        ssl_certfile=str(certificates["client"]),
        ssl_keyfile=str(certificates["client_key"]),
    )


async def check_faust_against_replay(
    setup: Setup, lines: list[bytes], sources: list[str], **settings: str
) -> str:
    """A faust worker on the set-up, with ``settings`` (``LIMITFLOW_*`` values), publishes
    replay's verdicts and dead letters for ``lines``, then stops with exit 0; its log."""
    argv, env = faust_worker(
        setup.bootstrap, setup.topics, f"{setup.name}-faust", setup.store, **settings
    )
    with open(setup.tmp / "faust.log", "wb") as log:
        worker = subprocess.Popen(argv, env=env, cwd=REPO, stdout=log, stderr=log)
    try:
        await check_against_replay(setup, lines, sources)
    finally:
        worker.send_signal(signal.SIGTERM)
        try:
            assert worker.wait(60) == 0, (setup.tmp / "faust.log").read_text()[-3000:]
        finally:
            worker.kill()
            worker.wait()
    return (setup.tmp / "faust.log").read_text()


def sample_script(
    setup: Setup, env: dict[str, str], name: str, *argv: str
) -> subprocess.CompletedProcess[bytes]:
    """``examples/NAME`` on the set-up's input topic, in the environment ``env``."""
    topic = ("--bootstrap-servers", setup.bootstrap, "--topic", setup.topics[0])
    return subprocess.run(
        [sys.executable, str(REPO / "examples" / name), *topic, *argv],
        env=env,
        capture_output=True,
        timeout=60,
        check=False,
    )


def check_sample_scripts(setup: Setup, env: dict[str, str]) -> None:
    """The sample producer sends examples/events.jsonl, and the sample consumer reads it
    back, both with the settings of ``env``."""
    sent = sample_script(setup, env, "produce.py", "--rate", "0", "--wait", "5")
    assert sent.returncode == 0, sent.stderr.decode()
    read = sample_script(setup, env, "consume.py", "--max-records", "13", "--timeout", "10")
    assert read.returncode == 0, read.stderr.decode()
    sample = (REPO / "examples" / "events.jsonl").read_bytes().splitlines()
    assert sorted(read.stdout.splitlines()) == sorted(line for line in sample if line.strip())


def test_the_sample_scripts_take_the_same_tls_settings(
    setup: Setup, certificates: dict[str, Path]
) -> None:
    env = {
        **os.environ,
        "LIMITFLOW_SECURITY_PROTOCOL": "SSL",
        "LIMITFLOW_SSL_CAFILE": str(certificates["ca"]),
        "LIMITFLOW_SSL_CERTFILE": str(certificates["client"]),
        "LIMITFLOW_SSL_KEYFILE": str(certificates["client_key"]),
    }
    check_sample_scripts(setup, env)
    env["LIMITFLOW_SSL_CAFILE"] = "/nowhere/ca.pem"
    refused = sample_script(setup, env, "consume.py")
    assert refused.returncode == 2
    assert b"TLS: ssl_cafile (LIMITFLOW_SSL_CAFILE) /nowhere/ca.pem" in refused.stderr
