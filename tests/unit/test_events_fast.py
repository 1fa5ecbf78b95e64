"""The common-event fast path of event parsing agrees with the general path.

``schemas.events._common_event`` takes the usual valid event in fewer steps and returns
None for anything else, which ``_checked_event`` then decides. Every field of an Event it
makes (its type too: ``1`` equals ``True``) and every fingerprint must be the general
path's, or resends stored before would turn into conflicts. Hypothesis feeds both the same
objects, built mostly from the valid shape with one field or another made unusual.
"""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from benchmarks.generate import events
from schemas.events import (
    Event,
    EventRejected,
    _checked_event,
    _common_event,
    _decoder,
    event_from_dict,
    parse_event,
)


def _fields(event: Event) -> list[tuple[str, str, str]]:
    """Every field of ``event`` with its type's name and repr, for an exact comparison."""
    return [
        (name, type(getattr(event, name)).__name__, repr(getattr(event, name)))
        for name in event.__struct_fields__
    ]


def _outcome(parse: Any, value: Any) -> tuple[str, Any]:
    try:
        return ("event", _fields(parse(value)))
    except EventRejected as exc:
        return ("rejected", (exc.error, exc.detail, exc.args))


def _assert_paths_agree(doc: dict[str, Any]) -> None:
    fast = _common_event(doc)
    general = _outcome(_checked_event, doc)
    if fast is not None:
        assert general == ("event", _fields(fast))
    assert _outcome(event_from_dict, doc) == general


_ID = st.one_of(
    st.sampled_from(["e", "x" * 128, "x" * 129, "", "账户-1", "a|b", 5, True, None, ["a"], {}]),
    st.text(max_size=130),
)
_DIGITS = st.text("0123456789", max_size=3)
_TIME = st.one_of(
    st.builds(
        lambda year, month, day, sep, hour, minute, second, fraction, offset: (
            f"{year:04d}-{month:02d}-{day:02d}{sep}{hour:02d}:{minute:02d}:{second:02d}"
            f"{fraction}{offset}"
        ),
        st.sampled_from([1, 2, 1969, 1970, 2016, 2017, 2024, 2026, 9999]),
        st.integers(0, 13),
        st.integers(0, 32),
        st.sampled_from(["T", "t", " ", "X", "TT"]),
        st.integers(0, 25),
        st.integers(0, 61),
        st.integers(0, 61),
        st.one_of(st.just(""), st.just("."), _DIGITS.map(lambda d: "." + d)),
        st.sampled_from(
            [
                *("Z", "z", "", "+08:00", "-05:30", "-00:00", "+14:00", "-12:00", "+24:00"),
                *("+23:59", "+0800", "+08", "+08:60", "Z ", "ZZ", "+08:00:00"),
            ]
        ),
    ),
    st.sampled_from(
        [
            "2016-12-31T23:59:60Z",
            "2016-12-31T23:59:60.5+00:00",
            "2017-01-01T07:59:60+08:00",
            "0001-01-01T00:00:00Z",
            "0001-01-02T00:00:00Z",
            "9999-12-30T23:59:59Z",
            "9999-12-30T23:59:59-12:00",
            "2026-01-31T23:59:00." + "1" * 43 + "Z",  # 64 characters
            "2026-01-31T23:59:00." + "1" * 44 + "Z",  # 65: fromisoformat would take it
            "2026-01-31T23:59:00." + "0" * 38 + "+08:00",
            "\uff12\uff10\uff12\uff16-01-31T23:59:00Z",
            "2026-01-31T23:59:0\uff15Z",
            "2026-W05-6T23:59:00Z",
            "",
        ]
    ),
    st.integers(),
    st.none(),
    st.text(max_size=30),
)
_AMOUNT = st.one_of(
    st.from_regex(
        r"[ \n]?[+-]?[0-9]{0,32}(\.[0-9]{0,32})?([eE][+-]?[0-9]{1,3})?[ \n]?", fullmatch=True
    ),
    st.sampled_from(
        [
            *("10", "10.", ".5", "0", "0.00", "1.2.3", "\u0661\u0662", "\u00b2", "1_000", "NaN"),
            *("inf", "9999999999999.99", "10000000000000.00", "1" * 30, "1" * 31, "1." + "0" * 31),
        ]
    ),
    st.decimals(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-(10**20), max_value=10**20),
    st.sampled_from([True, False, None, [1], {}]),
    st.text(max_size=8),
)
_CURRENCY = st.sampled_from(
    ["CNY", "JPY", "KWD", "CLF", "USD", "cny", "XYZ", "", None, 156, ["CNY"]]
)
_TYPE = st.sampled_from(["payment", "reversal", None, "PAYMENT", "", 1, True, ["payment"]])
_SCALAR = st.one_of(
    st.text(max_size=10),
    st.booleans(),
    st.none(),
    st.integers(),
    st.sampled_from([10**18 - 1, 10**18, -(10**18) + 1, -(10**18), 0, 6011]),
    st.decimals(allow_nan=False, allow_infinity=False),
    st.sampled_from([Decimal("6011.0"), Decimal("0.50"), Decimal("-0"), Decimal("1E+2")]),
)
_EXTRA = st.recursive(
    _SCALAR,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=8,
)
_CORE = ["event_id", "account_id", "type", "amount", "currency", "occurred_at"]
_MISSING = object()


