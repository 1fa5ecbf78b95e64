"""The compiled payment path decides exactly as the Python path: same verdict bytes,
same dead letters, same state, on the same streams."""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from msgspec.structs import astuple

from benchmarks.generate import events as generated
from handlers import decide
from handlers.decide import Decider
from handlers.state import Account, Bucket, EventRecord, Snapshot, WorkingState, Writes
from schemas import zones
from schemas.amounts import format_minor
from schemas.events import EventRejected, EventType, parse_event
from schemas.rules import RuleSet, parse_rules
from stores.base import LATEST_EXPIRY, expire, stamp
from tests.unit.built import SLOTS, assert_built_after, private
from tests.unit.test_decide import RULES

EXAMPLE_RULES = "examples/rules.yaml"


def both(rules: RuleSet) -> tuple[Decider, Decider]:
    compiled, python = Decider(rules), Decider(rules, compiled=False)
    assert compiled.compiled, "handlers._fastcore is not built: pip install -e . builds it"
    assert not python.compiled
    return compiled, python


def outcomes(decider: Decider, lines: Sequence[bytes | str], state: WorkingState) -> list[Any]:
    """Each line's outcome, or the dead letter that parsing or planning gave it."""
    results: list[Any] = []
    for line in lines:
        try:
            event = parse_event(line)
            results.append(decider.decide(event, decider.plan(event), state))
        except EventRejected as exc:
            results.append(("rejected", exc.error, exc.detail))
    return results


def assert_same(
    rules: RuleSet, lines: Sequence[bytes | str], snapshot: Snapshot | None = None
) -> None:
    compiled, python = both(rules)
    fast_state = WorkingState(_copy(snapshot))
    slow_state = WorkingState(_copy(snapshot))
    assert outcomes(compiled, lines, fast_state) == outcomes(python, lines, slow_state)
    assert fast_state.snapshot == slow_state.snapshot
    assert fast_state.take_writes() == slow_state.take_writes()


def _copy(snapshot: Snapshot | None) -> Snapshot:
    if snapshot is None:
        return Snapshot()
    return Snapshot(
        {k: b.copy() for k, b in snapshot.buckets.items()},
        {k: a.copy() for k, a in snapshot.accounts.items()},
        {k: e.copy() for k, e in snapshot.events.items()},
        {k: e.copy() for k, e in snapshot.expired_events.items()},
    )


def _fast_core(python: Decider, plan: Any, decide_: Any, payment: Any, *more: Any) -> Any:
    """A compiled core on ``python``'s rules that hands what it does not take to the
    given Python paths (``more``: how it answers resends)."""
    assert private(decide, "_fastcore") is not None, "handlers._fastcore is not built"
    return private(decide, "_fastcore").FastCore(
        python._compiled,
        python.rules.version,
        decide.Applied,
        decide.Outcome,
        decide.OutcomeKind.VERDICT,
        decide.escape,
        decide._SHORT_KEY,
        decide.AMOUNT_CEILING,
        plan,
        decide_,
        payment,
        *more,
    )


def test_the_generated_benchmark_stream_is_decided_alike() -> None:
    from schemas.rules import load_rules

    assert_same(load_rules(EXAMPLE_RULES), list(generated(6_000, accounts=300, merchants=20)))


def test_the_compiled_path_is_taken_for_ordinary_payments() -> None:
    """Plans and decides them itself: the Python path, here made to fail, is not asked."""
    from schemas.rules import load_rules

    def python_path(*_: object) -> None:
        raise AssertionError("an ordinary payment went to the Python path")

    python = Decider(load_rules(EXAMPLE_RULES), compiled=False)
    fast = _fast_core(python, python_path, python_path, python_path)
    state, expected = WorkingState(Snapshot()), WorkingState(Snapshot())
    for line in generated(300, accounts=20):
        event = parse_event(line)
        if event.type.value != "payment" or event.event_id in state.snapshot.events:
            continue
        plan = fast.plan(event)
        assert fast.decide(event, plan, state) == python.decide(event, plan, expected)
    assert state.snapshot == expected.snapshot


