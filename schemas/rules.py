"""The rules file: limits as data, validated before any event is processed."""

from __future__ import annotations

import enum
import functools
import hashlib
import json
import re
import sys
from collections.abc import Sequence
from decimal import Decimal, InvalidOperation
from typing import TYPE_CHECKING, Annotated, Any, Final
from zoneinfo import ZoneInfoNotFoundError

import msgspec
import yaml

from limitflow.errors import LimitflowError
from schemas import zones
from schemas.amounts import (
    MAX_MINOR,
    TEXT_DIGITS,
    AmountError,
    number_text,
    to_decimal,
    to_minor,
)
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
    max_count: Annotated[int, msgspec.Meta(ge=0, le=MAX_MINOR)] | None = None
    """At most 15 digits, as amounts in minor units: verdicts show it, and JSON readers
    such as JavaScript keep integers exact only up to 2^53."""
    max_amount: str | int | float | None = None
    """Decimal >= 0 in ``currency`` (a string keeps it exact)."""
    match: dict[str, Scalar | list[Scalar]] | None = None
    """Every listed event field must equal one of the values (compared as text; a
    number as the text of its value)."""
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


_SCOPE_FIELD: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*")
_RULE_ID: Final = re.compile(r"[A-Za-z0-9._-]+")
"""Checked with ``fullmatch``: the model's pattern (kept for the JSON Schema, whose regex
``$`` ends the text) goes through Python's ``re.search``, where ``$`` also matches before
a final newline, so ``"day\\n"`` would pass it."""


def scalar_text(value: object) -> str | None:
    """Text form of a scalar event value for scopes and matches; None for other values.

    A number's text is its value's (``number_text``): ``77`` and ``77.0`` are one card,
    and match ``[6011]`` alike; a number of more than ``TEXT_DIGITS`` digits has none. A
    string is itself: ``"0742"`` is not ``742``.
    """
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)  # (of at most TEXT_DIGITS digits: longer cannot be made)
    if isinstance(value, Decimal):  # a JSON number literal with a fraction or exponent
        return number_text(value) if value.is_finite() else None
    return None


def _amount_value(where: str, value: object) -> object:
    """A ``match`` value of the field ``amount`` as the number it stands for: an event's
    amount is compared by its value (``"100.00"`` is ``100``), written as text or not."""
    if not isinstance(value, str):
        return value
    try:
        return to_decimal(value)
    except AmountError as exc:
        raise RulesError(f"{where}: match: amount: {exc}") from None


class _Unclear:
    """A plain scalar whose YAML 1.1 reading differs from its text; refused after loading,
    with the rule and field it is in."""

    __slots__ = ("advice", "line", "reading", "text")

    def __init__(self, node: yaml.ScalarNode, reading: str, advice: str) -> None:
        self.text = str(node.value)
        self.reading = reading
        self.advice = advice
        self.line = node.start_mark.line + 1

    @classmethod
    def of(cls, text: str, line: int, reading: str, advice: str) -> _Unclear:
        """One for a value read without refusal, refused later (``_settle_floats``)."""
        unclear = cls.__new__(cls)
        unclear.text, unclear.line, unclear.reading, unclear.advice = text, line, reading, advice
        return unclear

    def __str__(self) -> str:
        text = (
            self.text
            if len(self.text) <= 40
            else f"{self.text[:30]}… ({len(self.text):,} characters)"
        )
        return f"{text} would be read as {self.reading}: {self.advice} (line {self.line})"


_MOST_VALUES: Final = 10_000_000
"""Most values (keys, scalars, lists, mappings) aliases may add to a rules file, beyond
those written in it: sharing a large match list among rules adds far fewer."""


if TYPE_CHECKING:
    _SafeLoader = yaml.SafeLoader
