"""The checked-in JSON Schemas match the models, and real messages validate against them."""

from __future__ import annotations

import asyncio
import hashlib
import json
from pathlib import Path

import jsonschema
import pytest
import yaml

from handlers.decide import Decider, OutcomeKind
from schemas.events import DeadLetterError, EventRejected, parse_event
from schemas.generate import MODELS, OUT, render
from schemas.rules import load_rules
from schemas.verdicts import dead_letter, encode_dead_letter, verdict_encoder
from stores.memory import MemoryStore
from streams.engine import Engine, Record

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def schema(name: str) -> dict[str, object]:
    loaded: dict[str, object] = json.loads((OUT / f"{name}.schema.json").read_text())
    return loaded


@pytest.mark.parametrize("name", sorted(MODELS))
def test_checked_in_schema_is_current(name: str) -> None:
    assert (OUT / f"{name}.schema.json").read_text() == render(name), (
        "run: python -m schemas.generate"
    )


def test_example_messages_validate() -> None:
    lines = [line for line in (EXAMPLES / "events.jsonl").read_bytes().splitlines() if line]
    engine = Engine(Decider(load_rules(str(EXAMPLES / "rules.yaml"))), MemoryStore())
    results = asyncio.run(engine.process([Record(line, {"line": 1}) for line in lines]))
    kinds = {result.kind for result in results}
    assert kinds == {OutcomeKind.VERDICT, OutcomeKind.DUPLICATE, OutcomeKind.DEAD_LETTER}
    event_schema, verdict_schema, dead_schema = (
        schema("event"),
        schema("verdict"),
        schema("dead_letter"),
    )
    for result in results:
        if result.kind is OutcomeKind.DEAD_LETTER:
            assert result.error is not None and result.detail is not None
            letter = dead_letter(result.error, result.detail, result.record.raw, {"line": 1})
            jsonschema.validate(json.loads(verdict_encoder.encode(letter)), dead_schema)
        else:
            jsonschema.validate(json.loads(result.record.raw), event_schema)
            assert result.verdict is not None
            jsonschema.validate(json.loads(result.verdict), verdict_schema)


def test_example_rules_validate() -> None:
    jsonschema.validate(yaml.safe_load((EXAMPLES / "rules.yaml").read_text()), schema("rules"))


def test_event_schema_refuses_a_naive_time() -> None:
    event = {"event_id": "e", "account_id": "a", "amount": "1", "currency": "CNY"}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**event, "occurred_at": "2026-03-14 14:20:00"}, schema("event"))
    jsonschema.validate({**event, "occurred_at": "2026-03-14T14:20:00+08:00"}, schema("event"))


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("occurred_at", "2026-03-14T14:20:00Z"),
        ("occurred_at", "2026-03-14t14:20:00.123456789z"),
        ("occurred_at", "2026-03-14 14:20:00-05:00"),
        ("occurred_at", "2026-03-14T14:20Z"),  # no seconds: the schema took it
        ("occurred_at", "2026-W11-6T14:20:00Z"),
        ("occurred_at", "2026-03-14T14:20:00+0800"),
        ("occurred_at", "2026-03-14T14:20:00"),
        ("occurred_at", "2026-03-14T14:20:00." + "0" * 60 + "Z"),  # over 64 characters
        ("amount", "12.50"),
        ("amount", " 12.5 "),
        ("amount", "1e3"),  # the schema refused it
        ("amount", "+7"),
        ("amount", ".5"),
        ("amount", "1_000"),
        ("amount", "\uff11\uff12"),  # fullwidth digits
        ("amount", "12,50"),
    ],
)
def test_the_event_schema_and_the_parser_agree_on_the_form_of_a_field(
    field: str, value: str
) -> None:
    # other teams validate against the schema: it must take what limitflow takes
    event = {"event_id": "e", "account_id": "a", "amount": "1", "currency": "CNY"}
    event = {**event, "occurred_at": "2026-03-14T14:20:00Z", field: value}
    try:
        jsonschema.validate(event, schema("event"))
        schema_takes = True
    except jsonschema.ValidationError:
        schema_takes = False
    try:
        parse_event(json.dumps(event))
        parser_takes = True
    except EventRejected:
        parser_takes = False
    assert schema_takes == parser_takes


def test_a_dead_letter_over_the_message_limit_names_its_record_instead() -> None:
    raw = b'{"event_id": "e1", ' + b"x" * 5_000
    source: dict[str, str | int] = {"topic": "t", "partition": 0, "offset": 7}
    letter = dead_letter(DeadLetterError.INVALID_JSON, "not valid JSON", raw, source, "e1")
    whole = json.loads(encode_dead_letter(letter, raw, max_bytes=10_000))
    assert whole["raw"] == raw.decode() and "raw_size" not in whole
    small = json.loads(encode_dead_letter(letter, raw, max_bytes=1_000))
    assert small["raw"] is None and "raw_base64" not in small
    assert (small["raw_size"], small["raw_sha256"]) == (len(raw), hashlib.sha256(raw).hexdigest())
    assert small["error"] == "invalid_json" and small["source"] == source
    assert small["event_id"] == "e1" and "too large to repeat" in small["detail"]
    jsonschema.validate(small, schema("dead_letter"))
