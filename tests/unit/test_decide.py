"""The decision contract, rule by rule, on the memory store."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime
from typing import Any

import pytest

from handlers.decide import Decider, OutcomeKind
from handlers.state import Writes
from limitflow.errors import ConflictError
from schemas.rules import parse_rules
from stores.base import Expected
from stores.memory import MemoryStore
from streams.engine import Engine, Record

pytestmark = pytest.mark.usefixtures("both_cores")


RULES = """
rules:
  - {id: day, window: day, timezone: Asia/Shanghai, currency: CNY, max_count: 3,
     max_amount: "100.00"}
  - {id: merchant, scope: merchant_id, window: hour, currency: CNY, max_amount: "150.00"}
  - {id: single, window: transaction, currency: CNY, max_amount: "80.00"}
  - {id: atm, window: day, currency: CNY, max_amount: "30.00", match: {channel: [atm]}}
  - {id: card-month, scope: [card_id, merchant_id], window: month, max_count: 5}
"""


def pay(event_id: str, amount: str, at: str = "2026-03-14T10:00:00+08:00", **extra: Any) -> str:
    doc = {
        "event_id": event_id,
        "account_id": extra.pop("account_id", "a1"),
        "amount": amount,
        "currency": extra.pop("currency", "CNY"),
        "occurred_at": at,
        **extra,
    }
    return json.dumps(doc)


def reverse(event_id: str, original: str, amount: str | None = None, **extra: Any) -> str:
    doc = {
        "event_id": event_id,
        "type": "reversal",
        "account_id": extra.pop("account_id", "a1"),
        "original_event_id": original,
        "occurred_at": "2026-03-14T12:00:00+08:00",
        **extra,
    }
    if amount is not None:
        doc["amount"] = amount
    return json.dumps(doc)


def run(*lines: str, rules: str = RULES, store: MemoryStore | None = None) -> list[Any]:
    """Each line's verdict as a dict, or ("dead", code)."""
    engine = Engine(Decider(parse_rules(rules)), store or MemoryStore())
    results = asyncio.run(
        engine.process([Record(line.encode(), {"line": n}) for n, line in enumerate(lines, 1)])
    )
    out: list[Any] = []
    for result in results:
        if result.kind is OutcomeKind.DEAD_LETTER:
            out.append(("dead", str(result.error)))
        else:
            assert result.verdict is not None
            out.append(json.loads(result.verdict))
    return out


def test_accept_adds_to_every_applicable_bucket() -> None:
    first, second = run(pay("e1", "40.00", merchant_id="m1"), pay("e2", "50.00", merchant_id="m1"))
    assert (first["decision"], first["reason"], first["seq"]) == ("accept", None, 1)
    limits = {x["rule_id"]: x for x in second["limits"]}
    assert limits["day"]["count_used"] == 2
    assert limits["day"]["amount_used"] == "90.00"
    assert limits["day"]["amount_remaining"] == "10.00"
    assert limits["merchant"]["amount_used"] == "90.00"
    assert "atm" not in limits  # match on channel fails: not applicable
    assert "card-month" not in limits  # card_id missing: not applicable


def test_reject_lists_every_violation_and_changes_nothing() -> None:
    verdicts = run(
        pay("e1", "60.00", merchant_id="m1"),
        pay("e2", "90.00", merchant_id="m1"),  # day amount and single-payment limit
        pay("e3", "40.00", merchant_id="m1"),  # fits: e2 counted nothing
    )
    rejected = verdicts[1]
    assert (rejected["decision"], rejected["reason"]) == ("reject", "limit_exceeded")
    assert sorted(
        (v["rule_id"], v["metric"], v["used"], v["limit"]) for v in rejected["violations"]
    ) == [
        ("day", "amount", "60.00", "100.00"),
        ("single", "amount", "0.00", "80.00"),
    ]
    accepted = verdicts[2]
    assert accepted["decision"] == "accept"
    assert {x["rule_id"]: x["amount_used"] for x in accepted["limits"]}["day"] == "100.00"


def test_count_limit_and_used_is_the_value_before_the_event() -> None:
    verdicts = run(*(pay(f"e{n}", "1.00", at=f"2026-03-14T10:0{n}:00+08:00") for n in range(5)))
    assert [v["decision"] for v in verdicts] == ["accept"] * 3 + ["reject"] * 2
    assert verdicts[3]["violations"] == [
        {"rule_id": "day", "metric": "count", "period": "2026-03-14", "limit": "3", "used": "3"}
    ]


def test_periods_follow_the_event_time_in_the_rule_zone() -> None:
    # 23:30 and 00:30 local time are different Shanghai days even though both are
    # 2026-03-14 in UTC; the limit resets on the event's own clock, not the wall clock
    verdicts = run(
        pay("e1", "70.00", at="2026-03-14T23:30:00+08:00", merchant_id="m1"),
        pay("e2", "50.00", at="2026-03-15T00:30:00+08:00", merchant_id="m2"),
        pay("e3", "50.00", at="2026-03-14T15:50:00Z", merchant_id="m3"),
    )
    assert [v["decision"] for v in verdicts] == ["accept", "accept", "reject"]
    assert verdicts[2]["violations"][0]["period"] == "2026-03-14"


