"""The documentation names what the code has: metrics, probe fields and variables.

The README and docs/*.md are the operators' contract; a metric renamed or added, or a
variable documented that no setting reads, drifted apart from them without a test."""

from __future__ import annotations

import argparse
import dataclasses
import re
from pathlib import Path

from streams.ops import Health, Metrics

ROOT = Path(__file__).resolve().parents[2]
DOCS = (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")))


def _text(*paths: Path) -> str:
    return "\n".join(path.read_text(encoding="utf-8") for path in paths)


def _exposed_metrics() -> set[str]:
    """Each metric's name as ``/metrics`` shows it (a counter's with ``_total``)."""
    return {
        f"{family.name}_total" if family.type == "counter" else family.name
        for family in Metrics().registry.collect()
    }


def test_readme_names_every_metric_and_the_docs_no_other() -> None:
    readme = _text(ROOT / "README.md")
    exposed = _exposed_metrics()
    for name in sorted(exposed):
        assert f"`{name}" in readme, f"{name} is not in the README's ops endpoint"
    named = set(re.findall(r"\blimitflow_[a-z_]+", _text(*DOCS)))
    assert named <= exposed, f"documented, but no such metric: {sorted(named - exposed)}"


def test_readme_names_every_field_of_the_probes() -> None:
    readme = _text(ROOT / "README.md")
    for field in Health(Metrics()).describe():
        assert f"`{field}`" in readme, field


def _variables(text: str) -> set[str]:
    return set(re.findall(r"\bLIMITFLOW_[A-Z_]*[A-Z]", text))


def test_every_variable_the_docs_name_is_read() -> None:
    from limitflow.settings import unknown_variables

    shown = _text(*DOCS, ROOT / "docker-compose.yml", ROOT / "Dockerfile")
    # the README's own example of a misspelt one, which run names in a warning
    named = _variables(shown) - {"LIMITFLOW_GUARANTE"}
    assert unknown_variables(dict.fromkeys(named, "")) == []


def test_the_faust_docs_name_every_variable_the_app_reads() -> None:
    from limitflow.settings import GROUPS, STORE_PASSWORD, KafkaSecurity, env_name
    from streams.faust_app import FaustSettings

    faust = _text(ROOT / "docs" / "faust.md")
    # the table abbreviates a row's further names: `LIMITFLOW_INPUT_TOPIC` / `_OUTPUT_TOPIC`
    shown = _variables(faust) | {
        f"LIMITFLOW{short}" for short in re.findall(r"`(_[A-Z_]*[A-Z])`", faust)
    }
    read = {
        env_name(spec.name)
        for cls in (FaustSettings, KafkaSecurity)
        for spec in dataclasses.fields(cls)
        if spec.name not in GROUPS
    }
    read.add(env_name(STORE_PASSWORD))
    assert read <= shown, f"not in docs/faust.md: {sorted(read - shown)}"


def _stated_default(text: str) -> str | None:
    """The default a flag's help states: "(default X)", "X (default)" or a closing "(X)"."""
    text = text.split(" [env ")[0]
    for pattern in (r"\(default ([^)]+)\)", r"(\S+) \(default\)", r"\(([^()]+)\)$"):
        found = re.search(pattern, text)
        if found:
            return found.group(1)
    return None


def test_run_help_states_each_default_as_the_settings_have_it() -> None:
    from limitflow.cli import build_parser
    from limitflow.settings import KafkaSecurity, KafkaSettings, RunSettings

    defaults = {
        spec.name: spec.default
        for cls in (RunSettings, KafkaSettings, KafkaSecurity)
        for spec in dataclasses.fields(cls)
        if spec.default is not dataclasses.MISSING and spec.name not in ("kafka", "security")
    }
    commands = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    run = commands.choices["run"]
    checked = set()
    for action in run._actions:
        if action.dest not in defaults or not action.help:
            continue
        default = defaults[action.dest]
        if default == "" or default is False:  # none (the system's CAs, no SASL), or a switch off
            continue
        shown = _stated_default(action.help)
        assert shown is not None, f"--{action.dest}: its default {default!r} is not stated"
        assert shown == str(getattr(default, "value", default)), action.dest
        checked.add(action.dest)
    assert {"batch_size", "store", "guarantee", "http_port", "shutdown_grace_ms"} <= checked