def _line(event_id: str, **fields: Any) -> str:
    doc = {"event_id": event_id, "account_id": "a", "occurred_at": "2026-03-14T10:00:00Z"}
    if fields.get("type") != "reversal":
        doc.update(card_id="c", merchant_id="m", channel="pos")
    return json.dumps({**doc, **fields})


def _reversal(event_id: str, original: str, **fields: Any) -> str:
    return _line(event_id, type="reversal", original_event_id=original, **fields)


REVERSALS = [
    _line("p1", amount="100.00", currency="CNY"),
    _reversal("r1", "p1", amount="30.00", currency="CNY"),  # a part
    _reversal("r2", "p1", amount="70.01", currency="CNY"),  # one minor unit too many
    _reversal("r3", "p1"),  # all that is left: the count is released too
    _reversal("r4", "p1"),  # nothing left
    _reversal("r5", "unknown"),
    _reversal("r6", "unknown", amount="5.00", currency="USD"),
    _reversal("r7", "unknown", amount="1E+1"),  # shown as it was read
    _line("p2", amount="80.00", currency="CNY"),
    _reversal("r8", "p2", account_id="b"),  # another account's
    _reversal("r9", "r1"),  # not a payment
    _line("p3", amount="4000.00", currency="CNY"),  # over a limit: rejected
    _reversal("r10", "p3"),
    _reversal("r11", "p3", amount="7", currency="JPY"),
    _line("p4", amount="1200", currency="JPY"),
    _reversal("r12", "p4", amount="200", currency="JPY"),
    _reversal("r13", "p4"),
    _line("p5", amount="10.00", currency="CNY"),
    _reversal("r14", "p5", amount="1.00", currency="JPY"),  # a dead letter
    _reversal("r15", "p5", amount="0.5"),  # read in CNY
    _reversal("r16", "p3", amount="0.5"),  # read in CNY, though not accepted
    _reversal("r1", "p1", amount="30.00", currency="CNY"),  # resends
    _line("p2", amount="80.00", currency="CNY"),
    _reversal("r2", "p1", amount="70.01", currency="CNY"),
    _line("p3", amount="4000.00", currency="CNY"),
    _reversal("r1", "p1", amount="31.00", currency="CNY"),  # another payload: a conflict
    _line("p2", amount="80.01", currency="CNY"),  # another payload: a conflict
]
"""A payment's life through reversals: every reason, and each way an amount is sent."""
BY_PYTHON = {"r14", "r15", "r16", "r1", "p2"}
"""Those of ``REVERSALS`` the compiled path hands to the Python path: a currency that
differs, an amount to read in the original's currency, an event id sent again with
another payload (the last two; the resends before them are decided compiled, and give
the reason their original got)."""


def test_reversals_take_the_compiled_path_and_are_decided_alike() -> None:
    from schemas.rules import load_rules

    rules = load_rules(EXAMPLE_RULES)
    assert_same(rules, REVERSALS)
    python = Decider(rules, compiled=False)
    asked: list[str] = []

    def python_decide(event: Any, applied: Any, state: WorkingState) -> Any:
        asked.append(event.event_id)
        return python.decide(event, applied, state)

    def no_python(*_: object) -> None:
        raise AssertionError("an ordinary payment went to the Python path")

    fast = _fast_core(
        python, no_python, python_decide, no_python, decide.OutcomeKind.DUPLICATE, decide._reason_in
    )
    state = WorkingState(Snapshot())
    reasons = []
    for line in REVERSALS:
        event = parse_event(line)
        outcome = fast.decide(event, fast.plan(event), state)
        reasons.append(None if outcome.reason is None else outcome.reason.value)
    assert set(asked) == BY_PYTHON
    assert len(asked) == 5  # the resends of r1 and p2 are not among them
    assert reasons[-6:-2] == [None, None, "reversal_exceeds_original", "limit_exceeded"]
    assert reasons[1:8] == [
        None,
        "reversal_exceeds_original",
        None,
        "already_reversed",
        "original_not_found",
        "original_not_found",
        "original_not_found",
    ]
    assert reasons[9:11] + reasons[12:14] == [
        "original_not_found",
        "original_not_found",
        "original_not_accepted",
        "original_not_accepted",
    ]