def test_match_and_multi_field_scope() -> None:
    verdicts = run(
        pay("e1", "25.00", channel="atm"),
        pay("e2", "10.00", channel="atm"),
        *(pay(f"c{n}", "1.00", card_id="k1", merchant_id="m9") for n in range(6)),
        rules=RULES.replace("max_count: 3,", "max_count: 30,"),
    )
    assert [v["decision"] for v in verdicts[:2]] == ["accept", "reject"]
    assert verdicts[1]["violations"][0]["rule_id"] == "atm"
    assert [v["decision"] for v in verdicts[2:]] == ["accept"] * 5 + ["reject"]
    assert verdicts[7]["violations"][0]["rule_id"] == "card-month"


def raw_pay(event_id: str, extra: str) -> str:
    """A payment with extra fields written as raw JSON (numbers exactly as given)."""
    return pay(event_id, "1.00")[:-1] + ", " + extra + "}"


def test_equal_numbers_are_one_scope_value_however_written() -> None:
    rules = "rules:\n  - {id: card, scope: card_id, window: day, max_count: 1}\n"
    verdicts = run(
        raw_pay("e1", '"card_id": 77'),
        raw_pay("e2", '"card_id": 77.0'),
        raw_pay("e3", '"card_id": 7.70e1'),
        raw_pay("e4", '"card_id": "77"'),
        raw_pay("e5", '"card_id": 1E2'),
        raw_pay("e6", '"card_id": 100'),
        rules=rules,
    )
    # 77.0 was the bucket "77.0": one card counted twice as far
    assert [v["decision"] for v in verdicts] == ["accept", *["reject"] * 3, "accept", "reject"]
    assert verdicts[4]["limits"][0]["count_used"] == 1


def test_an_amount_is_one_scope_and_match_value_however_written() -> None:
    # a "same amount, once a day" rule (card testing) was keyed by the amount's text:
    # "100.00", "100.0" and 100.00 were three amounts, and all three were accepted
    rules = """
rules:
  - {id: same-amount, scope: [card_id, amount], window: day, max_count: 1}
  - {id: hundred, match: {amount: ["100", 250.50]}, window: day, max_count: 2,
     scope: card_id}
"""

    def paid(event_id: str, card: str, amount: str) -> str:  # the amount as raw JSON
        doc = json.loads(pay(event_id, "1.00", card_id=card))
        return json.dumps(doc)[:-1].replace('"amount": "1.00"', '"amount": ' + amount) + "}"

    verdicts = run(
        paid("e1", "c", '"100.00"'),
        paid("e2", "c", '"100.0"'),
        paid("e3", "c", "100.00"),
        paid("e4", "c", '"0100"'),
        paid("e5", "c", '"250.5"'),
        paid("e6", "d", '"100.10"'),
        paid("e7", "d", '"100.1"'),
        rules=rules,
    )
    assert [v["decision"] for v in verdicts] == [
        *("accept", "reject", "reject", "reject", "accept"),
        *("accept", "reject"),
    ]
    # both "100.00" and "250.5" count against the match of 100 and 250.50
    assert verdicts[4]["limits"][1]["count_used"] == 2
    assert [x["rule_id"] for x in verdicts[6]["limits"]] == ["same-amount"]


def test_a_number_past_64_digits_is_counted_by_the_text_of_its_value() -> None:
    # 1e64 was keyed "1E+64": another card than the integer of the same value, and the
    # same card as the string "1E+64"
    rules = "rules:\n  - {id: card, scope: card_id, window: day, max_count: 1}\n"
    verdicts = run(
        raw_pay("e1", '"card_id": 1e64'),
        raw_pay("e2", '"card_id": 1' + "0" * 64),
        raw_pay("e3", '"card_id": "1E+64"'),
        raw_pay("e4", '"card_id": 1e-70'),
        raw_pay("e5", '"card_id": 0.' + "0" * 69 + "1"),
        raw_pay("e6", '"card_id": "1E-70"'),
        rules=rules,
    )
    assert [v["decision"] for v in verdicts] == ["accept", "reject", "accept"] * 2


def test_a_number_too_long_to_write_out_where_a_rule_scopes_is_a_dead_letter() -> None:
    rules = "rules:\n  - {id: card, scope: card_id, window: day, max_count: 1}\n"
    verdicts = run(
        raw_pay("e1", '"card_id": 1e999999999'),  # no text: not written out, not counted
        raw_pay("e2", '"card_id": 1e4299'),  # a text of 4,300 digits: too long for a key
        rules=rules,
    )
    assert verdicts == [("dead", "invalid_event")] * 2