else:
    # libyaml's parser where PyYAML has it (its wheels do): the pure-Python one took
    # ~60 us a value, a minute for a file of 5,000 rules with long match lists, paid at
    # every start of `run` and `replay`. The same YAML 1.1, read the same; only the
    # wording of a syntax error differs
    _SafeLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _RulesLoader(_SafeLoader):
    """YAML with no silent surprises in a file of limits.

    PyYAML reads YAML 1.1, where ``NO`` is false, ``0742`` is octal 482 and ``1_000`` is
    1000, and where a key written twice keeps its last value: a rule listing the country
    NO or the MCC 0742 would never match, and a second ``rules:`` or ``max_count:``
    would silently replace the first. Such a file is refused, saying where and why.
    Floats keep their text as written (exact, as amounts must be; a match value is then
    compared by its value, see ``_settle_floats``), dates their text. Merge keys
    (``<<: *base``) work as in YAML, overriding what they merge.
    """

    def __init__(self, text: str | bytes) -> None:
        super().__init__(text)
        self.texts: dict[str, str] = {}
        """The first copy of each text read: an issuer's file lists the same MCCs in rule
        after rule, and a copy for each held 157-159 MiB at the peak of 5,000 rules of
        200 MCCs where one of each holds 94. (Not ``sys.intern``: the rules are compiled
        from new copies once these are freed, ``parse_rules``.)"""

    may_alias = True
    """Whether the text may hold an alias (a ``*``): a file without one is not walked to
    count what aliases repeat (a third of reading a large file)."""
    unclear = False
    """Whether a value was read as ``_Unclear``: the file is then walked to refuse the
    first, by its rule and field; without one, it is not."""
    floats = False
    """Whether a value was read as a ``_Float``, which ``_settle_floats`` then settles."""
    long_floats = False
    """Whether one was a ``_LongFloat``, which ``_settle_floats`` refuses in a match."""

    def construct_document(self, node: yaml.Node) -> Any:
        """Refuse a document whose aliases repeat more than ``_MOST_VALUES`` values (a
        few hundred bytes of nested aliases expand to gigabytes when walked)."""
        if not self.may_alias:
            return super().construct_document(node)
        sizes: dict[int, int] = {}

        def expanded(each: yaml.Node) -> int:
            known = sizes.get(id(each))
            if known is None:
                sizes[id(each)] = 1  # a node inside itself (a recursive alias) counts once
                if isinstance(each, yaml.MappingNode):
                    children = [part for pair in each.value for part in pair]
                elif isinstance(each, yaml.SequenceNode):
                    children = list(each.value)
                else:
                    children = []
                known = sizes[id(each)] = 1 + sum(expanded(child) for child in children)
            return known

        repeated = expanded(node) - len(sizes)  # values there only through aliases
        if repeated > _MOST_VALUES:
            raise yaml.constructor.ConstructorError(
                None,
                None,
                f"aliases repeat {repeated:,} values in this file; at most {_MOST_VALUES:,}",
                node.start_mark,
            )
        return super().construct_document(node)

    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        """A value, or a refusal that says where: PyYAML's constructors of an explicit tag
        raise what they meet (``!!int c``: ValueError; ``!!bool []``: AttributeError),
        which crashed ``run``, ``replay`` and ``rules check`` with a traceback."""
        try:
            return super().construct_object(node, deep)
        except _UNREADABLE:
            raise _unreadable(node) from None

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        if not isinstance(node, yaml.MappingNode):  # (``!!map [a]``) refused there, saying so
            return super().construct_mapping(node, deep)
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue  # merged keys may be overridden: that is not a repeat
            key = self.construct_object(key_node, deep=True)
            try:
                repeated = key in seen  # (a set is looked up as a frozenset: not added)
                seen.add(key)
            except TypeError:  # unhashable: the base class says so, with its position
                continue
            if repeated:
                raise yaml.constructor.ConstructorError(
                    None, None, f"{key!r} is written twice in one mapping", key_node.start_mark
                )
        return super().construct_mapping(node, deep)

    def construct_sequence(self, node: yaml.SequenceNode, deep: bool = False) -> list[Any]:
        """A list, its plain values made by their tag's constructor directly: without
        ``construct_object``'s bookkeeping per value (kept for what a value's identity
        matters to: lists and mappings, which may hold themselves), an MCC list of a
        large file is read in a fraction of the time. A value an alias repeats is made
        again, equal, as a scalar has no identity to keep."""
        if not isinstance(node, yaml.SequenceNode):
            return super().construct_sequence(node, deep)
        constructors = self.yaml_constructors
        values = []
        for child in node.value:
            constructor = (
                constructors.get(child.tag)
                if type(child) is yaml.ScalarNode and child.tag in _PLAIN_TAGS
                else None
            )
            if constructor is None:
                values.append(self.construct_object(child, deep=deep))
                continue
            try:
                values.append(constructor(self, child))
            except _UNREADABLE:
                raise _unreadable(child) from None
        return values

    def construct_yaml_bool(self, node: yaml.ScalarNode) -> bool | _Unclear:  # type: ignore[override]
        if node.value.lower() not in ("true", "false"):
            reading = "true" if super().construct_yaml_bool(node) else "false"
            self.unclear = True
            return _Unclear(node, reading, f'write "{node.value}" for the text')
        return bool(node.value.lower() == "true")

    def construct_yaml_int(self, node: yaml.ScalarNode) -> int | _Unclear:  # type: ignore[override]
        if not _YAML_DECIMAL_INT.fullmatch(node.value):
            try:
                reading = str(super().construct_yaml_int(node))
            except ValueError:  # 0780: no YAML 1.1 octal, the number 780 to YAML 1.2
                reading = str(int(node.value, 10))
            self.unclear = True
            return _Unclear(node, reading, f'write "{node.value}" for the text, or {reading}')
        if len(node.value.lstrip("+-")) > TEXT_DIGITS:  # int() refuses it: was a crash
            self.unclear = True
            return _Unclear(node, *_TOO_LONG)
        return int(node.value)

    def construct_yaml_float(self, node: yaml.ScalarNode) -> _Float | _Unclear:  # type: ignore[override]
        if not _YAML_DECIMAL_FLOAT.fullmatch(node.value):
            self.unclear = True
            return _Unclear(node, "a float", "write a plain decimal, or quote it")
        try:
            number = Decimal(node.value)
        except InvalidOperation:  # an exponent of 10**18 or more: no Decimal holds it
            self.unclear = True
            return _Unclear(
                node, "a number out of range", "no decimal holds an exponent of 10^18 or more"
            )
        self.floats = True
        if number_text(number) is None:  # refused in a match only
            self.long_floats = True
            long = _LongFloat(node.value)
            long.line = node.start_mark.line + 1
            return long
        return _Float(node.value)

    def construct_yaml_timestamp(self, node: yaml.ScalarNode) -> str:  # type: ignore[override]
        return str(node.value)

    def construct_yaml_str(self, node: yaml.ScalarNode) -> str:
        """The text, one copy of each while the file is read (``texts``)."""
        text = self.construct_scalar(node)
        return self.texts.setdefault(text, text)


