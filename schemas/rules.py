"""The rules file: limits as data, validated before any event is processed."""

from __future__ import annotations

import enum
import functools
import hashlib
import re
from typing import Annotated, Any, Final
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError, available_timezones

import msgspec
import yaml

from limitflow.errors import LimitflowError
from schemas.amounts import AmountError, to_minor
from schemas.currencies import MINOR_UNITS


class Window(enum.StrEnum):
    """The period a counter covers. Periods are calendar periods in the rule's zone."""

    TRANSACTION = "transaction"
    MINUTE = "minute"
    HOUR = "hour"
    DAY = "day"
    WEEK = "week"
    MONTH = "month"
    YEAR = "year"
    LIFETIME = "lifetime"


RuleId = Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9._-]+$", min_length=1, max_length=64)]
Scalar = str | int | bool


class RuleDoc(msgspec.Struct, forbid_unknown_fields=True):
    """One limit, as written in the rules file."""

    id: RuleId
    window: Window
    scope: str | list[str] = "account_id"
    """Event field, or list of fields, whose values form the counter key."""
    timezone: str = "UTC"
    """IANA zone name; periods are calendar periods in this zone."""
    currency: Annotated[str, msgspec.Meta(pattern=r"^[A-Z]{3}$")] | None = None
    """The rule applies only to events in this currency."""
    max_count: Annotated[int, msgspec.Meta(ge=0)] | None = None
    max_amount: str | int | float | None = None
    """Decimal >= 0 in ``currency`` (a string keeps it exact)."""
    match: dict[str, Scalar | list[Scalar]] | None = None
    """Every listed event field must equal one of the values (compared as text)."""
    description: str | None = None


class RulesDoc(msgspec.Struct, forbid_unknown_fields=True):
    """The whole rules file."""

    rules: list[RuleDoc]


class Rule(msgspec.Struct, frozen=True):
    """A validated rule, ready for the decision core."""

    id: str
    window: Window
    scope: tuple[str, ...]
    timezone: str
    currency: str | None
    max_count: int | None
    max_amount: int | None
    """Minor units of ``currency``."""
    match: tuple[tuple[str, frozenset[str]], ...]


class RuleSet(msgspec.Struct, frozen=True):
    """Validated rules and the version (content hash) they came from."""

    rules: tuple[Rule, ...]
    version: str


class RulesError(LimitflowError, ValueError):
    """The rules file is unusable; the message names the rule and the field."""


_SCOPE_FIELD: Final = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]*$")


def scalar_text(value: object) -> str | None:
    """Text form of a scalar event value for scopes and matches; None for other values."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if value is None or isinstance(value, dict | list):
        return None
    return str(value)  # Decimal from a JSON number literal


@functools.cache
def _zones() -> frozenset[str]:
    """IANA zone names (not aliases of the host's clock such as ``localtime``)."""
    return frozenset(available_timezones()) - {"localtime", "posixrules"}


def _compile(doc: RuleDoc) -> Rule:
    where = f"rule {doc.id!r}"
    scope = (doc.scope,) if isinstance(doc.scope, str) else tuple(doc.scope)
    if not scope:
        raise RulesError(f"{where}: scope: must name at least one field")
    for field in scope:
        if not _SCOPE_FIELD.match(field):
            raise RulesError(f"{where}: scope: {field!r} is not a field name")
    if len(set(scope)) != len(scope):
        raise RulesError(f"{where}: scope: lists a field twice")
    try:
        if doc.timezone not in _zones():
            raise ZoneInfoNotFoundError(doc.timezone)
        ZoneInfo(doc.timezone)
    except (ZoneInfoNotFoundError, ValueError):
        raise RulesError(f"{where}: timezone: {doc.timezone!r} is not an IANA zone") from None
    if doc.currency is not None and doc.currency not in MINOR_UNITS:
        raise RulesError(f"{where}: currency: {doc.currency!r} is not an ISO 4217 code")
    if doc.max_count is None and doc.max_amount is None:
        raise RulesError(f"{where}: needs max_count, max_amount or both")
    max_amount = None
    if doc.max_amount is not None:
        if doc.currency is None:
            raise RulesError(f"{where}: max_amount: needs currency")
        try:
            literal = repr(doc.max_amount) if isinstance(doc.max_amount, float) else doc.max_amount
            max_amount = to_minor(literal, MINOR_UNITS[doc.currency], allow_zero=True)
        except AmountError as exc:
            raise RulesError(f"{where}: max_amount: {exc}") from None
    if doc.window is Window.TRANSACTION and max_amount is None:
        raise RulesError(f"{where}: a transaction window limits the amount: set max_amount")
    match: list[tuple[str, frozenset[str]]] = []
    for field, allowed in (doc.match or {}).items():
        values = allowed if isinstance(allowed, list) else [allowed]
        if not values:
            raise RulesError(f"{where}: match: {field}: lists no values")
        match.append((field, frozenset(str(scalar_text(v)) for v in values)))
    return Rule(
        id=doc.id,
        window=doc.window,
        scope=scope,
        timezone=doc.timezone,
        currency=doc.currency,
        max_count=doc.max_count,
        max_amount=max_amount,
        match=tuple(match),
    )


def parse_rules(text: str | bytes) -> RuleSet:
    """Validate a rules file (YAML or JSON) and compile it."""
    try:
        data: Any = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise RulesError(f"not valid YAML: {_yaml_problem(exc)}") from None
    try:
        doc = msgspec.convert(data, RulesDoc)
    except msgspec.ValidationError as exc:
        raise RulesError(_describe(data, exc)) from None
    if not doc.rules:
        raise RulesError("rules: the file defines no rules")
    seen: set[str] = set()
    for rule in doc.rules:
        if rule.id in seen:
            raise RulesError(f"rule {rule.id!r}: id: used by more than one rule")
        seen.add(rule.id)
    raw = text.encode() if isinstance(text, str) else text
    return RuleSet(
        rules=tuple(_compile(rule) for rule in doc.rules),
        version=hashlib.sha256(raw).hexdigest()[:12],
    )


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """A YAML error on one line (the CLI's reason is one line): what and where."""
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem_mark is not None:
        mark = exc.problem_mark
        what = ", ".join(part for part in (exc.context, exc.problem) if part)
        return f"{what} (line {mark.line + 1}, column {mark.column + 1})"
    return " ".join(str(exc).split())


def _describe(data: Any, exc: msgspec.ValidationError) -> str:
    """Prefix a validation error with the id of the rule it is about, when there is one."""
    message = str(exc)
    found = re.search(r"\$\.rules\[(\d+)\]", message)
    if found and isinstance(data, dict) and isinstance(data.get("rules"), list):
        index = int(found.group(1))
        rule = data["rules"][index] if index < len(data["rules"]) else None
        if isinstance(rule, dict) and "id" in rule:
            return f"rule {rule['id']!r} (rules[{index}]): {message}"
        return f"rules[{index}]: {message}"
    return message


def load_rules(path: str) -> RuleSet:
    """Read and validate a rules file; unreadable files are a ``RulesError`` too."""
    try:
        with open(path, "rb") as handle:
            return parse_rules(handle.read())
    except OSError as exc:
        raise RulesError(f"cannot read rules file {path}: {exc.strerror}") from None