@pytest.mark.parametrize(
    ("verdict", "read_in_place"),
    [
        (
            b'{"event_id":"e","account_id":"a","type":"payment","decision":"accept",'
            b'"reason":null,"seq":1,"violations":[]}',
            True,
        ),
        (
            b'{"event_id":"e","account_id":"a","type":"reversal","decision":"reject",'
            b'"reason":"already_reversed","seq":2}',
            True,
        ),
        (  # the text of an earlier field cannot hold the quotes unescaped
            b'{"event_id":"\\"decision\\":\\"accept\\",\\"reason\\":null,",'
            b'"account_id":"a","type":"payment","decision":"reject",'
            b'"reason":"limit_exceeded","seq":3}',
            True,
        ),
        (b'{"event_id":"e","decision":"reject","reason":"not_a_reason","seq":1}', False),
        (b'{"account_id":"a","event_id":"e","decision":"reject","reason":"limit_exceeded"}', False),
        (b'{"event_id":"e","decision":"reject","reason":"limit_exceeded"}', False),
        (b'{"event_id":"e","decision":"reject" , "reason":"limit_exceeded","seq":1}', False),
        (b'{"event_id":"e","decision":"maybe","reason":"limit_exceeded","seq":1,"x":12}', False),
        (b'{"event_id":"e","decision":"accept","reason":null', False),
        (b"not json at all", False),
        (b"", False),
    ],
)
def test_a_resend_gets_the_reason_its_verdict_names(verdict: bytes, read_in_place: bool) -> None:
    """Read where the verdict has it, else by decoding the whole of it."""
    assert private(decide, "_fastcore") is not None, "handlers._fastcore is not built"
    decoded: list[bytes] = []

    def reason_in(text: bytes) -> Any:
        decoded.append(text)
        return decide._reason_in(text)

    assert private(decide, "_fastcore").stored_reason(verdict, reason_in) == decide._reason_in(
        verdict
    )
    assert not decoded if read_in_place else decoded == [verdict]


def paid_100(rules: RuleSet) -> tuple[Snapshot, EventRecord, str]:
    """The state after payment p1 of 100.00 CNY, decided on the compiled path, with its
    record stamped life 7 in every bucket: (snapshot, p1's record, its first bucket)."""
    compiled, _ = both(rules)
    state = WorkingState(Snapshot())
    payment = parse_event(_line("p1", amount="100.00", currency="CNY"))
    compiled.decide(payment, compiled.plan(payment), state)
    snapshot = _copy(state.snapshot)
    record = snapshot.events["p1"]
    record.born = tuple(7 for _ in record.buckets)
    return snapshot, record, record.buckets[0]


@pytest.mark.parametrize(
    "case", ["absent", "empty", "another_life", "rule_removed", "window_changed", "damaged"]
)
def test_a_reversal_of_buckets_not_as_the_payment_left_them_is_decided_alike(case: str) -> None:
    """The compiled path hands these to the Python path before it changes anything."""
    from schemas.rules import load_rules

    rules = load_rules(EXAMPLE_RULES)
    snapshot, record, key = paid_100(rules)
    if case == "absent":
        del snapshot.buckets[key]
    elif case == "empty":
        snapshot.buckets[key] = Bucket(0, 0, 3)
    elif case == "another_life":
        snapshot.buckets[key].born = 8
    elif case == "rule_removed":
        assert record.born is not None
        record.buckets = ("gone-rule|2026-03-14|a", *record.buckets)
        record.born = (7, *record.born)
        snapshot.buckets["gone-rule|2026-03-14|a"] = Bucket(1, 10_000, 1, born=7)
    elif case == "window_changed":  # an hour's bucket of a rule that now counts days
        assert record.born is not None
        record.buckets = ("acct-day-cny|2026-03-14T10|a", *record.buckets)
        record.born = (7, *record.born)
        snapshot.buckets["acct-day-cny|2026-03-14T10|a"] = Bucket(1, 10_000, 1, born=7)
    else:
        snapshot.buckets[key].amount = 2**70
    for b in snapshot.buckets.values():
        if case != "another_life" or b is not snapshot.buckets[key]:
            b.born = b.born or 7
    assert_same(rules, [_reversal("r1", "p1"), _reversal("r2", "p1", amount="1.00")], snapshot)