_PLAIN_TAGS: Final = frozenset(
    f"tag:yaml.org,2002:{name}" for name in ("str", "int", "float", "bool", "null", "timestamp")
)
"""The tags whose constructors make a value at once (those of ``!!map``, ``!!seq``, ``!!set``
… are generators, which ``construct_object`` runs: called directly, they made the value a
generator)."""

_UNREADABLE: Final = (ValueError, TypeError, AttributeError, LookupError, OverflowError)
"""What PyYAML's constructors raise for a value its explicit tag cannot read."""


def _unreadable(node: yaml.Node) -> yaml.constructor.ConstructorError:
    """The refusal of a value that ``node``'s tag cannot read, saying where."""
    tag = str(node.tag).replace("tag:yaml.org,2002:", "!!")
    if isinstance(node, yaml.ScalarNode):
        text = str(node.value)
        what = repr(text if len(text) <= 40 else f"{text[:30]}…")
    else:
        what = "a list" if isinstance(node, yaml.SequenceNode) else "a mapping"
    return yaml.constructor.ConstructorError(
        None, None, f"{what} cannot be read as {tag}", node.start_mark
    )


class _Float(str):
    """A plain YAML float, as written; ``_settle_floats`` turns it into plain text."""


class _LongFloat(_Float):
    """A float with more than ``TEXT_DIGITS`` digits written out (``1e5000``): as an id
    or a description it is its text, as before; in a match no event could equal it."""

    line: int


_TOO_LONG: Final = (
    f"a number of more than {TEXT_DIGITS:,} digits",
    "no event can hold one (quote it if it is text)",
)


def _settle_floats(value: Any, in_match: bool = False) -> Any:
    """``value`` with every ``_Float`` as its text: in a rule's ``match``, the text of its
    value (``6011.0`` matches the event number 6011), elsewhere as written (``id: 1.10``
    stays ``1.10``, ``max_amount: 5000.10`` exact)."""
    if isinstance(value, _Float):
        if not in_match:
            return str(value)
        text = number_text(Decimal(value))
        if text is None:
            assert isinstance(value, _LongFloat)
            return _Unclear.of(str(value), value.line, *_TOO_LONG)
        return text
    if isinstance(value, list):
        return [_settle_floats(item, in_match) for item in value]
    if isinstance(value, dict):
        return {
            key: _whole(item)
            if key == "max_count" and isinstance(item, _Float) and not in_match
            else _settle_floats(item, in_match or key == "match")
            for key, item in value.items()
        }
    return value


def _whole(value: _Float) -> int | float:
    """A count written as a float: ``5.0`` is 5, as JSON Schema's integer says; ``5.5``
    a float, which the model refuses as one (text would be refused as text)."""
    number = Decimal(value)
    if number.is_finite() and number.adjusted() < 18 and number == number.to_integral_value():
        return int(number)
    return float(value)


def _refuse_unclear(data: Any) -> None:
    """Raise ``RulesError`` for the first ``_Unclear`` scalar, naming its rule and field."""
    rules = data.get("rules") if isinstance(data, dict) else None
    for index, rule in enumerate(rules if isinstance(rules, list) else []):
        if not isinstance(rule, dict):
            continue
        found = _unclear_in(rule, "")
        if found is not None:
            path, unclear = found
            rule_id = rule.get("id")
            where = f"rule {rule_id!r}" if isinstance(rule_id, str) else f"rules[{index}]"
            raise RulesError(_one_line(f"{where}: {path}: {unclear}"))
    found = _unclear_in(data, "")
    if found is not None:
        raise RulesError(_one_line(f"{found[0] or 'rules file'}: {found[1]}"))


def _unclear_in(value: Any, path: str) -> tuple[str, _Unclear] | None:
    if isinstance(value, _Unclear):
        return path, value
    if isinstance(value, dict):
        for key in value:
            if isinstance(key, _Unclear):
                return path or "rules file", key
        items: Any = ((f"{path}.{k}" if path else str(k), v) for k, v in value.items())
    elif isinstance(value, list):
        items = ((path, v) for v in value)
    else:
        return None
    for sub_path, item in items:
        found = _unclear_in(item, sub_path)
        if found is not None:
            return found
    return None


