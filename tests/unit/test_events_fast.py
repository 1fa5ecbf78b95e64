"""The common-event fast path of event parsing agrees with the general path.

``schemas.events._common_event`` takes the usual valid event in fewer steps and returns
None for anything else, which ``_checked_event`` then decides. Every field of an Event it
makes (its type too: ``1`` equals ``True``) and every fingerprint must be the general
path's, or resends stored before would turn into conflicts. Hypothesis feeds both the same
objects, built mostly from the valid shape with one field or another made unusual.

Its compiled twin (``schemas._fastparse``, which ``event_from_dict`` uses when built) is
held to the Python ``_common_event`` the same way, on the same objects.
"""

from __future__ import annotations

import json
import re
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from benchmarks.generate import events
from schemas import events as parsing
from schemas.events import (
    Event,
    EventRejected,
    _checked_event,
    _common_event,
    _decoder,
    event_from_dict,
    parse_event,
)
from tests.unit.built import assert_built_after, private


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


_compiled = None if private(parsing, "_fastparse") is None else parsing._fast_event
"""The compiled ``_common_event``, when the extension is built."""
needs_compiled = pytest.mark.skipif(
    _compiled is None,
    reason="schemas._fastparse is not built (no C compiler?): pip install -e . builds it",
)
_NOT_SURE_OFFSET = re.compile(r".*[+-][0-9]{2}:[6-9][0-9]")
"""An offset of 60 minutes or more, which Python 3.11 takes (+08:60 as +09:00) and the
compiled path leaves to the general one, not sure that every Python does the same."""


def _assert_compiled_agrees(doc: dict[str, Any]) -> None:
    """The compiled twin returns the Python ``_common_event``'s Event, field for field
    (types and fingerprints too), and None where it does; None where it is not sure."""
    assert _compiled is not None
    python = _common_event(doc)
    compiled = _compiled(doc)
    if compiled is None:
        if python is not None:  # it may decline only what it documents
            time = doc.get("occurred_at")
            assert isinstance(time, str) and _NOT_SURE_OFFSET.fullmatch(time), doc
    else:
        assert python is not None, doc
        assert _fields(compiled) == _fields(python)
        assert compiled.fields is doc


def _assert_paths_agree(doc: dict[str, Any]) -> None:
    fast = _common_event(doc)
    general = _outcome(_checked_event, doc)
    if fast is not None:
        assert general == ("event", _fields(fast))
    assert _outcome(event_from_dict, doc) == general