# -- hypothesis: rules and events built to reach every branch and every fallback ---------

_TEXT = st.text(
    alphabet=st.sampled_from(
        ["a", "b", "|", "\\", '"', "\n", "\x01", "\x7f", "/", "<", "é", "中", "😀", "\u2028", " "]
    ),
    min_size=1,
    max_size=6,
)
_SCALAR = st.one_of(
    st.sampled_from(["x", "y", "atm", "pos"]),
    _TEXT,
    st.integers(min_value=-5, max_value=5),
    st.sampled_from([Decimal("1.0"), Decimal("1E2"), Decimal("0.50")]),
    st.booleans(),
    st.none(),
    st.just(["x"]),
    st.just({"k": "v"}),
)
_WINDOWS = ["transaction", "minute", "hour", "day", "week", "month", "year", "lifetime"]
_ZONES = ["UTC", "Asia/Shanghai", "America/New_York", "Africa/Monrovia", "Asia/Kathmandu"]
_CURRENCIES = ["CNY", "JPY", "KWD", "CLF"]


@st.composite
def rule_files(draw: st.DrawFn) -> str:
    rules = []
    for index in range(draw(st.integers(min_value=1, max_value=5))):
        window = draw(st.sampled_from(_WINDOWS))
        rule: dict[str, Any] = {"id": f"r{index}", "window": window}
        rule["scope"] = draw(
            st.sampled_from(["account_id", "card_id", ["card_id", "merchant_id"], "type"])
        )
        rule["timezone"] = draw(st.sampled_from(_ZONES))
        currency = draw(st.one_of(st.none(), st.sampled_from(_CURRENCIES)))
        if window == "transaction" and currency is None:
            currency = "CNY"  # a transaction window limits the amount, in a currency
        if currency is not None:
            rule["currency"] = currency
        count = draw(st.one_of(st.none(), st.integers(min_value=0, max_value=4)))
        amount = (
            draw(st.one_of(st.none(), st.sampled_from(["0", "5", "12", "100", "99999999999"])))
            if currency is not None
            else None
        )
        if window == "transaction":
            count, amount = None, amount or "12"
        elif count is None and amount is None:
            count = 3
        if count is not None:
            rule["max_count"] = count
        if amount is not None:
            rule["max_amount"] = amount
        if draw(st.booleans()):
            rule["match"] = {"channel": ["atm", "pos"]} if draw(st.booleans()) else {"mcc": [1]}
        rules.append(rule)
    return json.dumps({"rules": rules})


@st.composite
def streams(draw: st.DrawFn) -> list[str]:
    lines: list[str] = []
    for n in range(draw(st.integers(min_value=1, max_value=25))):
        if lines and draw(st.integers(min_value=0, max_value=9)) == 0:
            lines.append(draw(st.sampled_from(lines)))  # a resend
            continue
        currency = draw(st.sampled_from(_CURRENCIES))
        doc: dict[str, Any] = {
            "event_id": draw(st.one_of(st.just(f"e{n}"), _TEXT, st.just(f"e{n - 1}"))),
            "account_id": draw(st.one_of(st.sampled_from(["a1", "a2"]), _TEXT)),
            "amount": draw(st.sampled_from(["1", "3", "5", "12", "99999999999", "0.5", "7"])),
            "currency": currency,
            "occurred_at": draw(
                st.sampled_from(
                    [
                        "2026-03-14T10:00:00+08:00",
                        "2026-03-14T10:00:30Z",
                        "2026-03-15T23:59:59.999999-05:00",
                        "1968-05-01T12:00:10Z",
                        "2026-12-31T23:59:60Z",
                    ]
                )
            ),
        }
        for name in ("card_id", "merchant_id", "channel", "mcc"):
            if draw(st.booleans()):
                doc[name] = draw(_SCALAR)
        if draw(st.integers(min_value=0, max_value=4)) == 0:
            doc = {
                "event_id": draw(st.sampled_from([f"rev{n}", f"e{n}"])),
                "type": "reversal",
                "account_id": draw(st.sampled_from([doc["account_id"], "a1", "a2"])),
                "original_event_id": draw(
                    st.sampled_from([f"e{k}" for k in range(n + 1)] + [f"rev{n - 1}"])
                ),
                "occurred_at": doc["occurred_at"],
            }
            # all that is left, or an amount: in a currency (the original's or another)
            # or without one (read in the original's, where it may not fit)
            if draw(st.booleans()):
                doc["amount"] = draw(st.sampled_from(["1", "2", "5", "0.5", "0.001", "999"]))
                if draw(st.booleans()):
                    doc["currency"] = draw(st.sampled_from(_CURRENCIES))
        if draw(st.integers(min_value=0, max_value=15)) == 0:
            doc["card_id"] = "k" * 300  # a key too long for the compiled path
        lines.append(json.dumps(doc, default=str))
    return lines


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rules=rule_files(), lines=streams())
def test_any_stream_is_decided_alike(rules: str, lines: list[str]) -> None:
    assert_same(parse_rules(rules), list(lines))