_YAML_DECIMAL_INT: Final = re.compile(r"[-+]?(?:0|[1-9][0-9]*)", re.ASCII)
_YAML_DECIMAL_FLOAT: Final = re.compile(
    r"[-+]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?", re.ASCII
)
# YAML 1.2 (and JSON) read ``6.011e3`` and ``1e3`` as numbers; YAML 1.1 needs a dot and a
# signed exponent, and PyYAML took them for text: ``match: {mcc: [6.011e3]}`` never matched
# the number 6011, and a rule meant to stop cash withdrawals let every one through. They are
# numbers here too (the exponent is what makes them so: ``0780`` is below).
_RulesLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)[eE][-+]?[0-9]+\Z", re.ASCII),
    list("-+.0123456789"),
)
# A leading zero with an 8 or 9 (``0780``, an MCC; ``08``) is text to YAML 1.1 and the
# number 780 to YAML 1.2 and JSON readers; a YAML 1.2 octal (``0o17``) is text to YAML 1.1
# and 15 to 1.2. Ints here, refused as unclear (``0742``, a YAML 1.1 octal, already is).
_RulesLoader.add_implicit_resolver(
    "tag:yaml.org,2002:int",
    re.compile(r"[-+]?(?:0[0-9]+|0o[0-7]+)\Z", re.ASCII),
    list("-+0"),
)
for _tag, _method in (
    ("bool", _RulesLoader.construct_yaml_bool),
    ("int", _RulesLoader.construct_yaml_int),
    ("float", _RulesLoader.construct_yaml_float),
    ("timestamp", _RulesLoader.construct_yaml_timestamp),
    ("str", _RulesLoader.construct_yaml_str),
):
    _RulesLoader.add_constructor(f"tag:yaml.org,2002:{_tag}", _method)


def _compile(doc: RuleDoc, sets: dict[frozenset[str], frozenset[str]]) -> Rule:
    """``doc`` checked and compiled. Its texts are interned, and equal match lists
    (``sets``, shared by a file's rules) kept once: an issuer's file lists the same MCCs
    in rule after rule, and an event's planning reads one copy of each, in the
    processor's cache, not one per rule (``benchmarks.rules_load``'s 5,000 rules of 200
    MCCs: planning took 16-32% less time, the two measured in turn)."""
    where = f"rule {doc.id!r}"
    if not _RULE_ID.fullmatch(doc.id):
        raise RulesError(f"{where}: id: may hold only letters, digits, '.', '_' and '-'")
    scope = tuple(map(sys.intern, [doc.scope] if isinstance(doc.scope, str) else doc.scope))
    if not scope:
        raise RulesError(f"{where}: scope: must name at least one field")
    for field in scope:
        if not _SCOPE_FIELD.fullmatch(field):
            raise RulesError(f"{where}: scope: {field!r} is not a field name")
    if len(set(scope)) != len(scope):
        raise RulesError(f"{where}: scope: lists a field twice")
    try:
        zones.zone(doc.timezone)
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
    if doc.window is Window.TRANSACTION and doc.max_count is not None:
        # it was taken and never checked: `max_count: 0` read as "no payment at all"
        # while every payment under max_amount was accepted
        raise RulesError(
            f"{where}: max_count: a transaction window counts nothing (each payment is"
            " checked alone against max_amount): remove it, or use another window"
        )
    match: list[tuple[str, frozenset[str]]] = []
    for field, allowed in (doc.match or {}).items():
        values = allowed if isinstance(allowed, list) else [allowed]
        if not values:
            raise RulesError(f"{where}: match: {field}: lists no values")
        # an amount by its value, as events' amounts are taken (amount_text)
        by: Sequence[object] = (
            [_amount_value(where, v) for v in values] if field == "amount" else values
        )
        texts = frozenset(sys.intern(str(scalar_text(v))) for v in by)
        match.append((sys.intern(field), sets.setdefault(texts, texts)))
    return Rule(
        id=doc.id,
        window=doc.window,
        scope=scope,
        timezone=sys.intern(doc.timezone),
        currency=None if doc.currency is None else sys.intern(doc.currency),
        max_count=doc.max_count,
        max_amount=max_amount,
        match=tuple(match),
    )


_JSON_UNSURE: Final = re.compile(
    # what YAML reads otherwise than JSON, or refuses: an escape (YAML refuses a
    # surrogate pair's), a character YAML does not allow or breaks lines at (NEL, LS, PS,
    # a BOM within), and a key's closing quote apart from its colon (YAML wants a key
    # and its colon together, on one line)
    r"[^\t\n\r\x20-\x5b\x5d-\x7e\xa0-\u2027\u202a-\ud7ff\ue000-\ufefe\uff00-\ufffd"
    r"\U00010000-\U0010ffff]"
    r'|"[ \t\r\n]+:'
)
_JSON_KEY_MOST: Final = 250
"""Longest key read as JSON: YAML refuses a key of more than 1,024 characters (bytes, in
UTF-8), so a longer one is read as YAML, which refuses it as before."""


