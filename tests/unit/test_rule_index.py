"""Large rule sets find an event's rules by its match values (``RuleIndex``): the
rules that apply, their order and every decision are those of testing each in turn."""

from __future__ import annotations

import json
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from handlers import decide
from handlers.decide import Decider
from handlers.state import Snapshot, WorkingState
from schemas.events import parse_event
from schemas.rules import parse_rules
from tests.unit.test_fastcore import _SCALAR, both, outcomes


def _mcc_rules(count: int, **more: Any) -> str:
    """``count`` rules, the n-th matching MCC n (and ``more``, for each)."""
    rules = [
        {"id": f"mcc-{n}", "window": "day", "max_count": 1, "match": {"mcc": [str(n)]}, **more}
        for n in range(count)
    ]
    return json.dumps({"rules": rules})


def _pay(event_id: str, **fields: Any) -> str:
    doc = {
        "event_id": event_id,
        "account_id": "a1",
        "amount": "1",
        "currency": "CNY",
        "occurred_at": "2026-03-14T10:00:00Z",
        **fields,
    }
    return json.dumps(doc, default=str)


@pytest.fixture
def indexed_from_8(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(decide, "INDEX_FROM", 8)
    yield


@pytest.fixture
def built(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many rules each index the deciders build holds, in the order built."""
    sizes: list[int] = []

    class Counted(decide.RuleIndex):
        __slots__ = ()

        def __init__(self, rules: Any) -> None:
            sizes.append(len(rules))
            super().__init__(rules)

    monkeypatch.setattr(decide, "RuleIndex", Counted)
    return sizes


def test_an_event_is_planned_against_the_rules_filed_under_its_values_only(
    built: list[int],
) -> None:
    """Both paths find the rule of the event's MCC through the index (which each asks for
    once per currency), not by testing the other 199."""
    rules = parse_rules(_mcc_rules(200))
    for decider in both(rules):
        for n in (7, 150, 7):
            plan = decider.plan(parse_event(_pay(f"e{n}", mcc=str(n))))
            assert [a.rule.rule.id for a in plan] == [f"mcc-{n}"]
        assert decider.plan(parse_event(_pay("none", mcc="9999"))) == ()
    assert built == [200, 200]


def test_the_index_is_built_with_the_decider_not_by_the_first_event(built: list[int]) -> None:
    """The first event of a large rule set does not wait for the index (0.45 s at 5,000
    rules of 200 MCCs): `run` reports ready once its decider exists."""
    only_usd = json.loads(_mcc_rules(10, currency="USD"))["rules"]
    few = {"id": "few", "window": "day", "max_count": 1, "match": {"mcc": ["1"]}}
    for text, expected in (
        (_mcc_rules(200), [200, 200]),
        (json.dumps({"rules": only_usd}), [10, 10]),  # of one currency only
        (json.dumps({"rules": [few]}), []),  # too few to index
    ):
        built.clear()
        both(parse_rules(text))
        assert built == expected


def test_one_index_serves_every_currency(built: list[int]) -> None:
    """Rules of no currency apply to events of every one, and each currency may have
    rules of its own (a cap, a limit by MCC): one index of them all, not one per
    currency seen (~8 MiB each at 5,000 rules of 200 MCCs)."""
    currencies = ("CNY", "USD", "EUR", "JPY", "GBP")
    rules = json.loads(_mcc_rules(30))["rules"]
    for currency in currencies:
        amount = "1000" if currency == "JPY" else "1000.00"
        cap = {"id": f"cap-{currency}", "window": "transaction", "max_amount": amount}
        rules.append({**cap, "currency": currency})
    only_jpy = {"id": "jpy-3", "window": "day", "max_count": 1, "match": {"mcc": ["3"]}}
    rules.append({**only_jpy, "currency": "JPY"})
    for decider in both(parse_rules(json.dumps({"rules": rules}))):
        for currency in currencies:
            amount = "1" if currency == "JPY" else "1.00"
            line = _pay("e", mcc="3", currency=currency, amount=amount)
            planned = [a.rule.rule.id for a in decider.plan(parse_event(line))]
            jpy = ["jpy-3"] if currency == "JPY" else []
            assert planned == ["mcc-3", f"cap-{currency}", *jpy]
            line = _pay("e", mcc="4", currency=currency, amount=amount)
            planned = [a.rule.rule.id for a in decider.plan(parse_event(line))]
            assert planned == ["mcc-4", f"cap-{currency}"]
    assert built == [36, 36]


def test_a_number_finds_the_rule_that_lists_its_value(indexed_from_8: None) -> None:
    rules = parse_rules(_mcc_rules(20))
    for decider in both(rules):
        for value in ("6", "6.0", "6.00", "6e0", '"6"'):  # as the JSON has it
            line = _pay("e", mcc="?").replace('"?"', value)
            plan = decider.plan(parse_event(line))
            assert [a.rule.rule.id for a in plan] == ["mcc-6"], value
        assert decider.plan(parse_event(_pay("e", mcc="06"))) == ()


def test_a_number_where_rules_scope_still_finds_rules_by_the_index() -> None:
    """A number stands for its text in a scope as in a match, so the index answers; only
    what a rule scoped by the field would refuse (a list, an object, a number no text
    stands for) has every rule tested, to be refused as before."""
    decider = Decider(parse_rules(_mcc_rules(20, scope=["card_id", "mcc"])), compiled=False)
    index = decide.RuleIndex(vars(decider)["_compiled"])
    for value in (6, Decimal("6.0"), "6"):
        assert index.select({"card_id": "c1", "mcc": value}, "CNY") == [6], value
    assert index.select({"card_id": "c1", "mcc": True}, "CNY") == []  # "true"
    for refused in (["6"], {"6": 6}, Decimal("NaN"), Decimal("Infinity")):
        assert index.select({"card_id": "c1", "mcc": refused}, "CNY") is None, refused
    assert index.select({"card_id": 7, "mcc": "6"}, "CNY") == [6]


def test_rules_that_apply_keep_the_file_s_order(indexed_from_8: None) -> None:
    """Rules filed under different fields and values, and rules without a match, come out
    in the order the file gives them, as the verdict lists their limits."""
    rules = [
        {"id": "any-day", "window": "day", "max_count": 9},
        {"id": "by-channel", "window": "day", "max_count": 9, "match": {"channel": ["pos"]}},
        {"id": "by-mcc", "window": "hour", "max_count": 9, "match": {"mcc": ["5411", "1"]}},
        *[
            {"id": f"other-{n}", "window": "day", "max_count": 9, "match": {"mcc": [f"9{n}"]}}
            for n in range(8)
        ],
        {"id": "both", "window": "week", "max_count": 9,
         "match": {"channel": ["pos", "atm"], "mcc": ["5411"]}},
        {"id": "any-month", "window": "month", "max_count": 9},
    ]  # fmt: skip
    for decider in both(parse_rules(json.dumps({"rules": rules}))):
        plan = decider.plan(parse_event(_pay("e", mcc="5411", channel="pos")))
        ids = ["any-day", "by-channel", "by-mcc", "both", "any-month"]
        assert [a.rule.rule.id for a in plan] == ids
        plan = decider.plan(parse_event(_pay("e", mcc="5411", channel="ecom")))
        assert [a.rule.rule.id for a in plan] == ["any-day", "by-mcc", "any-month"]


def test_a_list_where_a_rule_scopes_is_refused_whether_or_not_its_match_holds(
    indexed_from_8: None,
) -> None:
    """As when every rule is tested in turn: a field that a rule of the event's currency
    scopes by holds a list, so the event is a dead letter, even where that rule's match
    leaves it out."""
    rules = parse_rules(_mcc_rules(20, scope="card_id"))
    for decider in both(rules):
        got = outcomes(decider, [_pay("e", mcc="9999", card_id=["c1"])], WorkingState(Snapshot()))
        assert got[0][0] == "rejected", got
        assert "card_id: a rule scopes by this field" in got[0][2]


_FIELDS = ["channel", "mcc", "merchant_id", "type"]
_VALUES = st.one_of(st.sampled_from(["atm", "pos", "1", "2", "5411", "payment"]), _SCALAR)


@st.composite
def large_rule_files(draw: st.DrawFn) -> str:
    rules = []
    for n in range(draw(st.integers(min_value=8, max_value=30))):
        rule: dict[str, Any] = {
            "id": f"r{n}",
            "window": draw(st.sampled_from(["transaction", "minute", "day", "lifetime"])),
            "scope": draw(st.sampled_from(["account_id", "card_id", ["card_id", "mcc"]])),
            "currency": draw(st.sampled_from(["CNY", "USD"])),
        }
        if rule["window"] == "transaction":
            rule["max_amount"] = draw(st.sampled_from(["2", "5"]))
        else:
            rule["max_count"] = draw(st.integers(min_value=0, max_value=2))
            if draw(st.booleans()):
                del rule["currency"]
        match = {}
        for name in draw(st.lists(st.sampled_from(_FIELDS), max_size=3, unique=True)):
            values = st.sampled_from(["atm", "pos", "ecom", "1", "2", "5411", "payment", 1, 2])
            match[name] = draw(st.lists(values, min_size=1, max_size=4))
        if match:
            rule["match"] = match
        rules.append(rule)
    return json.dumps({"rules": rules})


@st.composite
def events(draw: st.DrawFn) -> list[str]:
    lines = []
    for n in range(draw(st.integers(min_value=1, max_value=12))):
        fields = {name: draw(_VALUES) for name in _FIELDS if draw(st.booleans())}
        if "type" in fields and fields["type"] != "payment":
            del fields["type"]
        if draw(st.booleans()):
            fields["card_id"] = draw(st.one_of(st.sampled_from(["c1", "c2"]), _SCALAR))
        amount = draw(st.sampled_from(["1", "3"]))
        currency = draw(st.sampled_from(["CNY", "USD"]))
        lines.append(_pay(f"e{n}", amount=amount, currency=currency, **fields))
    return lines


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rules=large_rule_files(), lines=events())
def test_any_stream_is_decided_as_when_every_rule_is_tested(rules: str, lines: list[str]) -> None:
    ruleset = parse_rules(rules)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(decide, "INDEX_FROM", 10**9)
        reference = Decider(ruleset, compiled=False)
        expected_state = WorkingState(Snapshot())
        expected = outcomes(reference, lines, expected_state)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(decide, "INDEX_FROM", 8)
        for decider in both(ruleset):
            state = WorkingState(Snapshot())
            assert outcomes(decider, lines, state) == expected
            assert state.snapshot == expected_state.snapshot
        found: dict[str, Any] = vars(decider)["_by_currency"]  # the Python path's
    for candidates, index in found.values():  # indexed wherever it may be
        assert (index is None) == (len(candidates) < 8 or not any(c.match for c in candidates))


def test_rules_share_one_copy_of_each_match_value_and_list() -> None:
    """Planning reads the values an event's candidates allow: one copy each, not one per
    rule that lists them (``_compile``)."""
    text = """
rules:
  - {id: a, window: day, max_count: 1, match: {mcc: ["5411", "5812"], channel: [pos]}}
  - {id: b, window: day, max_count: 1, match: {mcc: ["5411", "5812"]}}
  - {id: c, window: day, max_count: 1, scope: [card_id, mcc], match: {mcc: [5411, "7995"]}}
"""
    a, b, c = parse_rules(text).rules
    assert a.match[0][1] is b.match[0][1]  # an equal list: one set
    first = {value: value for value in a.match[0][1]}
    assert next(v for v in c.match[0][1] if v == "5411") is first["5411"]
    assert a.match[0][0] is b.match[0][0] is c.match[0][0] is c.scope[1]
