"""docker-compose.yml's own scripts, run by ``sh`` as the containers run them (no Docker
here: the programs they call are stand-ins)."""

from __future__ import annotations

import os
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
