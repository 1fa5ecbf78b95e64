"""How the tests and the Kafka benchmark start the faust app: one command, one environment."""

from __future__ import annotations

import os
import sys
from pathlib import Path

RULES = Path(__file__).resolve().parents[1] / "examples" / "rules.yaml"


def faust_worker(
    bootstrap_servers: str,
    topics: tuple[str, str, str],
    group: str,
    store: str,
    *,
    log_level: str = "info",
    **settings: str,
) -> tuple[list[str], dict[str, str]]:
    """(argv, env) of ``faust -A streams.faust_app worker`` on (input, output, dead-letter)
    topics; ``settings`` are further ``LIMITFLOW_*`` values (``batch_size="500"``)."""
    source, output, dead = topics
    env = {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "LIMITFLOW_BOOTSTRAP_SERVERS": bootstrap_servers,
        "LIMITFLOW_INPUT_TOPIC": source,
        "LIMITFLOW_OUTPUT_TOPIC": output,
        "LIMITFLOW_DEAD_LETTER_TOPIC": dead,
        "LIMITFLOW_GROUP_ID": group,
        "LIMITFLOW_RULES": str(RULES),
        "LIMITFLOW_STORE": store,
        # tansu makes a re-join wait for the old member's session to end
        "LIMITFLOW_SESSION_TIMEOUT_MS": "6000",
    }
    env.update({f"LIMITFLOW_{name.upper()}": value for name, value in settings.items()})
    faust = str(Path(sys.executable).parent / "faust")
    argv = [faust, "-A", "streams.faust_app", "worker", "-l", log_level, "--without-web"]
    return argv, env
