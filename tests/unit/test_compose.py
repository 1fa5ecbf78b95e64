"""docker-compose.yml's own scripts, run by ``sh`` as the containers run them (no Docker
here: the programs they call are stand-ins)."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
from pathlib import Path

import pytest
import yaml

COMPOSE = Path(__file__).resolve().parents[2] / "docker-compose.yml"


def _store_init_script() -> str:
    """store-init's ``sh -c`` script, with compose's ``$$`` read as ``$`` and no waits."""
    command = yaml.safe_load(COMPOSE.read_text())["services"]["store-init"]["command"]
    assert command[:2] == ["sh", "-c"]
    return str(command[2]).replace("$$", "$").replace("sleep 5", "sleep 0")


@pytest.mark.parametrize(
    ("limitflow", "code", "retries"),
    [
        ("exit 0", 0, 0),
        ("exit 2", 2, 0),  # a usage or settings error: trying again would not help
        ("exit 3", 3, 11),  # the store never came up: a minute, then its exit code
        # DynamoDB Local came up on the third try
        (
            'n=$(cat "$TRIES" 2>/dev/null || echo 0); echo $((n + 1)) > "$TRIES";'
            ' [ "$n" -ge 2 ] || exit 3',
            0,
            2,
        ),
    ],
)
def test_store_init_waits_for_a_store_still_coming_up(
    tmp_path: Path, limitflow: str, code: int, retries: int
) -> None:
    program = tmp_path / "limitflow"
    program.write_text(f"#!/bin/sh\n{limitflow}\n")
    program.chmod(0o755)
    env = dict(
        os.environ,
        PATH=f"{tmp_path}{os.pathsep}{os.environ['PATH']}",
        LIMITFLOW_STORE="dynamodb://limitflow",
        TRIES=str(tmp_path / "tries"),
    )
    done = subprocess.run(
        ["sh", "-c", _store_init_script()], env=env, capture_output=True, text=True, timeout=30
    )
    assert done.returncode == code, done.stderr
    assert done.stderr.count("trying again") == retries


def _service_env(service: str, shell: dict[str, str]) -> dict[str, str]:
    """A service's ``environment`` as compose gives it: ``${NAME:-default}`` read from
    ``shell`` (the variables of the ``docker compose up`` that starts it)."""
    environment = yaml.safe_load(COMPOSE.read_text())["services"][service]["environment"]

    def substitute(value: object) -> str:
        return re.sub(
            r"\$\{(\w+):-([^}]*)\}",
            lambda m: shell.get(m.group(1)) or m.group(2),
            str(value),
        )

    return {name: substitute(value) for name, value in environment.items()}


STORES: tuple[dict[str, str], ...] = (
    {},
    {"LIMITFLOW_STORE": "mongodb://mongodb:27017/limitflow?replicaSet=rs0"},
    {"LIMITFLOW_STORE": "dynamodb://limitflow?endpoint_url=http://dynamodb:8000"},
    {"LIMITFLOW_GUARANTEE": "exactly-once"},
)
"""The ``docker compose up`` variations that docker-compose.yml and docs/faust.md show."""


@pytest.mark.parametrize("shell", STORES)
def test_the_services_settings_load_as_run_and_the_faust_app_read_them(
    shell: dict[str, str],
) -> None:
    # docs/faust.md once listed these as not checked: the settings and the store backends
    # had not landed when the file was written
    from limitflow.settings import load_run_settings, unknown_variables
    from stores import embedded, open_store
    from streams.faust_app import FaustSettings, run_only_variables

    run_env = _service_env("limitflow", shell)
    settings = load_run_settings({}, run_env)
    assert settings.http_host == "0.0.0.0" and settings.http_port == 8080
    assert settings.guarantee.value == shell.get("LIMITFLOW_GUARANTEE", "at-least-once")
    faust_env = _service_env("limitflow-faust", shell)
    faust = FaustSettings.from_env(faust_env)
    assert faust.output_topic != settings.kafka.output_topic
    assert faust.store != settings.store  # a state of its own
    for env in (run_env, faust_env, _service_env("store-init", shell)):
        assert unknown_variables(env) == []
    assert run_only_variables(faust_env) == []
    # each store URL is one limitflow takes (a server's client connects to nothing yet;
    # a sqlite file, in the containers' /data, is only read as a URL)
    for url in {settings.store, faust.store}:
        if url.startswith("sqlite:"):
            assert embedded(url)[1] is not None
            continue
        store = open_store(url)
        asyncio.run(store.close())