def test_a_number_past_64_digits_matches_the_rule_value_it_equals() -> None:
    rules = "rules:\n  - {id: m, window: day, max_count: 0, match: {mcc: [1e64, 1e-70]}}\n"
    verdicts = run(
        raw_pay("e1", '"mcc": 1' + "0" * 64),
        raw_pay("e2", '"mcc": 0.' + "0" * 69 + "1"),
        raw_pay("e3", '"mcc": "1E+64"'),
        raw_pay("e4", '"mcc": 1e999999999'),
        rules=rules,
    )
    assert [v["decision"] for v in verdicts] == ["reject", "reject", "accept", "accept"]


def test_a_number_matches_the_rule_value_it_equals() -> None:
    rules = (
        "rules:\n  - {id: m, window: day, max_count: 1,"
        " match: {mcc: [6011], rate: [0.5], code: ['0742']}}\n"
    )
    verdicts = run(
        raw_pay("e1", '"mcc": 6011.0, "rate": 0.50, "code": "0742"'),
        raw_pay("e2", '"mcc": 6.011e3, "rate": 5e-1, "code": "0742"'),
        raw_pay("e3", '"mcc": 6011, "rate": 0.5, "code": 742'),  # 742 is not the text 0742
        rules=rules,
    )
    assert [v["decision"] for v in verdicts] == ["accept", "reject", "accept"]
    assert verdicts[2]["limits"] == []


def test_a_rule_on_type_applies_to_a_payment_that_leaves_type_out() -> None:
    rules = "rules:\n  - {id: t, window: day, max_count: 1, match: {type: [payment]}}\n"
    no_type = pay("e1", "1.00")
    explicit = json.dumps({**json.loads(pay("e2", "1.00")), "type": "payment"})
    verdicts = run(no_type, explicit, rules=rules)
    assert [v["decision"] for v in verdicts] == ["accept", "reject"]


def test_currency_filter() -> None:
    verdicts = run(pay("e1", "500", currency="JPY"), pay("e2", "500", currency="JPY"))
    assert [v["decision"] for v in verdicts] == ["accept", "accept"]
    assert verdicts[0]["limits"] == []


def test_seq_is_per_account_without_gaps_and_duplicates_reuse_it() -> None:
    verdicts = run(
        pay("e1", "1.00"),
        pay("x1", "1.00", account_id="b"),
        pay("e2", "500.00"),  # rejected: still gets a seq
        "not json",  # dead letters get none
        pay("e1", "1.00"),  # duplicate: the original verdict again
        pay("e3", "1.00"),
    )
    assert [v["seq"] if isinstance(v, dict) else v for v in verdicts] == [
        1,
        1,
        2,
        ("dead", "invalid_json"),
        1,
        3,
    ]
    assert verdicts[4] == verdicts[0]


def test_duplicate_is_identical_even_after_state_changed() -> None:
    store = MemoryStore()
    (first,) = run(pay("e1", "60.00"), store=store)
    run(pay("e2", "40.00"), store=store)
    again, conflict, same_instant = run(
        pay("e1", "60.00"),
        pay("e1", "61.00"),
        pay("e1", "60", at="2026-03-14T02:00:00Z"),  # same number, same instant
        store=store,
    )
    assert again == first
    assert conflict == ("dead", "idempotency_conflict")
    assert same_instant == first


def test_a_resend_matches_a_record_stored_with_the_earlier_fingerprint() -> None:
    from handlers.state import EventRecord, Snapshot, WorkingState
    from schemas.events import EventType, parse_event

    decider = Decider(parse_rules(RULES))
    event = parse_event(pay("e1", "60.00", mcc="6011.0").replace('"6011.0"', "6011.0"))
    assert event.legacy_fingerprint is not None
    for stored, kind in (
        (event.legacy_fingerprint, OutcomeKind.DUPLICATE),  # written before the change
        (event.fingerprint, OutcomeKind.DUPLICATE),
        ("0" * 32, OutcomeKind.DEAD_LETTER),
    ):
        record = EventRecord(stored, "a1", EventType.PAYMENT, True, 1, b"{}", 6000, "CNY")
        state = WorkingState(Snapshot(events={"e1": record}))
        assert decider.decide(event, decider.plan(event), state).kind is kind


def test_reversal_releases_amount_then_count_when_fully_reversed() -> None:
    verdicts = run(
        pay("p1", "60.00", merchant_id="m1"),
        pay("p2", "30.00", merchant_id="m1"),
        reverse("r1", "p1", "20.00"),
        reverse("r2", "p1"),  # the rest: 40.00, and now the count too
        pay("p3", "50.00", merchant_id="m1"),
        pay("p4", "10.00", merchant_id="m1"),
    )
    assert [v["decision"] for v in verdicts] == ["accept"] * 6
    released = {x["rule_id"]: x for x in verdicts[2]["limits"]}
    assert (released["day"]["count_used"], released["day"]["amount_used"]) == (2, "70.00")
    assert verdicts[3]["amount"] == "40.00"
    released = {x["rule_id"]: x for x in verdicts[3]["limits"]}
    assert (released["day"]["count_used"], released["day"]["amount_used"]) == (1, "30.00")
    assert {x["rule_id"]: x["count_used"] for x in verdicts[5]["limits"]}["day"] == 3


