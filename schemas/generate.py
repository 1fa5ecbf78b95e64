"""Write the JSON Schema files in ``schemas/json/`` from the message models.

Run ``python -m schemas.generate`` after changing a model; a test fails while the
checked-in files differ from what this produces.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec

from schemas.events import EventDoc
from schemas.rules import RulesDoc
from schemas.verdicts import DeadLetter, Verdict

OUT = Path(__file__).resolve().parent / "json"
MODELS: dict[str, tuple[Any, str]] = {
    "event": (EventDoc, "A transaction event (one JSON object per line or Kafka record)."),
    "verdict": (Verdict, "The explained decision limitflow publishes for one event."),
    "dead_letter": (DeadLetter, "An input record that produced no verdict."),
    "rules": (RulesDoc, "A limitflow rules file (YAML or JSON)."),
}


def render(name: str) -> str:
    """The schema file text of one model."""
    model, title = MODELS[name]
    schema = msgspec.json.schema(model)
    schema = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": f"https://limitflow.dev/schemas/{name}.schema.json",
        "description": title,
        **schema,
    }
    return json.dumps(schema, indent=2, sort_keys=True) + "\n"


def main() -> None:
    OUT.mkdir(exist_ok=True)
    for name in MODELS:
        (OUT / f"{name}.schema.json").write_text(render(name))
        print(f"wrote {OUT / f'{name}.schema.json'}")


if __name__ == "__main__":
    main()