class _NotPlainJson(Exception):
    """The text is not JSON that YAML reads the same: it is read as YAML."""


def _no_float(_: str) -> Any:
    raise _NotPlainJson  # 1.5 is a _Float in YAML, 1e3 the text "1e3"


def _json_object(pairs: list[tuple[str, Any]], texts: dict[str, str]) -> dict[str, Any]:
    mapping = dict(pairs)
    if len(mapping) != len(pairs) or any(len(key) > _JSON_KEY_MOST for key in mapping):
        raise _NotPlainJson  # a key written twice, or too long: YAML refuses it, saying where
    for value in mapping.values():
        if type(value) is list:  # a match list: one copy of each text, as YAML's ``texts``
            keep = texts.setdefault
            value[:] = [keep(item, item) if type(item) is str else item for item in value]
    return mapping


def _plain_json(text: str | bytes) -> dict[str, Any] | None:
    """The rules file read as JSON, when it is a JSON object that YAML reads the same;
    None otherwise, for YAML to read. A generated file of thousands of rules is read in
    a fraction of a second instead of seconds (libyaml makes a node of every value
    before anything is read from them: 6-8 s and 458 MiB at 5,000 rules of 200 MCCs).

    YAML reads JSON as JSON reads it, except where ``_JSON_UNSURE`` finds something,
    for a number with a fraction or an exponent, a key written twice or longer than
    ``_JSON_KEY_MOST``, and a tab outside the top object (YAML's block context refuses
    it): all those are read as YAML, which gives the file's meaning or refusal as
    before. A property test compares both readings."""
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError:
            return None  # YAML also reads UTF-16 and UTF-32
    start, end = len(text) - len(text.lstrip()), len(text.rstrip())
    if not text.startswith("{", start) or not text.endswith("}", 0, end):
        return None
    if "\t" in text[:start] or "\t" in text[end:] or _JSON_UNSURE.search(text):
        return None
    try:
        data = json.loads(
            text,
            object_pairs_hook=functools.partial(_json_object, texts={}),
            parse_float=_no_float,
            parse_constant=_no_float,
        )
    except (_NotPlainJson, ValueError, RecursionError):
        # (an integer past 4,300 digits too, which YAML refuses; and nesting deeper than
        # the recursion limit allows, ~990 levels, below the 1,000 where libyaml stops)
        return None
    return data if isinstance(data, dict) else None