@settings(max_examples=100, deadline=None)
@given(
    count=st.sampled_from([0, 1, 2**62 - 1, 2**62, 2**63 - 1]),
    amount=st.sampled_from([0, 1, 10**15, 2**62 - 1, 2**62, 2**63 - 1]),
)
def test_buckets_near_the_integer_limits_are_decided_alike(count: int, amount: int) -> None:
    """Stored counts and amounts that the compiled integers cannot hold go to Python."""
    rules = parse_rules(RULES)
    line = '{"event_id":"e","account_id":"a1","amount":"5","currency":"CNY",'
    line += '"occurred_at":"2026-03-14T10:00:00+08:00","merchant_id":"m","card_id":"c"}'
    event = parse_event(line)
    snapshot = Snapshot()
    for applied in Decider(rules, compiled=False).plan(event):
        if applied.key is not None:
            snapshot.buckets[applied.key] = Bucket(count, amount, 3, None, None, 0)
    assert_same(rules, [line], snapshot)


@settings(max_examples=2_000, deadline=None)
@given(
    value=st.one_of(
        st.integers(min_value=-(2**63) + 1, max_value=2**63 - 1),
        st.integers(min_value=-1_000, max_value=1_000),
        st.sampled_from([10**k + d for k in range(19) for d in (-1, 0, 1)]),
    ),
    exponent=st.integers(min_value=0, max_value=18),
)
def test_the_verdict_writer_writes_numbers_as_the_python_path(value: int, exponent: int) -> None:
    """Amounts as ``format_minor`` writes them, counts as ``str``: every digit count,
    every exponent, leading zeros after the point, signs."""
    assert private(decide, "_fastcore") is not None, "handlers._fastcore is not built"
    written = private(decide, "_fastcore").json_number(value, exponent, True)
    assert written == json.dumps(format_minor(value, exponent)).encode()
    assert private(decide, "_fastcore").json_number(value, exponent, False) == str(value).encode()


@pytest.mark.parametrize("seq", [1.5e20, float("inf"), 2.5, 2**64, -(2**64)])  # NaN != NaN
def test_an_account_sequence_a_damaged_store_returns_is_written_alike(seq: object) -> None:
    """A sqlite file edited by hand may hold a REAL in the INTEGER column."""
    rules = parse_rules(RULES)
    line = (
        '{"event_id":"e","account_id":"a1","amount":"5","currency":"CNY",'
        '"occurred_at":"2026-03-14T10:00:00+08:00"}'
    )
    assert_same(rules, [line], Snapshot(accounts={"a1": Account(seq, 3)}))  # type: ignore[arg-type]


def test_an_expired_record_is_replaced_under_its_version_alike() -> None:
    rules = parse_rules(RULES)
    line = (
        '{"event_id":"e","account_id":"a1","amount":"5","currency":"CNY",'
        '"occurred_at":"2026-03-14T10:00:00+08:00"}'
    )
    compiled, _ = both(rules)
    state = WorkingState(Snapshot())
    first = compiled.decide(parse_event(line), compiled.plan(parse_event(line)), state)
    assert first.verdict is not None
    old = state.snapshot.events.pop("e")
    old.version, old.expires_at = 7, 1_000
    snapshot = Snapshot(expired_events={"e": old})
    assert_same(rules, [line.replace('"5"', '"6"')], snapshot)


