"""Verdicts and dead letters: what limitflow publishes."""

from __future__ import annotations

import base64
import enum
import hashlib
from typing import Final

import msgspec

from schemas.events import DeadLetterError, EventType
from schemas.rules import Window


class Decision(enum.StrEnum):
    """The outcome of a verdict."""

    ACCEPT = "accept"
    REJECT = "reject"


class Reason(enum.StrEnum):
    """Why an event was rejected."""

    LIMIT_EXCEEDED = "limit_exceeded"
    ORIGINAL_NOT_FOUND = "original_not_found"
    ORIGINAL_NOT_ACCEPTED = "original_not_accepted"
    ALREADY_REVERSED = "already_reversed"
    REVERSAL_EXCEEDS_ORIGINAL = "reversal_exceeds_original"


class Metric(enum.StrEnum):
    """What a limit counts."""

    COUNT = "count"
    AMOUNT = "amount"


class Violation(msgspec.Struct, frozen=True, gc=False):
    """One limit the event would have broken."""

    rule_id: str
    metric: Metric
    period: str
    limit: str
    """Decimal string: a count, or an amount in the rule's currency."""
    used: str
    """The bucket's value before this event; 0 for a ``transaction`` window."""


class LimitState(msgspec.Struct, frozen=True, gc=False):
    """A rule's bucket after the decision (``None`` where the rule sets no such limit)."""

    rule_id: str
    window: Window
    period: str
    count_used: int
    count_limit: int | None
    count_remaining: int | None
    amount_used: str | None
    """In the rule's currency; for a ``transaction`` window, this event's amount."""
    amount_limit: str | None
    amount_remaining: str | None


class Verdict(msgspec.Struct, frozen=True, gc=False):
    """The explained decision on one event."""

    event_id: str
    account_id: str
    type: EventType
    decision: Decision
    reason: Reason | None
    seq: int
    """Per account_id: 1, 2, 3… with no gaps; a duplicate repeats the original's."""
    violations: list[Violation]
    occurred_at: str
    amount: str | None
    """The amount the verdict is about (for a reversal, what was or would be released)."""
    currency: str | None
    original_event_id: str | None
    rules_version: str
    """Hash of the rules file the decision was made with."""
    limits: list[LimitState]
    """Every applicable rule's bucket after the decision (for a reversal, those released)."""


class DeadLetter(msgspec.Struct, frozen=True, omit_defaults=True):
    """An input record that produced no verdict, with the original bytes."""

    error: DeadLetterError
    detail: str
    raw: str | None
    """The original record as text; None when it is not UTF-8 (see raw_base64)."""
    source: dict[str, str | int]
    """Where it came from: ``{"line": N}`` or ``{"topic", "partition", "offset"}``."""
    event_id: str | None = None
    raw_base64: str | None = None
    raw_size: int | None = None
    """Set, with ``raw_sha256`` and without ``raw``, when the original record was too
    large to repeat within one output message; it stays at ``source``."""
    raw_sha256: str | None = None


verdict_encoder: Final = msgspec.json.Encoder()


def dead_letter(
    error: DeadLetterError,
    detail: str,
    raw: bytes,
    source: dict[str, str | int],
    event_id: str | None = None,
) -> DeadLetter:
    """Build a dead letter that carries the original bytes losslessly, and a detail of
    at most ``DETAIL_CHARS`` characters."""
    detail = clipped(detail, DETAIL_CHARS)
    try:
        return DeadLetter(error, detail, raw.decode("utf-8"), source, event_id)
    except UnicodeDecodeError:
        return DeadLetter(
            error, detail, None, source, event_id, base64.b64encode(raw).decode("ascii")
        )


DETAIL_CHARS: Final = 1_000
"""Most characters of a dead letter's detail. Details quote the value they refuse: a
``type`` of 400,000 control characters made a detail of 2.4 million bytes (each one
``\\x85`` in Python's repr, then escaped in JSON), a dead letter no broker took, on
every restart, so that its partition stopped there."""


def clipped(detail: str, most: int) -> str:
    """``detail`` cut to ``most`` characters or fewer, saying how long it was."""
    if len(detail) <= most:
        return detail
    return f"{detail[: most - 40]}… ({len(detail):,} characters in all)"


def encode_dead_letter(letter: DeadLetter, raw: bytes, max_bytes: int) -> bytes:
    """``letter`` as JSON; over ``max_bytes`` (a message size limit), without the raw
    record, which a broker would refuse on every retry, and then its detail cut short."""
    value = verdict_encoder.encode(letter)
    if len(value) > max_bytes:
        letter = without_raw(letter, raw)
        value = verdict_encoder.encode(letter)
    if len(value) > max_bytes:  # a limit of a few kilobytes: the detail's first words
        value = verdict_encoder.encode(
            msgspec.structs.replace(letter, detail=clipped(letter.detail, 100))
        )
    return value


def without_raw(letter: DeadLetter, raw: bytes) -> DeadLetter:
    """``letter`` naming its original record by size and SHA-256 instead of holding it."""
    return msgspec.structs.replace(
        letter,
        detail=f"{letter.detail} (the original record, {len(raw):,} bytes, is too large"
        " to repeat in this message: read it at its source)",
        raw=None,
        raw_base64=None,
        raw_size=len(raw),
        raw_sha256=hashlib.sha256(raw).hexdigest(),
    )