class _StreamingRulesLoader(_RulesLoader):
    """A ``_RulesLoader`` that makes each rule as soon as it is read, for a file without
    an alias (no rule can then share a node with another, nor need the aliases counted).

    libyaml's composer makes the whole file's nodes before any value (a node object and
    two position marks a value, ~450 bytes): `benchmarks.rules_load`'s 5,000 rules of 200
    MCCs peaked at 457 MiB while the rules themselves keep ~70. Here PyYAML's own
    composer, over libyaml's events, makes the nodes of one item of the top ``rules:``
    list at a time, and the item is made at once, its nodes freed before the next: 159
    MiB at the peak (1,000 rules: 50 MiB, not 109; with each text held once, ``texts``,
    94 and 37), in less time (4.3-6.6 s against 5.8-7.5 s, in turn; 4% fewer
    instructions at 1,000 rules). Every value is read by the same constructors, from the
    same events (a property test reads generated files both ways); the rest of the file
    is made as ``get_single_data`` makes it. A file this refuses is read again whole
    (``_read_yaml``), so that it is refused as before."""

    def __init__(self, text: str | bytes) -> None:
        super().__init__(text)
        self.may_alias = False
        self.anchors: dict[Any, yaml.Node] = {}
        self._made: dict[int, list[Any]] = {}
        """The rules already made, by ``id`` of the (empty) node standing for their list."""

    if TYPE_CHECKING:  # (PyYAML's stubs leave these untyped, or may return None)

        def get_event(self) -> Any: ...
        def peek_event(self) -> Any: ...
        def resolve(self, kind: type[yaml.Node], value: Any, implicit: Any) -> str: ...
        def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node: ...

    else:
        # (CParser composes in C methods that Python cannot override: these instead)
        compose_node = yaml.composer.Composer.compose_node
        compose_scalar_node = yaml.composer.Composer.compose_scalar_node
        compose_mapping_node = yaml.composer.Composer.compose_mapping_node

    def compose_sequence_node(self, anchor: Any) -> yaml.SequenceNode:
        """``Composer.compose_sequence_node``, its plain values (an MCC list's) made
        without ``compose_node``'s calls, which do nothing for them (no alias, anchor or
        path resolver): 1,000,000 values made in a third less time."""
        start = self.get_event()
        tag = start.tag
        if tag is None or tag == "!":
            tag = self.resolve(yaml.SequenceNode, None, start.implicit)
        node = yaml.SequenceNode(tag, [], start.start_mark, None, flow_style=start.flow_style)
        if anchor is not None:
            self.anchors[anchor] = node
        items, peek, get, resolve = node.value, self.peek_event, self.get_event, self.resolve
        fast = not self.yaml_path_resolvers
        while True:
            event = peek()
            kind = type(event)
            if kind is yaml.ScalarEvent and event.anchor is None and fast:
                get()
                tag = event.tag
                if tag is None or tag == "!":
                    tag = resolve(yaml.ScalarNode, event.value, event.implicit)
                items.append(
                    yaml.ScalarNode(
                        tag, event.value, event.start_mark, event.end_mark, style=event.style
                    )
                )
            elif kind is yaml.SequenceEndEvent:
                break
            else:
                items.append(self.compose_node(node, len(items)))
        node.end_mark = get().end_mark
        return node

    def construct_sequence(self, node: yaml.SequenceNode, deep: bool = False) -> list[Any]:
        made = self._made.get(id(node))
        return made if made is not None else super().construct_sequence(node, deep)

    def read(self) -> Any:
        """The file's one document, as ``get_single_data`` reads it (None: empty)."""
        self.get_event()  # stream start
        if self.check_event(yaml.StreamEndEvent):
            return None
        self.get_event()  # document start
        if self.check_event(yaml.MappingStartEvent):
            top: yaml.Node = self._top_mapping()
        else:  # refused as no mapping, once read
            top = self.compose_node(None, None)
        self.get_event()  # document end
        if not self.check_event(yaml.StreamEndEvent):
            event = self.get_event()
            raise yaml.composer.ComposerError(
                "expected a single document in the stream",
                top.start_mark,
                "but found another document",
                event.start_mark,
            )
        self.get_event()  # stream end
        return self.construct_document(top)

    def _top_mapping(self) -> yaml.MappingNode:
        """The top mapping's node, ``Composer.compose_mapping_node``'s, but for a plain
        ``rules:`` list: its items made one by one, and an empty node standing for it."""
        start = self.get_event()
        tag = start.tag
        if tag is None or tag == "!":
            tag = self.resolve(yaml.MappingNode, None, start.implicit)
        top = yaml.MappingNode(tag, [], start.start_mark, None, flow_style=start.flow_style)
        if start.anchor is not None:
            self.anchors[start.anchor] = top
        while not self.check_event(yaml.MappingEndEvent):
            key = self.compose_node(top, None)
            value: yaml.Node
            if self._rules_list_follows(key):
                value = self._rules_list()
            else:
                value = self.compose_node(top, key)
            top.value.append((key, value))
        top.end_mark = self.get_event().end_mark
        return top

    def _rules_list_follows(self, key: yaml.Node) -> bool:
        if not (
            type(key) is yaml.ScalarNode
            and key.value == "rules"
            and key.tag == "tag:yaml.org,2002:str"
            and self.check_event(yaml.SequenceStartEvent)
        ):
            return False
        start = self.peek_event()
        return start.tag is None and start.anchor is None

    def _rules_list(self) -> yaml.SequenceNode:
        start = self.get_event()
        tag = self.resolve(yaml.SequenceNode, None, start.implicit)
        node = yaml.SequenceNode(tag, [], start.start_mark, None, flow_style=start.flow_style)
        made: list[Any] = []
        while not self.check_event(yaml.SequenceEndEvent):
            made.append(self.construct_document(self.compose_node(node, len(made))))
        node.end_mark = self.get_event().end_mark
        self._made[id(node)] = made
        return node


_SURROGATE_PAIR: Final = re.compile(
    r"(?<!\\)((?:\\\\)*)\\u(d[89ab][0-9a-f]{2})\\u(d[c-f][0-9a-f]{2})", re.IGNORECASE
)
"""A JSON escape of a character past U+FFFF, as a surrogate pair (``\\ud83d\\ude00``,
as ``json.dumps`` writes every such character), after an even number of backslashes."""


def _json_pairs_for_yaml(text: str | bytes) -> str | bytes:
    """``text`` with each surrogate pair escape written as YAML's one escape of the
    character (``\\U0001f600``), when ``text`` is JSON: YAML refuses an escaped surrogate,
    so a valid JSON rules file with an emoji or a CJK Extension B character in a value was
    refused as "not valid YAML". Other text is returned as it is (in YAML, a backslash
    outside a double-quoted scalar is itself, and the escape is refused as before)."""
    if isinstance(text, bytes):
        try:
            decoded = text.decode("utf-8")
        except UnicodeDecodeError:
            return text
    else:
        decoded = text
    if _SURROGATE_PAIR.search(decoded) is None:
        return text
    try:
        json.loads(decoded.removeprefix("\ufeff"), parse_float=str, parse_constant=str)
    except (ValueError, RecursionError):
        return text  # not JSON: every backslash is not then in a JSON string
    return _SURROGATE_PAIR.sub(_one_escape, decoded)


def _one_escape(found: re.Match[str]) -> str:
    high, low = int(found[2], 16), int(found[3], 16)
    return f"{found[1]}\\U{0x10000 + ((high - 0xD800) << 10) + (low - 0xDC00):08x}"


