"""The documentation names what the code has: metrics, probe fields and variables.

The README and docs/*.md are the operators' contract; a metric renamed or added, or a
variable documented that no setting reads, drifted apart from them without a test."""

from __future__ import annotations

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