@st.composite
def _event_docs(draw: st.DrawFn) -> dict[str, Any]:
    """A valid event, mostly, with some of its fields replaced, left out or added."""
    kind = draw(st.sampled_from(["payment", "reversal"]))
    doc: dict[str, Any] = {
        "event_id": "evt-1",
        "account_id": "acct-1",
        "amount": "10.50",
        "currency": "CNY",
        "occurred_at": "2026-03-01T00:00:00.042000Z",
    }
    if kind == "reversal":
        doc = {
            "event_id": "rev-1",
            "type": "reversal",
            "account_id": "acct-1",
            "original_event_id": "evt-1",
            "occurred_at": "2026-03-01T00:00:01Z",
        }
    changes = {
        "event_id": _ID,
        "account_id": _ID,
        "original_event_id": _ID,
        "type": _TYPE,
        "amount": _AMOUNT,
        "currency": _CURRENCY,
        "occurred_at": _TIME,
    }
    for name in draw(st.lists(st.sampled_from(sorted(changes)), max_size=3, unique=True)):
        value = draw(st.one_of(changes[name], st.just(_MISSING)))
        if value is _MISSING:
            doc.pop(name, None)
        else:
            doc[name] = value
    extras = draw(st.dictionaries(st.text(max_size=8), _EXTRA, max_size=4))
    for name, value in extras.items():
        if name not in _CORE or draw(st.booleans()):
            doc[name] = value
    if draw(st.booleans()):  # key order must not matter either
        doc = dict(reversed(doc.items()))
    return doc


@settings(max_examples=3_000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_event_docs())
@example({"event_id": "e", "account_id": "a", "amount": "1", "currency": "JPY",
          "occurred_at": "2026-01-31T23:59:00." + "1" * 44 + "Z"})  # fmt: skip
@example({"event_id": "e", "account_id": "a", "amount": "10.", "currency": "CNY",
          "occurred_at": "2026-01-31T23:59:00Z"})  # fmt: skip
@example({"event_id": "e", "account_id": "a", "amount": "1", "currency": "CNY",
          "occurred_at": "2026-01-31T23:59:00Z", "mcc": 10**18})  # fmt: skip
@example({"event_id": "e", "type": "reversal", "account_id": "a", "original_event_id": "p",
          "occurred_at": "2026-01-31T23:59:00Z", "currency": "USD"})  # fmt: skip
def test_the_fast_path_agrees_with_every_check(doc: dict[str, Any]) -> None:
    _assert_paths_agree(doc)


@settings(max_examples=500, deadline=None)
@given(_event_docs())
def test_parse_event_agrees_with_the_general_path_on_the_wire(doc: dict[str, Any]) -> None:
    # as text: Decimal and huge integers written as JSON numbers, decoded as the wire is
    text = json.dumps(doc, default=str, ensure_ascii=False)
    try:
        decoded = _decoder.decode(text)
    except Exception:
        return
    if isinstance(decoded, dict):
        assert _outcome(parse_event, text) == _outcome(_checked_event, decoded)
        assert _outcome(parse_event, text.encode()) == _outcome(_checked_event, decoded)


@pytest.mark.parametrize(
    "raw",
    [
        # the forms the fast path takes
        '{"event_id": "e", "account_id": "a", "amount": "10.5", "currency": "CNY",'
        ' "occurred_at": "2026-01-31T23:59:00+08:00", "mcc": 6011, "vip": true, "x": null}',
        '{"event_id": "e", "type": "reversal", "account_id": "a", "original_event_id": "p",'
        ' "occurred_at": "2026-01-31t23:59:00.5Z"}',
        '{"event_id": "e", "type": "payment", "account_id": "a", "amount": "0001.000",'
        ' "currency": "KWD", "occurred_at": "2026-01-31 23:59:00.1234567-05:30",'
        ' "original_event_id": "p0"}',
    ],
)
def test_the_usual_events_take_the_fast_path(raw: str) -> None:
    doc = _decoder.decode(raw)
    fast = _common_event(doc)
    assert fast is not None
    assert _fields(fast) == _fields(_checked_event(doc))


def test_every_generated_benchmark_event_takes_the_fast_path() -> None:
    # else the fast path would be dead code that the benchmark figures say nothing about
    for line in events(2_000, seed=5):
        doc = _decoder.decode(line)
        fast = _common_event(doc)
        assert fast is not None
        assert _fields(fast) == _fields(_checked_event(doc))