def test_reversal_reasons() -> None:
    verdicts = run(
        pay("p1", "60.00"),
        pay("big", "500.00"),  # rejected
        pay("other", "5.00", account_id="b"),
        reverse("r0", "nope"),
        reverse("r1", "other"),  # another account's payment
        reverse("r2", "big"),
        reverse("r3", "p1", "70.00"),
        reverse("r4", "p1"),
        reverse("r5", "p1"),
        reverse("r6", "r4"),  # a reversal is not a payment
        "{broken",
        reverse("r7", "dead"),
    )
    reasons = [v["reason"] if isinstance(v, dict) else v for v in verdicts[3:]]
    assert reasons == [
        "original_not_found",
        "original_not_found",
        "original_not_accepted",
        "reversal_exceeds_original",
        None,
        "already_reversed",
        "original_not_found",
        ("dead", "invalid_json"),
        "original_not_found",
    ]


def test_reversal_in_another_currency_is_refused() -> None:
    verdicts = run(pay("p1", "60.00"), reverse("r1", "p1", "10", currency="JPY"))
    assert verdicts[1] == ("dead", "invalid_event")


def test_reversal_amount_without_currency_uses_the_original_minor_unit() -> None:
    verdicts = run(pay("p1", "60.00"), reverse("r1", "p1", "10.5"), reverse("r2", "p1", "0.001"))
    assert (verdicts[1]["decision"], verdicts[1]["amount"], verdicts[1]["currency"]) == (
        "accept",
        "10.50",
        "CNY",
    )
    assert verdicts[2] == ("dead", "invalid_event")


def test_a_reversal_amount_finer_than_any_currency_is_dead_lettered_whatever_its_original() -> None:
    # its currency is unknown until the original is found; when none is (another
    # account's, or no such id), 1E-9 got a verdict, and 1e3 was shown as "1E+3"
    verdicts = run(
        pay("p1", "60.00", account_id="b"),
        reverse("r1", "p1", "0.000000001"),
        reverse("r2", "nope", "0.00001"),
        reverse("r3", "nope", "0.0001"),  # as fine as CLF and UYW go
        reverse("r4", "nope", "1e3"),
        reverse("r5", "nope", "3.250"),
    )
    assert verdicts[1:3] == [("dead", "invalid_event")] * 2
    assert [(v["reason"], v["amount"]) for v in verdicts[3:]] == [
        ("original_not_found", "0.0001"),
        ("original_not_found", "1000"),
        ("original_not_found", "3.250"),  # as sent
    ]


def test_reversal_of_a_rejected_payment_keeps_to_the_original_minor_unit() -> None:
    verdicts = run(
        pay("big", "500.00"),  # rejected
        reverse("r1", "big", "1.005"),
        reverse("r2", "big", "1.5"),
    )
    assert verdicts[0]["decision"] == "reject"
    assert verdicts[1] == ("dead", "invalid_event")
    assert (verdicts[2]["reason"], verdicts[2]["amount"], verdicts[2]["currency"]) == (
        "original_not_accepted",
        "1.50",
        "CNY",
    )
    assert verdicts[2]["seq"] == 2  # the dead letter took no seq


def test_non_scalar_scope_value_is_dead_lettered_not_skipped() -> None:
    (verdict,) = run(pay("p1", "1.00", merchant_id={"id": 1}))
    assert verdict == ("dead", "invalid_event")


def test_reversal_after_a_rule_was_removed_still_releases_its_bucket() -> None:
    store = MemoryStore()
    run(pay("p1", "60.00", merchant_id="m1"), store=store)
    without_merchant_rule = "\n".join(
        line for line in RULES.splitlines() if "id: merchant" not in line and "hour" not in line
    )
    (reversal,) = run(reverse("r1", "p1"), rules=without_merchant_rule, store=store)
    assert reversal["decision"] == "accept"
    assert [x["rule_id"] for x in reversal["limits"]] == ["day"]
    released = store.bucket("merchant|2026-03-14T02|m1")
    assert released is not None
    assert (released.count, released.amount) == (0, 0)


def test_reversal_after_its_rule_changed_window_releases_without_its_new_limits() -> None:
    """A rule changed in place to another window (README, *Changing rules*) counts anew in
    the new window's buckets; a reversal of a payment counted before releases it from the
    old window's bucket, which no limit of the rule now bounds: not explained by the
    month's limits and currency under a day's period."""
    store = MemoryStore()
    run(pay("p1", "60.00", merchant_id="m1"), store=store)
    # "day" now counts months, in yen; "merchant" keeps its window: explained as before
    monthly = RULES.replace(
        "{id: day, window: day, timezone: Asia/Shanghai, currency: CNY, max_count: 3,\n"
        '     max_amount: "100.00"}',
        '{id: day, window: month, currency: JPY, max_count: 30, max_amount: "9000"}',
    )
    assert monthly != RULES
    (reversal,) = run(reverse("r1", "p1"), rules=monthly, store=store)
    assert reversal["decision"] == "accept"
    assert [(x["rule_id"], x["window"]) for x in reversal["limits"]] == [("merchant", "hour")]
    released = store.bucket("day|2026-03-14|a1")
    assert released is not None
    assert (released.count, released.amount) == (0, 0)
    # changed back, the day's counter carries on from the release
    (payment,) = run(pay("p2", "10.00", merchant_id="m1"), store=store)
    day = next(x for x in payment["limits"] if x["rule_id"] == "day")
    assert (day["period"], day["count_used"], day["amount_used"]) == ("2026-03-14", 1, "10.00")


