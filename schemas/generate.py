"""Write the JSON Schema files in ``schemas/json/`` from the message models.

Run ``python -m schemas.generate`` after changing a model; a test fails while the
checked-in files differ from what this produces.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Final

import msgspec

from schemas.currencies import MINOR_UNITS
from schemas.events import EventDoc
from schemas.rules import _SCOPE_FIELD, RulesDoc
from schemas.verdicts import DeadLetter, Verdict

OUT = Path(__file__).resolve().parent / "json"
MODELS: dict[str, tuple[Any, str]] = {
    "event": (EventDoc, "A transaction event (one JSON object per line or Kafka record)."),
    "verdict": (Verdict, "The explained decision limitflow publishes for one event."),
    "dead_letter": (DeadLetter, "An input record that produced no verdict."),
    "rules": (RulesDoc, "A limitflow rules file (YAML or JSON)."),
}


_POSITIVE_DECIMAL: Final = (
    r"^[ \t\n\r]*\+?([0-9]*[1-9][0-9]*(\.[0-9]*)?|[0-9]*\.[0-9]*[1-9][0-9]*)"
    r"([eE][+-]?[0-9]+)?[ \t\n\r]*$"
)
"""A decimal string with a non-zero digit: > 0 (blanks around it, as the parser takes)."""
_DECIMAL: Final = (
    r"^[ \t\n\r]*(\+?([0-9]+(\.[0-9]*)?|\.[0-9]+)|-(0+(\.0*)?|\.0+))([eE][+-]?[0-9]+)?"
    r"[ \t\n\r]*$"
)
"""A decimal string >= 0: a zero may have a minus sign (``-0``, ``-0.00``), which the
parser takes as the 0 it is, as it takes the JSON number ``-0``."""
_NOT_NULL: Final = {"not": {"type": "null"}}


def _present(*names: str) -> dict[str, Any]:
    """Schema of an object in which each of ``names`` is present and not null."""
    return {"required": list(names), "properties": dict.fromkeys(names, _NOT_NULL)}


def _tighten(name: str, defs: dict[str, Any]) -> None:
    """Add what the parser checks beyond the models' types, so that other teams'
    validation refuses what limitflow would (not all of it: calendar dates, the digits
    a currency allows, IANA zone names and unique rule ids are left to limitflow)."""
    currencies = sorted(MINOR_UNITS)
    if name == "event":
        props = defs["EventDoc"]["properties"]
        props["currency"]["anyOf"][0] = {"enum": currencies, "type": "string"}
        props["amount"]["anyOf"][0]["pattern"] = _POSITIVE_DECIMAL
        defs["EventDoc"]["if"] = {
            "properties": {"type": {"const": "reversal"}},
            "required": ["type"],
        }
        defs["EventDoc"]["then"] = _present("original_event_id")
        defs["EventDoc"]["else"] = _present("amount", "currency")
    elif name == "rules":
        defs["RulesDoc"]["properties"]["rules"]["minItems"] = 1
        rule = defs["RuleDoc"]
        props = rule["properties"]
        props["currency"]["anyOf"][0] = {"enum": currencies, "type": "string"}
        field = {"pattern": _SCOPE_FIELD.pattern.join("^$"), "type": "string"}
        props["scope"]["anyOf"] = [
            field,
            {"items": field, "minItems": 1, "type": "array", "uniqueItems": True},
        ]
        amount = props["max_amount"]["anyOf"]
        amount[0]["pattern"] = _DECIMAL
        amount[1]["minimum"] = amount[2]["minimum"] = 0
        values = props["match"]["anyOf"][0]["additionalProperties"]["anyOf"]
        values.insert(3, {"type": "number"})  # compared by its value's text
        values[-1]["minItems"] = 1
        values[-1]["items"]["anyOf"].append({"type": "number"})
        rule["allOf"] = [
            {"anyOf": [_present("max_count"), _present("max_amount")]},
            {"if": _present("max_amount"), "then": _present("currency")},
            {
                "if": {"properties": {"window": {"const": "transaction"}}},
                "then": {"allOf": [_present("max_amount"), {"not": _present("max_count")}]},
            },
        ]


_NO_NEWLINE: Final = {"pattern": "\\n"}
"""A text with a newline in it (``"not"`` of it: none)."""


def _anchored(node: Any) -> None:
    """Refuse a newline in the text of every ``pattern`` under ``node`` that takes none.
    Its ``$`` is the end of the text in the regexes JSON Schema names (ECMA-262), but
    Python's (``jsonschema``) also matches it before a last newline: ``"…Z\\n"`` and a
    rule id ``"r\\n"`` passed there, which limitflow refuses. Said apart, with no
    lookahead (``$(?!\\n)``), which the regexes of Go's or Rust's validators lack."""
    if isinstance(node, dict):
        pattern = node.get("pattern")
        if isinstance(pattern, str) and "\\n" not in pattern:  # blanks around an amount
            assert node.get("not", _NO_NEWLINE) == _NO_NEWLINE, node  # (a dict seen twice)
            node["not"] = _NO_NEWLINE
        for value in node.values():
            _anchored(value)
    elif isinstance(node, list):
        for value in node:
            _anchored(value)


def render(name: str) -> str:
    """The schema file text of one model."""
    model, title = MODELS[name]
    schema = msgspec.json.schema(model)
    _tighten(name, schema["$defs"])
    _anchored(schema)
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