_ID: st.SearchStrategy[Any] = st.one_of(
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


def _examples(test: Any) -> Any:
    """The objects that once told the paths apart, or nearly."""
    for doc in [
        {"event_id": "e", "account_id": "a", "amount": "1", "currency": "JPY",
         "occurred_at": "2026-01-31T23:59:00." + "1" * 44 + "Z"},
        {"event_id": "e", "account_id": "a", "amount": "10.", "currency": "CNY",
         "occurred_at": "2026-01-31T23:59:00Z"},
        {"event_id": "e", "account_id": "a", "amount": "1", "currency": "CNY",
         "occurred_at": "2026-01-31T23:59:00Z", "mcc": 10**18},
        {"event_id": "e", "type": "reversal", "account_id": "a", "original_event_id": "p",
         "occurred_at": "2026-01-31T23:59:00Z", "currency": "USD"},
    ]:  # fmt: skip
        test = example(doc)(test)
    return test


@settings(max_examples=3_000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_event_docs())
@_examples
def test_the_fast_path_agrees_with_every_check(doc: dict[str, Any]) -> None:
    _assert_paths_agree(doc)


@needs_compiled
@settings(max_examples=3_000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_event_docs())
@_examples
def test_the_compiled_fast_path_agrees_with_the_python_one(doc: dict[str, Any]) -> None:
    _assert_compiled_agrees(doc)


_VALID_TIME = st.builds(
    lambda year, month, day, sep, hour, minute, second, fraction, offset: (
        f"{year:04d}-{month:02d}-{day:02d}{sep}{hour:02d}:{minute:02d}:{second:02d}"
        f"{fraction}{offset}"
    ),
    st.one_of(
        st.integers(1, 9999), st.sampled_from([1, 2, 100, 1900, 1970, 2000, 2024, 9998, 9999])
    ),
    st.integers(1, 12),
    st.one_of(st.integers(1, 28), st.integers(28, 31)),
    st.sampled_from(["T", "t", " "]),
    st.integers(0, 23),
    st.integers(0, 59),
    st.integers(0, 59),
    st.one_of(st.just(""), st.text("0123456789", min_size=1, max_size=12).map(lambda d: "." + d)),
    st.one_of(
        st.sampled_from(["Z", "+00:00", "-00:00", "+23:59", "-23:59", "+24:00", "+08:60"]),
        st.builds(
            lambda sign, hours, minutes: f"{sign}{hours:02d}:{minutes:02d}",
            st.sampled_from("+-"),
            st.integers(0, 25),
            st.integers(0, 59),
        ),
    ),
)
"""Times near the valid: every date of every year (leap days, month ends), fractions of
any length, offsets up to and past a day."""


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


@needs_compiled
@settings(max_examples=2_000, deadline=None)
@given(time=st.one_of(_VALID_TIME, _TIME), kind=st.sampled_from(["payment", "reversal"]))
@example(time="1900-02-29T00:00:00Z", kind="payment")  # not leap years: no 29 February
@example(time="2100-02-29T12:00:00+08:00", kind="payment")
@example(time="0100-02-29T00:00:00Z", kind="payment")
@example(time="2000-02-29T23:59:59.999999-23:59", kind="payment")  # a leap year
@example(time="2024-02-29T00:00:00Z", kind="reversal")
@example(time="1969-12-31T23:59:59.9999999Z", kind="payment")  # floor of a negative epoch
@example(time="0001-01-02T00:00:00+00:01", kind="payment")  # just before the first instant
def test_the_compiled_path_reads_times_alike(time: Any, kind: str) -> None:
    doc: dict[str, Any] = {"event_id": "e", "account_id": "a", "occurred_at": time}
    if kind == "reversal":
        doc.update(type="reversal", original_event_id="p")
    else:
        doc.update(amount="10.50", currency="CNY")
    _assert_compiled_agrees(doc)
    _assert_paths_agree(doc)


_PLAIN_AMOUNT = st.from_regex(r"0{0,3}[0-9]{1,17}(\.[0-9]{1,6}0{0,3})?", fullmatch=True)
"""Amounts of the form the fast paths take, mostly: up to and past MAX_MINOR, with more
fraction digits than a currency's minor unit or trailing zeros."""


@needs_compiled
@settings(max_examples=2_000, deadline=None)
@given(
    amount=st.one_of(_PLAIN_AMOUNT, _AMOUNT),
    currency=st.one_of(st.sampled_from(["CNY", "JPY", "KWD", "CLF"]), _CURRENCY),
    kind=st.sampled_from(["payment", "reversal"]),
)
@example(amount="999999999999999", currency="JPY", kind="payment")  # MAX_MINOR
@example(amount="1000000000000000", currency="JPY", kind="payment")
@example(amount="99999999999.9999", currency="CLF", kind="payment")
@example(amount="0.001", currency="KWD", kind="reversal")
@example(amount="0000000000000000000000000000001.5", currency="CNY", kind="payment")
def test_the_compiled_path_reads_amounts_alike(amount: Any, currency: Any, kind: str) -> None:
    doc: dict[str, Any] = {
        "event_id": "e",
        "account_id": "a",
        "occurred_at": "2026-03-01T00:00:00Z",
        "amount": amount,
        "currency": currency,
    }
    if kind == "reversal":
        doc.update(type="reversal", original_event_id="p")
    _assert_compiled_agrees(doc)
    _assert_paths_agree(doc)


@needs_compiled
def test_every_generated_benchmark_event_takes_the_compiled_path() -> None:
    assert _compiled is not None
    for line in events(5_000, seed=7):
        doc = _decoder.decode(line)
        compiled = _compiled(doc)
        assert compiled is not None
        python = _common_event(doc)
        assert python is not None
        assert _fields(compiled) == _fields(python)


@needs_compiled
def test_event_from_dict_uses_the_compiled_path() -> None:
    assert private(parsing, "_fastparse") is not None
    assert isinstance(
        getattr(parsing._fast_event, "__self__", None), private(parsing, "_fastparse").CommonEvent
    )


class _Doc(dict[str, Any]):
    pass


@needs_compiled
@pytest.mark.parametrize(
    "doc",
    [
        _Doc(event_id="e", account_id="a", amount="1", currency="CNY",
             occurred_at="2026-01-31T23:59:00Z"),
        {"event_id": "e", "account_id": "a", "amount": "1", "currency": "CNY",
         "occurred_at": "2026-01-31T23:59:00Z", 5: "x"},
        {"event_id": "e", "account_id": "a", "amount": "1", "currency": "CNY",
         "occurred_at": "2026-01-31T23:59:00+08:60"},
        {"event_id": "e", "account_id": "a", "amount": "1", "currency": "CNY",
         "occurred_at": "2026-01-31T24:00:00Z"},
    ],
)  # fmt: skip
def test_what_the_compiled_path_is_not_sure_of_goes_to_the_general_path(
    doc: dict[str, Any],
) -> None:
    assert _compiled is not None
    assert _compiled(doc) is None

    def outcome(parse: Any) -> Any:  # a key that is not a str: msgspec's TypeError
        try:
            return _outcome(parse, doc)
        except TypeError as exc:
            return ("raised", str(exc))

    assert outcome(event_from_dict) == outcome(_checked_event)


@needs_compiled
def test_importing_the_extension_first_works() -> None:
    """``schemas.events`` imports ``schemas._fastparse`` last: either may come first."""
    import subprocess
    import sys

    code = (
        "import schemas._fastparse, schemas.events as e; "
        "assert e._fast_event is not e._common_event"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


@needs_compiled
def test_the_built_extension_is_not_older_than_its_source() -> None:
    """An edit to ``_fastparse.pyx`` takes effect only once built again."""
    assert_built_after(private(parsing, "_fastparse"), "schemas/_fastparse.pyx")


_DEEP_EXTRA: bytes = (
    b'{"event_id": "e", "account_id": "a", "extra": {"deep": ['
    + b"[" * 40
    + b"]" * 40
    + b']}, "amount": "1", "currency": "CNY", "occurred_at": "2026-01-31T23:59:00Z"}'
)


@needs_compiled
@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"   ",
        b"not json",
        b"\xff\xfe",
        b"[1, 2]",
        b'"text"',
        b"[" * 5_000 + b"]" * 5_000,
        b'{"event_id": "e", "account_id": "a", "amount": 10.5, "currency": "CNY",'
        b' "occurred_at": "2026-01-31T23:59:00Z"}',
        _DEEP_EXTRA,
        *events(50, seed=9),
    ],
)
def test_parse_event_says_the_same_with_and_without_the_compiled_parse(
    raw: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Bytes go through ``CommonEvent.parse`` first; what it declines, the Python steps
    take, with the same event or the same rejection as without it."""
    assert parsing._fast_parse is not None
    compiled = _outcome(parse_event, raw)
    monkeypatch.setattr(parsing, "_fast_parse", None)
    assert compiled == _outcome(parse_event, raw)


@pytest.mark.parametrize(
    ("amount", "currency", "text"),
    [
        ("100.00", "CNY", "100"),
        ("100.0", "CNY", "100"),
        ("0100", "CNY", "100"),
        ("00.50", "CNY", "0.5"),
        ("0.05", "CNY", "0.05"),
        ("12.50", "USD", "12.5"),
        ("100.000", "JPY", "100"),
        ("1.230", "KWD", "1.23"),
        ("100", "CNY", "100"),
        ("12.5", "CNY", "12.5"),
        (" 7.10 ", "CNY", "7.1"),  # blanks JSON allows: the general path
        ("1e2", "CNY", "100"),
    ],
)
def test_every_path_gives_an_amount_string_the_text_of_its_value(
    amount: str, currency: str, text: str
) -> None:
    # rules scope and match by it: "100.00" and "100.0" were two amounts to a rule
    # scoped by amount, where the JSON numbers 100.00 and 100.0 were one
    doc = {
        "event_id": "e",
        "account_id": "a",
        "amount": amount,
        "currency": currency,
        "occurred_at": "2026-03-01T00:00:00Z",
    }
    parses: list[Any] = [_checked_event, event_from_dict, _common_event]
    if _compiled is not None:
        parses.append(_compiled)
    for parse in parses:
        event = parse(dict(doc))
        if event is not None:  # the fast paths leave what is not plain to the general one
            assert event.fields["amount"] == text, parse
    assert _outcome(_checked_event, dict(doc))[0] == "event"