def _read_yaml(text: str | bytes) -> tuple[Any, _RulesLoader]:
    """The file read as YAML, and the loader that read it (its flags)."""
    text = _json_pairs_for_yaml(text)
    may_alias = ("*" if isinstance(text, str) else b"*") in text  # type: ignore[operator]
    try:
        if not may_alias:
            streaming = _StreamingRulesLoader(text)
            try:
                return streaming.read(), streaming
            except (yaml.YAMLError, RecursionError):
                # Refused, or nested deeper than PyYAML's composer goes: read whole, for
                # the refusal reading whole gives (of two mistakes, the one it tells: it
                # makes values level by level, where this makes each rule whole)
                pass
            finally:
                streaming.dispose()
        loader = _RulesLoader(text)  # yaml.load's steps
        loader.may_alias = may_alias
        try:
            return loader.get_single_data(), loader
        finally:
            loader.dispose()
    except RecursionError:  # (counting what aliases repeat in a file nested ~1,000 deep)
        raise RulesError("rules file: nested too deeply to be read") from None
    except yaml.constructor.ConstructorError as exc:  # valid YAML, refused by _RulesLoader
        raise RulesError(f"rules file: {_yaml_problem(exc)}") from None
    except yaml.YAMLError as exc:
        raise RulesError(f"not valid YAML: {_yaml_problem(exc)}") from None


def parse_rules(text: str | bytes) -> RuleSet:
    """Validate a rules file (YAML or JSON) and compile it."""
    data: Any = _plain_json(text)
    loader = None
    if data is None:
        data, loader = _read_yaml(text)
    if data is None:
        raise RulesError("rules file is empty: it needs a 'rules:' list (see examples/rules.yaml)")
    if not isinstance(data, dict):
        raise RulesError(
            f"rules file holds a {_kind(data)}, not a mapping: it needs a 'rules:' list"
            " (see examples/rules.yaml)"
        )
    if loader is not None:  # (JSON read as such holds no float, nor anything unclear)
        if loader.floats:
            data = _settle_floats(data)  # (leaves an _Unclear as it is)
        if loader.unclear or loader.long_floats:
            _refuse_unclear(data)
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
    # What the rules keep is made anew, after all that was made from the YAML is freed.
    # A file's values are made between its YAML nodes (a node object and two position
    # marks each), so keeping them would keep a little of every page of the heap the
    # nodes took, resident for good: `benchmarks.rules_load`'s 5,000 rules of 200 MCCs
    # kept 458 MiB where the rules need ~70. So the checked rules are copied to JSON
    # (exact for every value a rule may hold: big integers too), the rest freed, and
    # the copy read back rule by rule, each rule's values freed before the next: 93
    # MiB. Read back whole, those values would stay among the kept in turn: 138 MiB.
    blob = msgspec.json.encode(doc.rules)
    del doc, data
    each = msgspec.json.decode(blob, type=list[msgspec.Raw])
    raw = text.encode() if isinstance(text, str) else text
    sets: dict[frozenset[str], frozenset[str]] = {}
    return RuleSet(
        rules=tuple(_compile(msgspec.json.decode(rule, type=RuleDoc), sets) for rule in each),
        version=hashlib.sha256(raw).hexdigest()[:12],
    )


def _kind(data: object) -> str:
    """What a YAML document's top level is, in YAML's words."""
    if isinstance(data, list):
        return "list"
    if isinstance(data, str):
        return "string"
    return "single value"


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """A YAML error on one line (the CLI's reason is one line): what and where."""
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem_mark is not None:
        mark = exc.problem_mark
        what = ", ".join(part for part in (exc.context, exc.problem) if part)
        return f"{what} (line {mark.line + 1}, column {mark.column + 1})"
    return " ".join(str(exc).split())


_LINE_BREAKING: Final = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def _one_line(message: str) -> str:
    """``message`` on one line, as the CLI's reason is: each control character, line
    breaks included, written as its escape (a key written over two lines, ``"a\\nb"``)."""
    return _LINE_BREAKING.sub(lambda found: repr(found[0])[1:-1], message)


def _describe(data: Any, exc: msgspec.ValidationError) -> str:
    """Prefix a validation error with the id of the rule it is about, when there is one."""
    message = _one_line(str(exc))  # (it names a field as written: a key may span lines)
    if message.startswith("Invalid enum value") and message.endswith(".window`"):
        message += f" (one of: {', '.join(window.value for window in Window)})"
    found = re.search(r"\$\.rules\[(\d+)\]", message)
    if found and isinstance(data, dict) and isinstance(data.get("rules"), list):
        index = int(found.group(1))
        rule = data["rules"][index] if index < len(data["rules"]) else None
        if isinstance(rule, dict) and f"$.rules[{index}].match[...]" in message:
            message = _match_field_named(message, index, rule.get("match"))
        if isinstance(rule, dict) and "id" in rule:
            return f"rule {rule['id']!r} (rules[{index}]): {message}"
        return f"rules[{index}]: {message}"
    return message