def test_without_the_extension_the_python_path_decides(monkeypatch: Any) -> None:
    monkeypatch.setattr(decide, "_fastcore", None)
    assert not Decider(parse_rules(RULES)).compiled


def test_the_built_extension_is_not_older_than_its_source() -> None:
    """An edit to ``_fastcore.pyx``, or to the ``_slots`` code it takes in, takes effect
    only once built again."""
    assert_built_after(private(decide, "_fastcore"), "handlers/_fastcore.pyx", *SLOTS)


def test_every_attribute_the_compiled_path_reads_is_read_in_its_slot() -> None:
    """Slower, not wrong, if not: a change of msgspec or of a state class that left one
    attribute to ``getattr`` would show here first."""
    from schemas.rules import load_rules

    assert private(decide, "_fastcore") is not None, "handlers._fastcore is not built"
    Decider(load_rules(EXAMPLE_RULES))  # the first one finds _CompiledRule.fast
    fields = private(decide, "_fastcore").slot_fields()
    assert len(fields) == 48
    assert all(fields.values()), fields


class _OtherState(WorkingState):
    __slots__ = ()


class _OtherSnapshot(Snapshot):
    pass


class _OtherBucket(Bucket):
    pass


def test_instances_of_other_classes_are_read_and_written_by_their_attributes() -> None:
    """A subclass may lay its slots out otherwise: the compiled path reads and writes them
    by name, and decides as it does on the classes themselves."""
    from schemas.rules import load_rules

    rules = load_rules(EXAMPLE_RULES)
    lines = list(generated(2_000, accounts=30, merchants=5))
    compiled, python = both(rules)
    first = parse_event(lines[0])
    key = next(a.key for a in python.plan(first) if a.key is not None)
    other = _OtherState(_OtherSnapshot(buckets={key: _OtherBucket(0, 0)}))
    plain = WorkingState(Snapshot(buckets={key: Bucket(0, 0)}))
    assert outcomes(compiled, lines, other) == outcomes(python, lines, plain)
    changed = other.snapshot.buckets.pop(key)
    assert type(changed) is _OtherBucket
    assert astuple(changed) == astuple(plain.snapshot.buckets.pop(key))
    assert other.snapshot.buckets == plain.snapshot.buckets
    assert other.snapshot.events == plain.snapshot.events
    assert other.snapshot.accounts == plain.snapshot.accounts


def test_keys_and_take_writes_are_the_same_both_ways() -> None:
    """``handlers._fastcore.keys`` and ``take_writes`` against ``Decider.keys`` and
    ``WorkingState._take_writes``, on the same decided stream."""
    from schemas.rules import load_rules

    assert private(decide, "_fastcore") is not None, "handlers._fastcore is not built"
    rules = load_rules(EXAMPLE_RULES)
    python = Decider(rules, compiled=False)
    lines = list(generated(3_000, accounts=40, merchants=6))
    events = [parse_event(line) for line in lines]
    plans = [python.plan(event) for event in events]
    assert private(decide, "_fastcore").keys(events, plans) == Decider.keys(events, plans)
    assert any(event.original_event_id for event in events)
    with pytest.raises(ValueError):
        private(decide, "_fastcore").keys(events, plans[:-1])
    states = WorkingState(Snapshot()), WorkingState(Snapshot())
    for state in states:
        outcomes(python, lines[:1_500], state)
        state.take_writes()  # versions 1: then the same records change again
        outcomes(python, lines[1_500:], state)
    compiled_writes = private(decide, "_fastcore").take_writes(states[0])
    python_writes = states[1]._take_writes()
    assert compiled_writes == python_writes
    assert max(b.version for b in compiled_writes.buckets.values()) == 2
    assert states[0].snapshot == states[1].snapshot
    assert not states[0].pending and not states[1].pending