def expiries(store: MemoryStore) -> dict[str, tuple[int, int | None]]:
    buckets = {key: store.bucket(key) for key in store.data.buckets}
    return {key: (b.version, b.expires_at) for key, b in buckets.items() if b is not None}


def test_reversal_after_its_buckets_expired_writes_no_bucket() -> None:
    now = [datetime(2026, 3, 14, 4, tzinfo=UTC).timestamp()]
    store = MemoryStore(clock=lambda: now[0])
    run(pay("p1", "60.00", merchant_id="m1"), store=store)
    before = expiries(store)
    assert all(expires is not None for _, expires in before.values())
    now[0] += 90 * 86400  # past the buckets' retention, within the event record's
    (reversal,) = run(reverse("r1", "p1"), store=store)
    assert reversal["decision"] == "accept"
    assert {x["rule_id"]: x["amount_used"] for x in reversal["limits"]}["day"] == "0.00"
    # the expired buckets are left to expire, not rewritten without a period end
    assert expiries(store) == before


@pytest.mark.parametrize("compiled", [True, False])
def test_a_bucket_outlives_an_hour_that_clocks_set_back_made_two_hours_long(
    compiled: bool,
) -> None:
    """New York's hour 01 of 1 Nov 2026 runs from 05:00 to 07:00 UTC. Its bucket's period
    end was the first payment's instant + one hour: with a short retention (here 15
    minutes) a live consumer let it expire at 06:15, and a second payment at 06:30 UTC
    (01:30 EST), in the same hour, was counted in an empty bucket and accepted."""
    from stores.base import Retention

    rules = "rules:\n  - {id: ny-hour, window: hour, timezone: America/New_York, max_count: 1}\n"
    now = [0.0]
    store = MemoryStore(Retention(bucket_seconds=900), clock=lambda: now[0])
    engine = Engine(Decider(parse_rules(rules), compiled=compiled), store)
    decisions = []
    for n, at in enumerate(("2026-11-01T01:00:00-04:00", "2026-11-01T01:30:00-05:00")):
        doc = {"event_id": f"e{n}", "account_id": "a", "amount": "1.00", "currency": "USD"}
        line = json.dumps({**doc, "occurred_at": at}).encode()
        now[0] = datetime.fromisoformat(at).timestamp()  # decided as it happens
        (result,) = asyncio.run(engine.process([Record(line, {"line": n + 1})]))
        assert result.verdict is not None
        verdict = json.loads(result.verdict)
        assert verdict["limits"][0]["period"] == "2026-11-01T01"
        decisions.append(verdict["decision"])
    assert decisions == ["accept", "reject"]


def _decide_at(engine: Engine, now: list[float], at: str, *docs: dict[str, Any]) -> list[Any]:
    """Decide ``docs`` as one batch with the store's clock at ``at``."""
    now[0] = datetime.fromisoformat(at).timestamp()
    records = [Record(json.dumps(doc).encode(), {"line": 1}) for doc in docs]
    return [json.loads(r.verdict or b"null") for r in asyncio.run(engine.process(records))]


def _payment(event_id: str, at: str, amount: str = "1.00") -> dict[str, Any]:
    return {
        "event_id": event_id,
        "account_id": "a",
        "amount": amount,
        "currency": "USD",
        "occurred_at": at,
    }


@pytest.mark.parametrize("compiled", [True, False])
def test_a_later_payment_of_the_period_does_not_outlive_an_earlier_ones_record(
    compiled: bool,
) -> None:
    """Defaults (buckets 35 days past their period, records 400 days past the event).
    A bucket's period end was its latest event's instant + a year: p2 of 20 December
    carried the 2026 bucket to December 2027, past p1's record (January 2027 + 35 days),
    and a resend of p1 in March 2027 was counted in the bucket a second time. The end is
    the year's now, the same for both."""
    from handlers.state import Keys

    rules = "rules:\n  - {id: year, window: year, max_count: 10}\n"
    now = [0.0]
    store = MemoryStore(clock=lambda: now[0])
    engine = Engine(Decider(parse_rules(rules), compiled=compiled), store)
    p1, p2 = _payment("p1", "2026-01-10T00:00:00Z"), _payment("p2", "2026-12-20T00:00:00Z")
    _decide_at(engine, now, "2026-01-10T00:00:00Z", p1)
    _decide_at(engine, now, "2026-12-20T00:00:00Z", p2)
    bucket = store.bucket("year|2026|a")
    assert bucket is not None and bucket.expires_at is not None
    record = asyncio.run(store.load(Keys(set(), set(), {"p1"}))).events["p1"]
    assert record.expires_at is not None and record.expires_at >= bucket.expires_at
    (again,) = _decide_at(engine, now, "2027-03-20T00:00:00Z", p1)  # both gone by now
    assert again["limits"][0]["count_used"] == 1  # a new life of the bucket, not 3


