"""Deterministic edge cases for the compiled decision core (handlers/_fastcore.pyx) that
the property tests of tests/unit/test_fastcore.py reach only by chance or not at all.
Each compares the compiled path with the Python path byte for byte, and also pins the
expected decision so that a bug shared by both paths cannot pass either."""

from __future__ import annotations

import json

from handlers.state import Snapshot, WorkingState
from schemas.events import parse_event
from schemas.rules import parse_rules
from tests.unit.test_fastcore import assert_same, both


def _pay(event_id: str, amount: str, at: str, **extra: str) -> str:
    doc = {
        "event_id": event_id,
        "account_id": "a1",
        "amount": amount,
        "currency": "CNY",
        "occurred_at": at,
        **extra,
    }
    return json.dumps(doc)


def _decisions(rules_text: str, lines: list[str]) -> list[str]:
    compiled, _ = both(parse_rules(rules_text))
    state = WorkingState(Snapshot())
    found = []
    for line in lines:
        event = parse_event(line)
        decision = compiled.decide(event, compiled.plan(event), state).decision
        assert decision is not None
        found.append(decision.value)
    return found


TRANSACTION = """
rules:
  - {id: single, window: transaction, currency: CNY, max_amount: "80.00"}
"""


def test_a_payment_of_exactly_a_transaction_limit_is_accepted() -> None:
    """Kills `amount > r.max_amount` -> `>=` in the transaction branch of _payment."""
    lines = [
        _pay("e1", "80.00", "2026-03-14T10:00:00+08:00"),
        _pay("e2", "80.01", "2026-03-14T10:00:01+08:00"),
        _pay("e3", "79.99", "2026-03-14T10:00:02+08:00"),
    ]
    assert _decisions(TRANSACTION, lines) == ["accept", "reject", "accept"]
    assert_same(parse_rules(TRANSACTION), lines)


DAILY = """
rules:
  - {id: day, window: day, timezone: UTC, currency: CNY, max_count: 1}
"""


def test_a_late_event_in_the_last_second_of_a_day_counts_in_its_own_day() -> None:
    """An event of the next day's first minute, then a late one at 23:59:59 of the day
    before: the per-rule minute cache must not hand the late event the next minute's
    (the next day's) period. Kills `minute = epoch // 60` -> `(epoch + 1) // 60` in _plan."""
    lines = [
        _pay("e1", "1", "2026-03-15T00:00:10Z"),
        _pay("e2", "1", "2026-03-14T23:59:59Z"),
    ]
    assert _decisions(DAILY, lines) == ["accept", "accept"]
    assert_same(parse_rules(DAILY), lines)


def test_a_held_bucket_keeps_the_later_of_its_period_ends() -> None:
    """A stored bucket whose period_end differs from the one the plan gives (the rule's
    zone changed under the same id and period key): the compiled path keeps the later
    end, as WorkingState.bucket_for_update does. Kills `held < end` -> `held > end`."""
    from handlers.decide import Decider
    from handlers.state import Bucket

    rules = parse_rules(DAILY.replace("max_count: 1", "max_count: 9"))
    line = _pay("e1", "1", "2026-03-14T10:00:00Z")
    (applied,) = Decider(rules, compiled=False).plan(parse_event(line))
    end = applied.period_end
    assert end is not None and applied.key is not None
    for held, expected in [(end - 3600, end), (end + 3600, end + 3600)]:
        snapshot = Snapshot({applied.key: Bucket(1, 100, 3, held, None, 5)})
        assert_same(rules, [line], snapshot)
        compiled, _ = both(rules)
        state = WorkingState(snapshot)
        compiled.decide(parse_event(line), compiled.plan(parse_event(line)), state)
        assert state.snapshot.buckets[applied.key].period_end == expected


def test_a_record_expiring_exactly_now_has_expired() -> None:
    """expires_at == now is expired, for buckets and event records alike. Kills
    `expires_at <= now` -> `<` in _fastcore.expire (either loop)."""
    from handlers import decide
    from handlers.state import Bucket, EventRecord
    from schemas.events import EventType
    from stores.base import expire
    from tests.unit.built import private

    def snapshot() -> Snapshot:
        return Snapshot(
            {"b": Bucket(2, 50, 4, 900, 1_000, 7), "c": Bucket(1, 5, 2, 900, 1_001, 7)},
            {},
            {
                "e": EventRecord(
                    "f", "a", EventType.PAYMENT, True, 1, b"{}", version=2, expires_at=1_000
                ),
                "g": EventRecord(
                    "f", "a", EventType.PAYMENT, True, 2, b"{}", version=2, expires_at=1_001
                ),
            },
        )

    compiled, python = snapshot(), snapshot()
    private(decide, "_fastcore").expire(compiled, 1_000)
    expire(python, 1_000)
    assert compiled == python
    assert compiled.buckets["b"].count == 0 and compiled.buckets["b"].version == 4
    assert compiled.buckets["c"].count == 1
    assert list(compiled.expired_events) == ["e"] and list(compiled.events) == ["g"]


def test_a_reversal_never_leaves_a_bucket_amount_below_zero() -> None:
    """A released bucket that holds less than the reversal releases (a bucket of a new
    life, read for an original stored without life stamps) goes to 0, as
    Decider._reversal's max(bucket.amount - amount, 0). Kills the removal of
    `if used < 0: used = 0` in _fastcore._reversal."""
    from schemas.rules import load_rules
    from tests.unit.test_fastcore import EXAMPLE_RULES, _copy, _reversal, paid_100

    rules = load_rules(EXAMPLE_RULES)
    compiled, _ = both(rules)
    snapshot, _, key = paid_100(rules)
    for b in snapshot.buckets.values():
        b.born = 7
    snapshot.buckets[key].amount = 1  # less than the 100.00 released below
    lines = [_reversal("r1", "p1")]
    assert_same(rules, lines, snapshot)
    state = WorkingState(_copy(snapshot))
    reversal = parse_event(lines[0])
    outcome = compiled.decide(reversal, compiled.plan(reversal), state)
    assert outcome.decision is not None and outcome.decision.value == "accept"
    assert state.snapshot.buckets[key].amount == 0
    assert outcome.verdict is not None and b'"amount_used":"-' not in outcome.verdict