_EXPIRY = st.one_of(st.none(), st.integers(min_value=0, max_value=2**70))
"""An expiry or period end as a store may hold it: None, or an integer up to past 64 bits."""


@st.composite
def _writes(draw: st.DrawFn) -> Writes:
    keys = draw(st.lists(st.sampled_from("abcdefgh"), unique=True, max_size=6))
    buckets = {
        key: Bucket(
            draw(st.integers(0, 9)),
            draw(st.integers(0, 999)),
            draw(st.integers(1, 3)),
            draw(_EXPIRY),
            draw(_EXPIRY),
            draw(st.sampled_from([0, 0, 5, 2**63])),
        )
        for key in keys
    }
    events = {
        f"e{n}": EventRecord(
            "f",
            "a",
            EventType.PAYMENT,
            True,
            n + 1,
            b"{}",
            occurred=draw(st.integers(min_value=0, max_value=2**70)),
            buckets=tuple(draw(st.lists(st.sampled_from("abcdefghij"), max_size=4))),
            version=draw(st.integers(1, 3)),  # 1: new; more: stored before, maybe for good
            expires_at=draw(_EXPIRY),
            born=draw(st.one_of(st.none(), st.just(()), st.just((7,)))),
        )
        for n in range(draw(st.integers(0, 3)))
    }
    return Writes(buckets, {}, events)


@given(
    _writes(),
    st.integers(min_value=0, max_value=2**64),
    st.sampled_from([0, 86_400, 35 * 86_400, 2**62, 2**63]),
    st.sampled_from([0, 400 * 86_400, 2**62]),
    st.sampled_from([LATEST_EXPIRY, 2**62 - 1, 2**64]),
)
def test_stamp_is_the_same_both_ways(
    writes: Writes, now: int, bucket_seconds: int, event_seconds: int, latest: int
) -> None:
    """``handlers._fastcore.stamp`` against ``stores.base.stamp``: the expiries held, and
    every record as stamped, integers past 62 bits included (worked out in Python)."""
    assert private(decide, "_fastcore") is not None, "handlers._fastcore is not built"
    python = Writes(
        {k: b.copy() for k, b in writes.buckets.items()},
        {},
        {k: r.copy() for k, r in writes.events.items()},
    )
    held = private(decide, "_fastcore").stamp(writes, now, bucket_seconds, event_seconds, latest)
    assert held == stamp(python, now, bucket_seconds, event_seconds, latest)
    assert [astuple(b) for b in writes.buckets.values()] == [
        astuple(b) for b in python.buckets.values()
    ]
    assert [astuple(r) for r in writes.events.values()] == [
        astuple(r) for r in python.events.values()
    ]


def test_stores_stamp_with_the_compiled_twin() -> None:
    from stores import base

    assert private(base, "_stamp") is private(decide, "_fastcore").stamp


@given(_writes(), st.integers(min_value=0, max_value=2**71))
def test_expire_is_the_same_both_ways(writes: Writes, now: int) -> None:
    """``handlers._fastcore.expire`` against ``stores.base.expire``, on snapshots of
    records with and without expiries, some past ``now``."""
    assert private(decide, "_fastcore") is not None, "handlers._fastcore is not built"

    def snapshot() -> Snapshot:
        return Snapshot(
            {k: b.copy() for k, b in writes.buckets.items()},
            {},
            {k: r.copy() for k, r in writes.events.items()},
        )

    compiled, python = snapshot(), snapshot()
    private(decide, "_fastcore").expire(compiled, now)
    expire(python, now)
    assert compiled == python
    assert [astuple(b) for b in compiled.buckets.values()] == [
        astuple(b) for b in python.buckets.values()
    ]
    assert list(compiled.expired_events) == list(python.expired_events)


def test_stores_expire_with_the_compiled_twin() -> None:
    from stores import base

    assert private(base, "_expire") is private(decide, "_fastcore").expire