@pytest.mark.parametrize("compiled", [True, False])
def test_a_bucket_of_a_period_before_1970_expires_again_after_it_began_again(
    compiled: bool,
) -> None:
    """A bucket that expired reads with no period end, which the next payment of its
    period sets again. Its end was compared as ``(period_end or 0) < end``: a period
    before 1970 ends at a negative instant, the end stayed none, and the bucket (and
    the records counted in it) never expired."""
    from stores.base import Retention

    rules = "rules:\n  - {id: day, window: day, max_amount: '100.00', currency: USD}\n"
    now = [0.0]
    store = MemoryStore(Retention(bucket_seconds=86_400, event_seconds=86_400), lambda: now[0])
    engine = Engine(Decider(parse_rules(rules), compiled=compiled), store)
    _decide_at(engine, now, "2030-01-01T00:00:00Z", _payment("p1", "1969-12-20T10:00:00Z"))
    _decide_at(engine, now, "2030-01-05T00:00:00Z", _payment("p2", "1969-12-20T11:00:00Z"))
    bucket = store.bucket("day|1969-12-20|a")
    assert bucket is not None and bucket.period_end is not None
    assert bucket.expires_at == datetime.fromisoformat("2030-01-06T00:00:00Z").timestamp()
    (p3,) = _decide_at(
        engine, now, "2040-01-05T00:00:00Z", _payment("p3", "1969-12-20T12:00:00Z", "90.00")
    )
    assert p3["decision"] == "accept"
    assert p3["limits"][0]["amount_used"] == "90.00"


def test_an_unlimited_bucket_stops_at_the_64_bit_ceiling_instead_of_crashing_the_store() -> None:
    from handlers.decide import AMOUNT_CEILING
    from handlers.state import Bucket

    rules = "rules:\n  - {id: n, window: lifetime, currency: USD, max_count: 1000000}\n"
    store = MemoryStore()
    store.put_bucket("n|lifetime|a1", Bucket(5, AMOUNT_CEILING - 10, 1, None))
    first, second = run(
        pay("e1", "9999999999999.99", currency="USD"),
        pay("e2", "1.00", currency="USD"),
        rules=rules,
        store=store,
    )
    assert [first["decision"], second["decision"]] == ["accept", "accept"]
    assert second["limits"][0]["count_used"] == 7
    stored = store.bucket("n|lifetime|a1")
    assert stored is not None and stored.amount == AMOUNT_CEILING


def test_a_scope_value_too_long_to_key_a_bucket_is_dead_lettered() -> None:
    long_merchant = "m" * 600 + "é" * 300  # 1,200 bytes in UTF-8
    dead, ok = run(
        pay("p1", "10.00", merchant_id=long_merchant),
        pay("p2", "10.00", merchant_id="m" * 900),  # ASCII: 900 bytes, still fits
    )
    assert dead == ("dead", "invalid_event")
    assert ok["decision"] == "accept"


class _Contended(MemoryStore):
    """A store where another writer wins the first ``conflicts`` commits."""

    def __init__(self, conflicts: int) -> None:
        super().__init__()
        self.left = conflicts

    async def _write(self, writes: Writes, expected: Expected) -> None:
        if self.left:
            self.left -= 1
            raise ConflictError("another writer won")
        await super()._write(writes, expected)


def test_conflicts_are_retried_and_the_batch_decided_as_if_there_were_none() -> None:
    store = _Contended(conflicts=3)
    engine = Engine(Decider(parse_rules(RULES)), store, max_conflict_retries=3)
    lines = [pay("e1", "10.00"), pay("e2", "20.00")]
    results = asyncio.run(engine.process([Record(x.encode(), {"line": 1}) for x in lines]))
    assert [r.kind for r in results] == [OutcomeKind.VERDICT, OutcomeKind.VERDICT]
    assert engine.stats.conflicts == 3
    assert [json.loads(r.verdict or b"")["seq"] for r in results] == [1, 2]


def test_giving_up_on_conflicts_says_so() -> None:
    engine = Engine(Decider(parse_rules(RULES)), _Contended(conflicts=9), max_conflict_retries=2)
    with pytest.raises(ConflictError, match="3 conflicts in a row: other writers kept changing"):
        asyncio.run(engine.process([Record(pay("e1", "10.00").encode(), {"line": 1})]))