def _match_field_named(message: str, index: int, match: object) -> str:
    """``message`` naming the ``match`` field whose values it refuses, where msgspec
    writes ``[...]`` for every key: ``match[...][1]`` told no one which of a rule's match
    fields held the ``null``."""
    if not isinstance(match, dict):
        return message
    for field, allowed in match.items():
        values = allowed if isinstance(allowed, list) else [allowed]
        if not all(type(v) in (str, int, bool) for v in values):
            key = _one_line(json.dumps(str(field), ensure_ascii=False))
            named = f"$.rules[{index}].match[{key}]"
            return message.replace(f"$.rules[{index}].match[...]", named, 1)
    return message


COUNTER_FIELDS: Final = ("timezone", "currency", "scope")
"""What a rule's counters of one window hold, besides the rule's id: changing any of these
under one id would carry on from counters kept under the old meaning (another zone's
periods, another currency's amounts, another field's values). The limits and ``match``
may change; so may the window, whose periods are named apart from any other window's
(``2026-03-14``, ``2026-W11``, ``2026-03``): a window new to an id starts from zero."""


class RuleChanged(RulesError):
    """A rule's counters on the store were kept under another meaning (``counter_meaning``)."""


def counter_meaning(rule: Rule) -> tuple[str, str] | None:
    """What ``rule``'s counters hold, as a store keeps it: ``(key, meaning)``, the key
    ``<rule id>:<window>`` and the meaning compact JSON of ``COUNTER_FIELDS``; None for a
    ``transaction`` rule, which keeps no counters. (A rule id holds no ``:``.)"""
    if rule.window is Window.TRANSACTION:
        return None
    zone = None if rule.window is Window.LIFETIME else rule.timezone  # one period in any zone
    meaning = {"timezone": zone, "currency": rule.currency, "scope": list(rule.scope)}
    return f"{rule.id}:{rule.window.value}", msgspec.json.encode(meaning).decode()


def check_kept_meanings(rules: RuleSet, kept: dict[str, str]) -> None:
    """Refuse (``RuleChanged``, naming every such rule) the rules whose counters a store
    keeps under another meaning than theirs: ``kept`` maps the keys of ``counter_meaning``
    to meanings as the store has them. A kept meaning that is not one ``counter_meaning``
    writes is a ``ValueError`` naming its key."""
    problems = []
    for rule in rules.rules:
        counter = counter_meaning(rule)
        if counter is None or kept.get(counter[0], counter[1]) == counter[1]:
            continue
        key, meaning = counter
        try:
            before = msgspec.json.decode(kept[key])
        except msgspec.DecodeError as exc:
            raise ValueError(f"the meaning kept for {key!r} is not JSON ({exc})") from None
        if not _is_meaning(before):
            raise ValueError(f"the meaning kept for {key!r} is not one limitflow writes")
        now = msgspec.json.decode(meaning)
        changed = [
            f"{name} {_shown(before.get(name))} (now {_shown(now[name])})"
            for name in COUNTER_FIELDS
            if before.get(name) != now[name] and not _one_zone(name, before[name], now[name])
        ]
        if changed:  # else the same meaning, written another way
            problems.append(
                f"rule {rule.id!r}: the store keeps its {rule.window.value} counters for"
                f" {', '.join(changed)}"
            )
    if problems:
        raise RuleChanged(
            f"{'; '.join(problems)}. A rule's id names its counters: give a changed rule a"
            " new id, or change it back"
        )


def _one_zone(name: str, before: object, now: object) -> bool:
    """Whether a kept zone and a rule's are one zone by two names (``PRC`` and
    ``Asia/Shanghai``): its counters hold the same periods."""
    return (
        name == "timezone"
        and isinstance(before, str)
        and isinstance(now, str)
        and zones.same_zone(before, now)
    )


def _is_meaning(value: object) -> bool:
    """Whether ``value`` is a decoded ``counter_meaning``: its fields and their types."""
    if not isinstance(value, dict) or set(value) != set(COUNTER_FIELDS):
        return False
    zone, currency, scope = (value[name] for name in COUNTER_FIELDS)
    return (
        isinstance(zone, str | None)
        and isinstance(currency, str | None)
        and isinstance(scope, list)
        and bool(scope)
        and all(isinstance(field, str) for field in scope)
    )


def _shown(value: object) -> str:
    if value is None:
        return "none"
    if isinstance(value, list):
        return "[" + ", ".join(map(str, value)) + "]"
    return str(value)


def load_rules(path: str) -> RuleSet:
    """Read and validate a rules file; unreadable files are a ``RulesError`` too."""
    try:
        with open(path, "rb") as handle:
            text = handle.read()
    except OSError as exc:
        raise RulesError(f"cannot read rules file {path}: {exc.strerror}") from None
    try:
        return parse_rules(text)
    except RulesError as exc:
        raise RulesError(f"{path}: {exc}") from None