_EDGE_ZONES = (
    "UTC",
    "America/New_York",  # an hour repeated in November
    "Europe/London",
    "Australia/Lord_Howe",  # half an hour of DST
    "Asia/Kolkata",  # +5:30
    "Asia/Kathmandu",  # +5:45
    "Pacific/Chatham",  # +12:45 / +13:45
    "America/St_Johns",  # -3:30 / -2:30
    "Pacific/Kiritimati",  # +14
    "Etc/GMT+12",  # -12
    "Africa/Monrovia",  # -0:44:30 until 1972: minutes that straddle two local ones
    "Pacific/Apia",  # 2011-12-30 never happened
)


def _edge_instants(rnd: random.Random) -> list[int]:
    """Epoch seconds where periods change in the zones above: around each offset change
    of 1969-1972, 2011 and 2026 (found hour by hour, then to the second), local
    midnights at year ends, and the ends of the accepted range; in a random order, some
    in the same minute as another (the compiled path keeps a minute's periods)."""
    found: set[int] = set()
    for name in _EDGE_ZONES:
        tz = zones.zone(name)
        for start, end in ((-31_536_000, 70_000_000), (1_293_840_000, 1_325_376_000)):
            step = 3_600 * 24 if start < 0 else 3_600 * 6
            for at in range(start, end, step):
                if tz.utcoffset(datetime.fromtimestamp(at, UTC)) != tz.utcoffset(
                    datetime.fromtimestamp(at + step, UTC)
                ):
                    found.update(at + rnd.randrange(step) for _ in range(3))
        for at in range(1_767_225_600, 1_798_761_600, 3_600):  # 2026, hour by hour
            if tz.utcoffset(datetime.fromtimestamp(at, UTC)) != tz.utcoffset(
                datetime.fromtimestamp(at + 3_600, UTC)
            ):
                found.update(at + d for d in (0, 1, 59, 60, 1_799, 1_800, 3_599, 3_600, 3_601))
        for year in (1970, 2025, 2026, 2027):
            midnight = int(datetime(year, 1, 1, tzinfo=tz).timestamp())
            found.update(midnight + d for d in (-61, -1, 0, 59))
    found.update((-62_135_510_400, -62_135_510_399, 253_402_127_999, 253_402_127_940))
    instants = sorted(found)
    rnd.shuffle(instants)
    return [*instants, *(at + rnd.randrange(-30, 30) for at in rnd.sample(instants, 60))]


def test_periods_in_zones_with_odd_offsets_and_changes_are_the_same_both_ways() -> None:
    """A seeded comparison across zones and windows: payments at instants where a
    zone's periods change (DST both ways, 30- and 45-minute offsets, an offset with
    seconds, a skipped day, year ends, years 1 and 9999), out of time order, and
    reversals of some of them (released in their originals' periods) are decided alike,
    byte for byte, with the same state."""
    rnd = random.Random(20261129)
    windows = ["minute", "hour", "day", "week", "month", "year", "lifetime", "transaction"]
    rules = [
        {
            "id": f"z{z}-{window}",
            "window": window,
            "timezone": name,
            "currency": "KWD",
            "max_amount": "900.000" if window == "transaction" else "1000.000",
        }
        for z, name in enumerate(_EDGE_ZONES)
        for window in windows
    ]
    lines = []
    for n, at in enumerate(_edge_instants(rnd)):
        moment = datetime.fromtimestamp(at, UTC) + timedelta(microseconds=rnd.randrange(10**6))
        offset = rnd.choice([timedelta(0), timedelta(hours=14), timedelta(hours=-12)])
        local = moment.astimezone(timezone(offset)).isoformat()
        amount = rnd.choice(["0.001", "1.5", "250.000", "999.999"])
        lines.append(
            json.dumps(
                {"event_id": f"p{n}", "account_id": "a", "amount": amount, "currency": "KWD"}
                | {"occurred_at": local}
            )
        )
        if n % 5 == 4:
            reversal = {"event_id": f"r{n}", "type": "reversal", "account_id": "a"}
            reversal |= {"original_event_id": f"p{rnd.randrange(n)}", "occurred_at": local}
            if rnd.random() < 0.5:
                reversal["amount"] = rnd.choice(["0.001", "0.5"])
            lines.append(json.dumps(reversal))
    assert len(lines) > 400
    assert_same(parse_rules(json.dumps({"rules": rules})), lines)