class _Shared(MemoryStore):
    """A store committing at most ``max_records_per_commit`` records at once, as DynamoDB
    (100), where another writer wins every other commit."""

    max_records_per_commit = 8

    def __init__(self) -> None:
        super().__init__()
        self.writes = 0

    async def _write(self, writes: Writes, expected: Expected) -> None:
        self.writes += 1
        if self.writes % 2:
            raise ConflictError("another writer won")
        await super()._write(writes, expected)


def test_a_batch_that_commits_unit_after_unit_between_conflicts_is_not_given_up() -> None:
    # a batch of many commit units (DynamoDB's 100 records: a `run` batch of 2,000 events
    # is ~40) on a bucket other members share: each unit lost once and then committed,
    # which is progress, not the same conflict "in a row"; the batch was failed (the
    # consumer paused and reported an outage) once the conflicts of all its units passed
    # ``max_conflict_retries``
    store = _Shared()
    engine = Engine(Decider(parse_rules(RULES)), store, max_conflict_retries=2)
    lines = [pay(f"e{n}", "1.00", account_id=f"a{n}", merchant_id="m") for n in range(8)]
    results = asyncio.run(engine.process([Record(x.encode(), {"line": 1}) for x in lines]))
    assert [r.decision for r in results] == ["accept"] * 8
    assert engine.stats.commits > engine.max_conflict_retries + 1
    assert engine.stats.conflicts == engine.stats.commits


def test_scope_values_with_separators_keep_their_buckets_apart() -> None:
    store = MemoryStore()
    run(
        pay("p1", "1.00", merchant_id="m|1", card_id="c|d", at="2026-03-14T10:00:00Z"),
        pay("p2", "2.00", merchant_id="m\\|1", card_id="c", at="2026-03-14T10:00:00Z"),
        pay("p3", "3.00", merchant_id="d", card_id="c|d|x", at="2026-03-14T10:00:00Z"),
        store=store,
    )
    buckets = {key: store.bucket(key) for key in store.data.buckets if "day" not in key}
    assert {key: (b.count, b.amount) for key, b in buckets.items() if b is not None} == {
        "merchant|2026-03-14T10|m\\|1": (1, 100),
        "merchant|2026-03-14T10|m\\\\\\|1": (1, 200),
        "merchant|2026-03-14T10|d": (1, 300),
        "card-month|2026-03|c\\|d|m\\|1": (1, 100),
        "card-month|2026-03|c|m\\\\\\|1": (1, 200),
        "card-month|2026-03|c\\|d\\|x|d": (1, 300),
    }


def test_a_duplicate_carries_its_original_reason_for_the_metrics() -> None:
    engine = Engine(Decider(parse_rules(RULES)), MemoryStore())
    lines = [
        pay("big", "500.00"),
        reverse("r1", "nope"),
        pay("big", "500.00"),
        reverse("r1", "nope"),
    ]
    results = asyncio.run(
        engine.process([Record(line.encode(), {"line": n}) for n, line in enumerate(lines, 1)])
    )
    assert [(r.kind.value, str(r.reason)) for r in results] == [
        ("verdict", "limit_exceeded"),
        ("verdict", "original_not_found"),
        ("duplicate", "limit_exceeded"),
        ("duplicate", "original_not_found"),
    ]


@pytest.mark.parametrize("stage", ["reading", "planning"])
def test_a_record_that_reading_fails_on_unexpectedly_is_a_dead_letter_not_a_crash(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, stage: str
) -> None:
    # a defect in reading one record (a number out of Decimal's range once raised
    # InvalidOperation here) stopped replay, and `run` on every retry of its batch: the
    # record is dead-lettered with its bytes, the rest of the batch decided. Likewise a
    # defect in finding the rules that apply to it, which failed the whole batch.
    from schemas.events import parse_event as real

    def flawed(raw: bytes | str) -> Any:
        if b"poison" in (raw if isinstance(raw, bytes) else raw.encode()):
            raise ArithmeticError("a reader's defect")
        return real(raw)

    decider = Decider(parse_rules(RULES))
    real_plan = decider.plan

    def flawed_plan(event: Any) -> Any:
        if event.event_id == "poison":
            raise ArithmeticError("a reader's defect")
        return real_plan(event)

    if stage == "reading":
        monkeypatch.setattr("streams.engine.parse_event", flawed)
    else:
        monkeypatch.setattr(decider, "plan", flawed_plan)
    engine = Engine(decider, MemoryStore())
    lines = [pay("e1", "10.00"), pay("poison", "10.00"), pay("e2", "20.00")]
    with caplog.at_level("ERROR", logger="limitflow.engine"):
        results = asyncio.run(
            engine.process([Record(x.encode(), {"line": n}) for n, x in enumerate(lines, 1)])
        )
    assert [r.kind for r in results] == [
        OutcomeKind.VERDICT,
        OutcomeKind.DEAD_LETTER,
        OutcomeKind.VERDICT,
    ]
    dead = results[1]
    assert dead.error is not None and dead.error.value == "invalid_event"
    assert dead.detail == (
        "could not be read: ArithmeticError: a reader's defect"
        " (unexpected: a defect of limitflow, logged)"
    )
    assert dead.record.raw == lines[1].encode()
    assert [json.loads(r.verdict or b"")["seq"] for r in (results[0], results[2])] == [1, 2]
    assert "a record could not be read: {'line': 2}" in caplog.text
    assert "ArithmeticError" in caplog.text  # with its traceback


def test_running_out_of_memory_while_reading_is_not_a_dead_letter(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # the machine's state, not the record's: the batch fails, to be retried
    def exhausted(raw: bytes | str) -> Any:
        raise MemoryError

    monkeypatch.setattr("streams.engine.parse_event", exhausted)
    engine = Engine(Decider(parse_rules(RULES)), MemoryStore())
    with pytest.raises(MemoryError):
        asyncio.run(engine.process([Record(pay("e1", "10.00").encode(), {"line": 1})]))


def test_a_batch_most_of_which_reading_fails_on_unexpectedly_fails_instead(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # a defect every record meets is not bad input: dead-lettering them all would commit
    # their offsets with none decided; the batch fails, uncommitted, and nothing is lost
    def broken(raw: bytes | str) -> Any:
        raise ArithmeticError("a reader's defect")

    monkeypatch.setattr("streams.engine.parse_event", broken)
    store = MemoryStore()
    engine = Engine(Decider(parse_rules(RULES)), store)
    lines = [pay(f"e{n}", "10.00") for n in range(12)]
    with pytest.raises(RuntimeError, match="12 of 12 records could not be read") as caught:
        asyncio.run(engine.process([Record(x.encode(), {"line": 1}) for x in lines]))
    assert isinstance(caught.value.__cause__, ArithmeticError)
    assert not store.data.events


class _Reads:
    """A memory store whose reads are noted (the bucket keys of each)."""

    def __init__(self) -> None:
        self.inner = MemoryStore()
        self.buckets: list[set[str]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def load(self, keys: Any) -> Any:
        self.buckets.append(set(keys.buckets))
        return await self.inner.load(keys)


def test_an_event_too_many_rules_apply_to_is_dead_lettered_without_reading_its_buckets() -> None:
    # each of its buckets was read from the store first: with 1,000 rules applying to
    # every event (a rules change gone wide), a replay dead-lettered ~400 events a second
    many = "rules:\n" + "".join(
        f"  - {{id: r{n}, scope: merchant_id, window: day, max_count: 5}}\n" for n in range(201)
    )
    store = _Reads()
    first = Engine(Decider(parse_rules(RULES)), store)  # type: ignore[arg-type]
    decided = asyncio.run(first.process([Record(pay("p1", "10.00", merchant_id="m").encode(), {})]))
    assert decided[0].kind is OutcomeKind.VERDICT
    wide = Engine(Decider(parse_rules(many)), store)  # type: ignore[arg-type]
    store.buckets.clear()
    lines = [pay("p2", "10.00", merchant_id="m"), pay("p1", "10.00", merchant_id="m")]
    dead, duplicate = asyncio.run(
        wide.process([Record(line.encode(), {"line": n}) for n, line in enumerate(lines)])
    )
    assert (dead.kind, dead.error) == (OutcomeKind.DEAD_LETTER, "invalid_event")
    assert "201 rules apply to this event; at most 200" in (dead.detail or "")
    # decided before the rules grew: still its verdict, as its own record says
    assert (duplicate.kind, duplicate.verdict) == (OutcomeKind.DUPLICATE, decided[0].verdict)
    assert store.buckets == [set()]


def test_a_resend_gets_its_verdict_after_a_rule_came_to_refuse_its_fields() -> None:
    # a rule scoping by a field the event sends as an object, added since it was decided:
    # its redelivery (at least once) was dead-lettered, its verdict published already,
    # so that one input record reached both outputs
    store = MemoryStore()
    before = "rules:\n  - {id: day, window: day, max_count: 5}\n"
    after = before + "  - {id: by-shop, scope: shop, window: day, max_count: 5}\n"
    line = pay("p1", "10.00", shop={"name": "x"})
    decided = asyncio.run(
        Engine(Decider(parse_rules(before)), store).process([Record(line.encode(), {})])
    )
    assert decided[0].kind is OutcomeKind.VERDICT
    lines = [pay("p2", "10.00", shop={"name": "x"}), line, pay("p1", "11.00", shop={"name": "x"})]
    dead, duplicate, conflict = asyncio.run(
        Engine(Decider(parse_rules(after)), store).process(
            [Record(x.encode(), {"line": n}) for n, x in enumerate(lines)]
        )
    )
    assert (dead.kind, dead.error) == (OutcomeKind.DEAD_LETTER, "invalid_event")
    assert dead.event_id == "p2"
    assert "shop: a rule scopes by this field" in (dead.detail or "")
    assert (duplicate.kind, duplicate.verdict) == (OutcomeKind.DUPLICATE, decided[0].verdict)
    assert (conflict.kind, conflict.error) == (OutcomeKind.DEAD_LETTER, "idempotency_conflict")
