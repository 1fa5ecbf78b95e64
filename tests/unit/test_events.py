"""Event parsing as the contract states it: every field rule and every dead-letter code."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from schemas import events as parsing
from schemas.events import (
    DeadLetterError,
    Event,
    EventRejected,
    EventType,
    decode_json,
    members,
    parse_event,
)

_DROP = object()
"""Marks a field to leave out of the event."""


def payment(**changes: Any) -> dict[str, Any]:
    """A valid payment, with fields replaced (or dropped with ``_DROP``)."""
    doc: dict[str, Any] = {
        "event_id": "evt-1",
        "account_id": "acct-1",
        "amount": "10.50",
        "currency": "CNY",
        "occurred_at": "2026-01-31T23:59:00Z",
    }
    doc.update(changes)
    return {key: value for key, value in doc.items() if value is not _DROP}


def reversal(**changes: Any) -> dict[str, Any]:
    """A valid reversal of ``evt-1`` without amount or currency."""
    return payment(
        **{
            "event_id": "rev-1",
            "type": "reversal",
            "original_event_id": "evt-1",
            "amount": _DROP,
            "currency": _DROP,
            **changes,
        }
    )


def parse(doc: dict[str, Any]) -> Event:
    return parse_event(json.dumps(doc))


def refused(raw: dict[str, Any] | str | bytes) -> EventRejected:
    """The rejection of ``raw``; fails the test if it parses."""
    text = json.dumps(raw) if isinstance(raw, dict) else raw
    with pytest.raises(EventRejected) as caught:
        parse_event(text)
    return caught.value


def with_amount_literal(literal: str, currency: str = "CNY") -> str:
    """A payment line whose amount is written exactly as ``literal`` (a JSON number)."""
    return (
        f'{{"event_id": "evt-1", "account_id": "acct-1", "amount": {literal}, '
        f'"currency": "{currency}", "occurred_at": "2026-01-31T23:59:00Z"}}'
    )


# --- a valid payment ---------------------------------------------------------------------


def test_a_valid_payment_parses_into_exact_values() -> None:
    event = parse(payment(card_id="card-7", channel="atm", mcc=6011))
    assert event.event_id == "evt-1"
    assert event.account_id == "acct-1"
    assert event.type is EventType.PAYMENT
    assert event.amount == 1050
    assert event.amount_decimal is None
    assert event.currency == "CNY"
    assert event.occurred_at == "2026-01-31T23:59:00Z"
    assert event.epoch == 1_769_903_940
    assert event.original_event_id is None


def test_extra_fields_are_kept_with_their_values() -> None:
    event = parse(payment(card_id="card-7", channel="atm", mcc=6011, tags=["a"], geo={"cc": "CN"}))
    assert event.fields["card_id"] == "card-7"
    assert event.fields["channel"] == "atm"
    assert event.fields["mcc"] == 6011
    assert event.fields["tags"] == ["a"]
    assert event.fields["geo"] == {"cc": "CN"}


def test_bytes_and_text_parse_alike() -> None:
    line = json.dumps(payment())
    assert parse_event(line.encode()) == parse_event(line)


# --- event_id and account_id -------------------------------------------------------------


@pytest.mark.parametrize("field", ["event_id", "account_id"])
@pytest.mark.parametrize("value", ["x", "x" * 128, "账户-1", "a b|c"])
def test_ids_of_1_to_128_characters_are_accepted(field: str, value: str) -> None:
    event = parse(payment(**{field: value}))
    assert getattr(event, field) == value


@pytest.mark.parametrize("field", ["event_id", "account_id"])
@pytest.mark.parametrize("value", ["", "x" * 129, 5, True, ["evt"], {"id": 1}])
def test_ids_that_are_empty_too_long_or_not_strings_are_invalid(field: str, value: Any) -> None:
    error = refused(payment(**{field: value}))
    assert error.error is DeadLetterError.INVALID_EVENT
    assert error.detail == f"{field}: must be a string of 1 to 128 characters"


@pytest.mark.parametrize("field", ["event_id", "account_id"])
@pytest.mark.parametrize("value", [_DROP, None])
def test_missing_ids_are_invalid(field: str, value: Any) -> None:
    error = refused(payment(**{field: value}))
    assert error.error is DeadLetterError.INVALID_EVENT
    assert error.detail == f"{field}: is required"


# --- type ----------------------------------------------------------------------------------


def test_type_defaults_to_payment() -> None:
    assert parse(payment()).type is EventType.PAYMENT
    assert parse(payment(type="payment")).type is EventType.PAYMENT


@pytest.mark.parametrize("value", ["refund", "PAYMENT", "Reversal", "", None, 1])
def test_an_unknown_type_is_invalid(value: Any) -> None:
    error = refused(payment(type=value))
    assert error.error is DeadLetterError.INVALID_EVENT
    assert error.detail.startswith("type: must be 'payment' or 'reversal'")


# --- amount --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("currency", "amount", "minor"),
    [
        ("CNY", "10.50", 1050),
        ("CNY", "10.5", 1050),
        ("CNY", "10", 1000),
        ("CNY", "0.01", 1),
        ("USD", "99.99", 9999),
        ("EUR", "1234567.89", 123456789),
        ("GBP", "0.10", 10),
        ("JPY", "1500", 1500),
        ("KWD", "1.234", 1234),
        ("KWD", "0.001", 1),
    ],
)
def test_amount_as_decimal_string_becomes_minor_units(
    currency: str, amount: str, minor: int
) -> None:
    event = parse(payment(currency=currency, amount=amount))
    assert event.amount == minor
    assert event.currency == currency


@pytest.mark.parametrize(
    ("currency", "literal", "minor"),
    [
        ("CNY", "10.5", 1050),
        ("CNY", "10.50", 1050),
        ("CNY", "10", 1000),
        ("CNY", "0.1", 10),
        ("USD", "1e2", 10000),
        ("JPY", "1500", 1500),
        ("KWD", "1.234", 1234),
    ],
)
def test_amount_as_json_number_is_exact(currency: str, literal: str, minor: int) -> None:
    # 0.1 would be 0.1000000000000000055… as a float: the literal must be kept exact
    assert parse_event(with_amount_literal(literal, currency)).amount == minor


@pytest.mark.parametrize(
    ("currency", "amount"),
    [
        ("CNY", "10.005"),
        ("USD", "0.001"),
        ("EUR", "1.999"),
        ("GBP", "5.125"),
        ("JPY", "100.5"),
        ("JPY", "0.1"),
        ("KWD", "1.2345"),
    ],
)
def test_more_fraction_digits_than_the_currency_allows_is_invalid(
    currency: str, amount: str
) -> None:
    error = refused(payment(currency=currency, amount=amount))
    assert error.error is DeadLetterError.INVALID_EVENT
    assert error.detail.startswith("amount: ")
    assert "fraction digit" in error.detail


@pytest.mark.parametrize(
    "amount",
    [
        "1.0000000000000000000000000001",
        "1.0000000000000000000000000000001",
        "99.99999999999999999999999999999",
        "1." + "0" * 100 + "1",
    ],
)
def test_a_nonzero_digit_far_past_the_minor_unit_is_not_rounded_away(amount: str) -> None:
    # Decimal arithmetic keeps 28 significant digits: these passed as 1.00 and 100.00
    for text in (payment(amount=amount), with_amount_literal(amount, "CNY")):
        error = refused(text)
        assert error.error is DeadLetterError.INVALID_EVENT
        assert "fraction digit" in error.detail


def test_zeros_far_past_the_minor_unit_are_read_without_building_a_huge_int() -> None:
    # int() of a string refuses over 4,300 digits: a ValueError escaped parse_event and
    # stopped the consumer on this record after every restart
    amount = "1." + "0" * 5_000
    assert parse(payment(amount=amount)).amount == 100
    assert parse_event(with_amount_literal(amount, "CNY")).amount == 100
    error = refused(payment(amount=amount + "1"))
    assert "fraction digit" in error.detail


@pytest.mark.parametrize("amount", ["0e999999999999", "0.0e999999999999", "0E+999999999999"])
def test_a_zero_with_a_huge_exponent_is_refused_without_building_a_huge_int(amount: str) -> None:
    # to_minor built 10**exponent before looking at the sign: one such amount (a string,
    # or a JSON number) held the consumer at 100% CPU on this record, after every restart
    for raw in (json.dumps(payment(amount=amount)), with_amount_literal(amount, "CNY")):
        error = refused(raw)
        assert error.error is DeadLetterError.INVALID_EVENT
        assert "must be > 0" in error.detail


def test_a_reversal_amount_past_28_digits_is_not_the_rounded_amount() -> None:
    # not read as 1 (Decimal rounds to 28 digits): finer than any currency, refused
    error = refused(reversal(amount="1.0000000000000000000000000000001"))
    assert error.detail.endswith("has more fraction digits than any currency allows")
    short = parse(reversal(amount="1"))
    assert parse(reversal(amount="1.000")).fingerprint == short.fingerprint
    assert parse(reversal(amount="1.0001")).fingerprint != short.fingerprint


@pytest.mark.parametrize(("currency", "literal"), [("CNY", "10.005"), ("JPY", "100.5")])
def test_json_numbers_with_too_many_fraction_digits_are_invalid(
    currency: str, literal: str
) -> None:
    error = refused(with_amount_literal(literal, currency))
    assert error.error is DeadLetterError.INVALID_EVENT
    assert "fraction digit" in error.detail


@pytest.mark.parametrize(
    ("currency", "amount", "minor"),
    [("CNY", "10.500", 1050), ("CNY", "10.5000000", 1050), ("JPY", "100.0", 100)],
)
def test_trailing_zeros_are_judged_by_value(currency: str, amount: str, minor: int) -> None:
    # The contract says "no more fraction digits than the minor unit"; the implementation
    # reads that by value: "10.500" CNY has a zero third digit and is 1050 fen.
    assert parse(payment(currency=currency, amount=amount)).amount == minor


def test_trailing_zeros_in_a_json_number_are_judged_by_value() -> None:
    assert parse_event(with_amount_literal("10.500")).amount == 1050


@pytest.mark.parametrize(
    "amount",
    [
        *("0", "0.00", "-1.00", "-0.01", 0, -5, "NaN", "Infinity", "", "ten", True, False),
        *([1], {}, "1_000", "\uff11\uff12", "\u0661", "0x10", "1e-999999999"),
    ],
)
def test_amounts_that_are_not_positive_decimals_are_invalid(amount: Any) -> None:
    error = refused(payment(amount=amount))
    assert error.error is DeadLetterError.INVALID_EVENT
    assert error.detail.startswith("amount: ")


@pytest.mark.parametrize("literal", ["0", "0.0", "-1", "-0.5"])
def test_json_numbers_that_are_not_positive_are_invalid(literal: str) -> None:
    error = refused(with_amount_literal(literal))
    assert error.error is DeadLetterError.INVALID_EVENT
    assert error.detail.startswith("amount: ")


@pytest.mark.parametrize("value", [_DROP, None])
def test_a_payment_needs_an_amount(value: Any) -> None:
    error = refused(payment(amount=value))
    assert error.error is DeadLetterError.INVALID_EVENT
    assert error.detail == "amount: is required"


# --- currency ------------------------------------------------------------------------------


@pytest.mark.parametrize("value", [_DROP, None])
def test_a_payment_needs_a_currency(value: Any) -> None:
    error = refused(payment(currency=value))
    assert error.error is DeadLetterError.INVALID_EVENT
    assert error.detail == "currency: is required"


@pytest.mark.parametrize("value", ["XYZ", "cny", "RMB", "US", "USDD", "", 156, ["CNY"]])
def test_a_currency_that_is_not_iso_4217_is_invalid(value: Any) -> None:
    error = refused(payment(currency=value))
    assert error.error is DeadLetterError.INVALID_EVENT
    assert error.detail == f"currency: {value!r} is not an ISO 4217 code"


@pytest.mark.parametrize("currency", ["CNY", "USD", "EUR", "GBP", "JPY", "KWD", "CHF", "BHD"])
def test_iso_4217_currencies_are_accepted(currency: str) -> None:
    assert parse(payment(currency=currency, amount="7")).currency == currency


# --- occurred_at ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "epoch"),
    [
        ("2026-01-31T23:59:00Z", 1_769_903_940),
        ("2026-02-01T07:59:00+08:00", 1_769_903_940),
        ("2026-01-31T18:59:00-05:00", 1_769_903_940),
        ("2026-01-31T23:59:00+00:00", 1_769_903_940),
        ("2026-01-31T23:59:00-00:00", 1_769_903_940),
        ("2026-01-31T23:59:00.999Z", 1_769_903_940),
        ("2026-01-31T23:59:00.123456Z", 1_769_903_940),
        ("2026-02-01T05:29:00+05:30", 1_769_903_940),
        ("1970-01-01T00:00:00Z", 0),
        ("1969-12-31T23:59:59.5Z", -1),
    ],
)
def test_rfc3339_with_offset_or_z_gives_the_instant(text: str, epoch: int) -> None:
    event = parse(payment(occurred_at=text))
    assert event.epoch == epoch
    assert event.occurred_at == text


@pytest.mark.parametrize(
    "text", ["2026-01-31t23:59:00Z", "2026-01-31T23:59:00z", "2026-01-31t23:59:00.5z"]
)
def test_lower_case_t_and_z_are_rfc3339_too(text: str) -> None:
    # RFC 3339 section 5.6: "T" and "Z" may alternatively be lower case
    assert parse(payment(occurred_at=text)).epoch == 1_769_903_940


@pytest.mark.parametrize(
    "text", ["2026-01-31T23:59:00", "2026-01-31T23:59:00.000", "2026-01-31 23:59:00"]
)
def test_a_naive_time_is_invalid(text: str) -> None:
    error = refused(payment(occurred_at=text))
    assert error.error is DeadLetterError.INVALID_EVENT
    assert error.detail == f"occurred_at: {text!r} has no UTC offset (use Z or +HH:MM)"


@pytest.mark.parametrize(
    "text",
    [
        "2026-01-31",
        "2026-01-31Z",
        "2026-01",
        "23:59:00Z",
        "2026-02-30T12:00:00Z",
        "2026-01-31T25:00:00Z",
        "2026-01-31T23:60:00Z",
        "31/01/2026 23:59:00 +08:00",
        "yesterday",
        "",
        # ISO 8601 forms that Python's fromisoformat takes but RFC 3339 does not
        "2026-W05-6T23:59:00Z",
        "2026-031T23:59:00Z",
        "2026-01-31T23:59Z",
        "2026-01-31T23:59:00+0800",
        "2026-01-31T23:59:00+08",
        "2026-01-31T23:59:00.Z",
        "2026-01-31T23:59:00,5Z",
        "20260131T235900Z",
        "\uff12\uff10\uff12\uff16-01-31T23:59:00Z",
        "2026-01-31T23:59:00" + "0" * 100 + "Z",
        # second 60 exists only as a leap second, at 23:59:60 UTC
        "2026-01-31T12:30:60Z",
        "2016-12-31T23:59:60+08:00",
        "2016-12-31T23:58:60Z",
        "2016-12-30T23:59:60Z",  # not the last day of a month
        # RFC 3339 offsets run to 23:59; Python 3.11's fromisoformat reads +08:60 as
        # +09:00 and +08:99 as +09:39
        "2026-01-01T00:00:00+08:60",
        "2026-01-01T00:00:00+08:99",
        "2026-01-01T00:00:00-00:75",
        "2026-01-01T00:00:00+24:00",
        "2026-01-01T00:00:00-99:00",
    ],
)
def test_dates_and_malformed_times_are_invalid(text: str) -> None:
    error = refused(payment(occurred_at=text))
    assert error.error is DeadLetterError.INVALID_EVENT
    assert error.detail == f"occurred_at: {text!r} is not an RFC 3339 date-time"


@pytest.mark.parametrize(
    "text", ["2016-12-31T23:59:60Z", "2016-12-31T23:59:60.25Z", "2017-01-01T07:59:60+08:00"]
)
def test_a_leap_second_is_the_last_instant_of_its_minute(text: str) -> None:
    # RFC 3339 allows second 60; Python's datetime has none, so it refused the event
    event = parse(payment(occurred_at=text))
    last = parse(payment(occurred_at="2016-12-31T23:59:59.999999Z"))
    assert event.occurred_at == text
    assert event.epoch == last.epoch
    assert event.fingerprint == parse(payment(occurred_at="2016-12-31T23:59:60Z")).fingerprint


def test_times_compare_as_instants_to_the_microsecond() -> None:
    def fingerprints(*times: str) -> set[str]:
        return {parse(payment(occurred_at=t)).fingerprint for t in times}

    same = ("2026-01-01T08:00:00.123456+08:00", "2026-01-01T00:00:00.1234560Z")
    assert len(fingerprints(*same, "2025-12-31T23:00:00.123456-01:00")) == 1
    assert len(fingerprints("2026-01-01T00:00:00.123456Z", "2026-01-01T00:00:00.123457Z")) == 2


@pytest.mark.parametrize(
    ("first", "second"),
    [("6011", "6011.0"), ("6011", "6.011e3"), ("100", "1E2"), ("0.5", "0.50"), ("-0", "0.0")],
)
def test_numbers_in_extra_fields_compare_by_value(first: str, second: str) -> None:
    def extra(literal: str) -> str:
        text = json.dumps(payment())
        return text[:-1] + f', "mcc": {literal}, "nested": {{"a": [{literal}]}}}}'

    assert parse_event(extra(first)).fingerprint == parse_event(extra(second)).fingerprint
    assert parse_event(extra(first)).fingerprint != parse_event(extra("7")).fingerprint
    # a string stays text
    assert parse(payment(mcc="6011")).fingerprint != parse_event(extra("6011")).fingerprint


def test_a_payload_stored_before_numbers_compared_by_value_is_still_a_duplicate() -> None:
    import hashlib

    from schemas.events import _fingerprint_encoder

    raw = json.dumps(payment())[:-1] + ', "mcc": 6011.0}'
    event = parse_event(raw)
    doc = json.loads(raw, parse_float=Decimal)
    extras = {"mcc": doc["mcc"]}
    head = (doc["event_id"], "payment", doc["account_id"], 1050, "CNY")
    old = (*head, event.epoch * 1_000_000, None, extras)  # as the fingerprint was made
    assert event.legacy_fingerprint == (
        hashlib.blake2b(_fingerprint_encoder.encode(old), digest_size=16).hexdigest()
    )
    assert event.fingerprint != event.legacy_fingerprint
    assert parse(payment()).legacy_fingerprint is None  # nothing to tell apart: no second hash


@pytest.mark.parametrize("value", [_DROP, None, 1_769_903_940, ["2026-01-31T23:59:00Z"]])
def test_occurred_at_must_be_a_string(value: Any) -> None:
    error = refused(payment(occurred_at=value))
    assert error.error is DeadLetterError.INVALID_EVENT
    assert error.detail == "occurred_at: is required, as a string"


@pytest.mark.parametrize(
    "text",
    [
        "9999-12-31T23:59:59-12:00",  # 10000-01-01 in UTC
        "9999-12-31T12:00:00Z",  # 10000-01-01 in Pacific/Kiritimati
        "0001-01-01T00:00:00Z",  # year 0 in America/New_York
        "0001-01-01T10:00:00+14:00",  # year 0 in UTC
    ],
)
def test_instants_whose_calendar_date_may_leave_years_1_to_9999_are_invalid(text: str) -> None:
    # Without this, computing the period of such an instant in some zone overflows and
    # stops the whole replay instead of dead-lettering one event.
    error = refused(payment(occurred_at=text))
    assert error.error is DeadLetterError.INVALID_EVENT
    assert error.detail.startswith(f"occurred_at: {text!r} ")


@pytest.mark.parametrize(
    "text", ["9999-12-31T23:59:60Z", "9999-12-31T22:59:60-01:00", "0001-01-01T00:59:60+01:00"]
)
def test_a_leap_second_at_an_end_of_the_calendar_is_outside_it(text: str) -> None:
    # checking that a leap second ends its month (UTC) took the second after it, past
    # Python's calendar: OverflowError, an unexpected error that failed a batch of them
    error = refused(payment(occurred_at=text))
    assert error.error is DeadLetterError.INVALID_EVENT
    assert error.detail == f"occurred_at: {text!r} is outside 0001-01-02 to 9999-12-30 UTC"


@pytest.mark.parametrize("text", ["0001-01-02T00:00:00Z", "9999-12-30T23:59:59Z"])
def test_instants_near_the_ends_of_the_calendar_are_valid(text: str) -> None:
    parse(payment(occurred_at=text))


# --- reversals -----------------------------------------------------------------------------


def test_a_reversal_needs_no_amount_or_currency() -> None:
    event = parse(reversal())
    assert event.type is EventType.REVERSAL
    assert event.original_event_id == "evt-1"
    assert event.amount is None
    assert event.amount_decimal is None
    assert event.currency is None


def test_a_reversal_with_amount_and_currency_is_in_minor_units() -> None:
    event = parse(reversal(amount="3.25", currency="USD"))
    assert event.amount == 325
    assert event.currency == "USD"


def test_a_reversal_amount_without_currency_is_kept_as_a_decimal() -> None:
    # its currency is the original's, known only when the original is looked up
    event = parse(reversal(amount="3.250"))
    assert event.amount is None
    assert event.amount_decimal == Decimal("3.25")


@pytest.mark.parametrize("amount", ["0.00001", "1E-9", 1e-5])
def test_a_reversal_amount_without_currency_finer_than_any_currency_is_refused(
    amount: Any,
) -> None:
    error = refused(reversal(amount=amount))
    assert error.error is DeadLetterError.INVALID_EVENT
    assert error.detail.startswith("amount: ")
    assert error.detail.endswith(" has more fraction digits than any currency allows")


def test_a_reversal_amount_without_currency_is_written_plain() -> None:
    assert str(parse(reversal(amount="1e3")).amount_decimal) == "1000"
    assert str(parse(reversal(amount="0.00010")).amount_decimal) == "0.00010"


@pytest.mark.parametrize("value", [_DROP, None])
def test_a_reversal_needs_original_event_id(value: Any) -> None:
    error = refused(reversal(original_event_id=value))
    assert error.error is DeadLetterError.INVALID_EVENT
    assert error.detail == "original_event_id: is required"


@pytest.mark.parametrize("value", ["", "x" * 129, 7, [1]])
@pytest.mark.parametrize("make", [reversal, payment])
def test_original_event_id_follows_the_id_rules(make: Any, value: Any) -> None:
    # on a payment too, where it is not used: the event schema says what it may be
    error = refused(make(original_event_id=value))
    assert error.error is DeadLetterError.INVALID_EVENT
    assert error.detail == "original_event_id: must be a string of 1 to 128 characters"


@pytest.mark.parametrize("value", [None, "p0"])
def test_a_payment_may_carry_a_null_or_valid_original_event_id(value: Any) -> None:
    assert parse(payment(original_event_id=value)).original_event_id is None


@pytest.mark.parametrize(
    "literal", ["1e999999999", "-1e999999999", "1e-999999999", "123456789012345678901234567890"]
)
def test_a_reversal_amount_without_currency_is_bounded_like_any(literal: str) -> None:
    # kept as a Decimal until the original's currency is known; 1e999999999 made the
    # fingerprint's normalize() raise decimal.Overflow, which stopped the replay
    text = json.dumps(reversal())[:-1] + f', "amount": {literal}}}'
    error = refused(text)
    assert error.error is DeadLetterError.INVALID_EVENT
    assert error.detail.startswith("amount: ")


@pytest.mark.parametrize("amount", ["0", "-1", "abc"])
def test_a_reversal_amount_must_be_positive(amount: str) -> None:
    error = refused(reversal(amount=amount))
    assert error.error is DeadLetterError.INVALID_EVENT
    assert error.detail.startswith("amount: ")


def test_a_reversal_amount_follows_the_currency_minor_unit() -> None:
    error = refused(reversal(amount="1.005", currency="USD"))
    assert "fraction digit" in error.detail


def test_a_reversal_still_needs_an_offset_time() -> None:
    error = refused(reversal(occurred_at="2026-01-31T23:59:00"))
    assert error.error is DeadLetterError.INVALID_EVENT


# --- dead-letter codes ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "raw",
    [
        "this is not json",
        "{bad",
        '{"event_id": "evt-1",}',
        "{} {}",
        b"\xff\xfe{}",
        b'{"event_id": "\xff\xfe", "account_id": "acct-1"}',
        b'{"event_id": "caf\xe9"}',  # Latin-1, not UTF-8
    ],
)
def test_malformed_json_and_non_utf8_bytes_are_invalid_json(raw: str | bytes) -> None:
    error = refused(raw)
    assert error.error is DeadLetterError.INVALID_JSON
    assert error.detail.startswith("not valid JSON")


def test_a_byte_that_is_not_utf8_is_placed_in_the_record_not_its_string() -> None:
    # the decoder gave the offset within the string it was reading: "position 3" for a
    # byte 109 bytes into the record
    raw = json.dumps(payment(merchant="caf")).encode()[:-2] + b'\xe9"}'
    error = refused(raw)
    offset = raw.index(b"\xe9")
    assert error.detail == (
        f"not valid JSON: not UTF-8: byte 0xe9 at offset {offset} (invalid continuation byte)"
    )


@pytest.mark.parametrize(
    ("escape", "named"),
    [("\\ud800", "\\ud800"), ("\\ud83d\\ude00\\uDBFF", "\\uDBFF")],
)
def test_half_a_surrogate_pair_is_named_not_called_truncated(escape: str, named: str) -> None:
    error = refused(json.dumps(payment())[:-1] + f', "x": "{escape}"}}')
    assert error.error is DeadLetterError.INVALID_JSON
    assert error.detail == f"not valid JSON: {named} is half a surrogate pair, not a character"


@pytest.mark.parametrize("text", ["\\ud83d\\ude00", "\\\\ud800"])
def test_a_truncated_record_without_half_a_pair_is_called_truncated(text: str) -> None:
    # a whole pair, or an escaped backslash followed by the letters ud800
    error = refused(json.dumps(payment())[:-1] + f', "x": "{text}"')
    assert error.detail == "not valid JSON: Input data was truncated"


@pytest.mark.parametrize("raw", ["", b"", " \n"])
def test_an_empty_record_says_it_is_empty(raw: str | bytes) -> None:
    # a null Kafka value reads as empty; "Input data was truncated" said nothing useful
    error = refused(raw)
    assert error.error is DeadLetterError.INVALID_JSON
    assert error.detail == "empty record: no JSON document"


def _nested(depth: int, kind: str) -> str:
    return "[" * depth + "]" * depth if kind == "array" else '{"a":' * depth + "1" + "}" * depth


@pytest.mark.parametrize("kind", ["array", "object"])
def test_extra_fields_may_nest_32_levels_and_no_deeper(kind: str) -> None:
    base = json.dumps(payment())[:-1]
    assert parse_event(f'{base}, "x": {_nested(32, kind)}}}').fields["x"]
    error = refused(f'{base}, "x": {_nested(33, kind)}}}')
    assert error.error is DeadLetterError.INVALID_EVENT
    assert error.detail == "x: nested more than 32 levels deep"


@pytest.mark.parametrize("depth", [900, 5_000, 100_000])
def test_a_record_nested_too_deeply_to_decode_is_a_dead_letter_not_a_crash(depth: int) -> None:
    # the decoder recurses: past Python's recursion limit it raised RecursionError,
    # which stopped replay and would stop `run` on the same record after every restart
    base = json.dumps(payment())[:-1]
    for kind in ("array", "object"):
        error = refused(f'{base}, "x": {_nested(depth, kind)}}}')
        assert error.error in (DeadLetterError.INVALID_JSON, DeadLetterError.INVALID_EVENT)


def _called_from_deeper(frames: int, call: Callable[[], None]) -> None:
    if frames:
        _called_from_deeper(frames - 1, call)
    else:
        call()


@pytest.mark.parametrize("field", ["type", "currency", "x"])
@pytest.mark.parametrize("twice", [False, True], ids=["once", "a-member-twice"])
def test_a_record_nested_just_within_the_decoder_s_reach_is_a_dead_letter(
    field: str, twice: bool
) -> None:
    # The decoder takes a nesting depth that a few more frames of Python cannot: naming
    # the member given twice (the json module's reader) and showing a deep ``type`` in
    # the detail raised RecursionError, an unexpected error that failed a batch of them.
    # Where that depth lies moves with the stack the record is read from: every depth
    # around it, from stacks of several heights.
    def read_all() -> None:
        for depth in range(800, 1_100):
            for kind in ("array", "object"):
                doc = payment()
                doc[field] = "@"
                text = json.dumps(doc).replace('"@"', _nested(depth, kind))
                if twice:
                    text = text[:-1] + ', "card_id": "c1", "card_id": "c2"}'
                with pytest.raises(EventRejected):
                    parse_event(text)

    for frames in (0, 40, 120):
        _called_from_deeper(frames, read_all)


@pytest.mark.parametrize(
    "number", ["1e99999999999999999999", "10e999999999999999999", "-1e-1999999999999999998"]
)
@pytest.mark.parametrize("where", ["alone", "amount", "extra field", "scope field"])
def test_a_number_no_decimal_holds_is_a_dead_letter_not_a_crash(number: str, where: str) -> None:
    # Decimal (the decoder's float_hook) raised InvalidOperation for an exponent of 10**18
    # or more: replay stopped with a traceback, and `run` would stop on the same record
    # after every restart
    base = json.dumps(payment())[:-1]
    raw = {
        "alone": number,
        "amount": base.replace('"amount": "10.50"', f'"amount": {number}') + "}",
        "extra field": f'{base}, "x": {number}}}',
        "scope field": f'{base}, "card_id": {number}}}',
    }[where]
    assert number in raw
    error = refused(raw)
    assert error.error is DeadLetterError.INVALID_JSON
    assert error.detail == (
        "not valid JSON here: a number's exponent is out of range (10^18 or more)"
    )


@pytest.mark.parametrize("where", ["alone", "amount", "extra field"])
def test_an_integer_of_more_digits_than_python_reads_says_so(where: str) -> None:
    # the dead letter said "Integer value out of range", of a number the README said
    # was valid (only an exponent of 10^18 was not)
    number = "1" * (sys.get_int_max_str_digits() + 1)
    base = json.dumps(payment())[:-1]
    raw = {
        "alone": number,
        "amount": base.replace('"amount": "10.50"', f'"amount": {number}') + "}",
        "extra field": f'{base}, "x": {number}}}',
    }[where]
    error = refused(raw)
    assert error.error is DeadLetterError.INVALID_JSON
    assert error.detail.startswith(
        f"not valid JSON here: an integer of more than {sys.get_int_max_str_digits()} digits"
    )
    # as a decimal it is read: only integers have Python's limit
    assert parse_event(f'{base}, "x": {number}.5}}'.encode()).event_id == "evt-1"


@pytest.mark.parametrize(
    ("amount", "says"),
    [
        ("1e99999999999999999999", "is too large"),
        ("1e-99999999999999999999", "more fraction digits than any currency allows"),
    ],
)
def test_an_amount_string_no_decimal_holds_is_invalid_not_a_crash(amount: str, says: str) -> None:
    for doc in (payment(amount=amount), reversal(amount=amount)):
        error = refused(doc)
        assert error.error is DeadLetterError.INVALID_EVENT
        assert error.detail.startswith(f"amount: {amount!r}")
        assert says in error.detail


@pytest.mark.parametrize("raw", ["[1, 2]", "[]", '"evt-1"', "42", "null", "true"])
def test_json_that_is_not_an_object_is_invalid_event(raw: str) -> None:
    error = refused(raw)
    assert error.error is DeadLetterError.INVALID_EVENT
    assert error.detail == "an event must be a JSON object"


def test_the_dead_letter_codes_are_the_contract_strings() -> None:
    assert [code.value for code in DeadLetterError] == [
        "invalid_json",
        "invalid_event",
        "idempotency_conflict",
    ]


# --- fingerprint ---------------------------------------------------------------------------


def test_the_fingerprint_is_a_stable_hex_digest() -> None:
    first, again = parse(payment()), parse(payment())
    assert first.fingerprint == again.fingerprint
    int(first.fingerprint, 16)


@pytest.mark.parametrize(
    ("one", "other"),
    [
        pytest.param(payment(amount="10.50"), payment(amount=10.5), id="number"),
        pytest.param(payment(amount="10.50"), payment(amount="10.5"), id="trailing-zero"),
        pytest.param(payment(amount="10"), payment(amount=10), id="integer"),
        pytest.param(
            payment(occurred_at="2026-01-31T23:59:00Z"),
            payment(occurred_at="2026-02-01T07:59:00+08:00"),
            id="offset",
        ),
        pytest.param(
            payment(occurred_at="2026-01-31T23:59:00Z"),
            payment(occurred_at="2026-01-31T23:59:00.000+00:00"),
            id="zero-fraction",
        ),
        pytest.param(payment(), payment(type="payment"), id="default-type"),
        pytest.param(
            payment(channel="atm", mcc=6011), payment(mcc=6011, channel="atm"), id="key-order"
        ),
        pytest.param(reversal(), reversal(amount=None), id="null-amount"),
    ],
)
def test_the_same_payload_written_differently_has_the_same_fingerprint(
    one: dict[str, Any], other: dict[str, Any]
) -> None:
    assert parse(one).fingerprint == parse(other).fingerprint


def test_number_and_string_amounts_agree_on_the_wire_too() -> None:
    as_number = with_amount_literal("10.5")
    as_string = json.dumps(payment(amount="10.50"))
    assert parse_event(as_number).fingerprint == parse_event(as_string).fingerprint


_EXTRAS: dict[str, Any] = {"channel": "atm", "mcc": 6011}


@pytest.mark.parametrize(
    "change",
    [
        pytest.param({"event_id": "evt-2"}, id="event_id"),
        pytest.param({"account_id": "acct-2"}, id="account_id"),
        pytest.param({"amount": "10.51"}, id="amount"),
        pytest.param({"currency": "USD"}, id="currency"),
        pytest.param({"occurred_at": "2026-01-31T23:59:01Z"}, id="instant"),
        pytest.param({"occurred_at": "2026-01-31T23:59:00+08:00"}, id="same-wall-clock"),
        pytest.param({"occurred_at": "2026-01-31T23:59:00.000001Z"}, id="microsecond"),
        pytest.param({"card_id": "card-7"}, id="extra-added"),
        pytest.param({"channel": _DROP}, id="extra-removed"),
        pytest.param({"channel": "pos"}, id="extra-value"),
        pytest.param({"mcc": "6011"}, id="extra-type"),
        pytest.param({"type": "reversal", "original_event_id": "evt-0"}, id="type"),
    ],
)
def test_any_difference_changes_the_fingerprint(change: dict[str, Any]) -> None:
    base = parse(payment(**_EXTRAS))
    other = parse(payment(**{**_EXTRAS, **change}))
    assert base.fingerprint != other.fingerprint


def test_a_reversal_of_another_original_has_another_fingerprint() -> None:
    assert parse(reversal()).fingerprint != parse(reversal(original_event_id="evt-2")).fingerprint


def test_a_reversal_amount_changes_the_fingerprint() -> None:
    fingerprints = {
        parse(reversal()).fingerprint,
        parse(reversal(amount="1.00")).fingerprint,
        parse(reversal(amount="2.00")).fingerprint,
        parse(reversal(amount="1.00", currency="CNY")).fingerprint,
    }
    assert len(fingerprints) == 4


def test_payment_resend_that_adds_original_event_id_is_not_the_same_payload() -> None:
    base = {
        "event_id": "e1",
        "account_id": "a",
        "amount": "1.00",
        "currency": "CNY",
        "occurred_at": "2026-03-14T10:00:00Z",
    }
    changed = {**base, "original_event_id": "x"}
    assert parse_event(json.dumps(base)).fingerprint != parse_event(json.dumps(changed)).fingerprint


@pytest.mark.parametrize(
    ("currency", "amount"),
    [
        ("CNY", "10000000000000.00"),  # 16 digits in minor units
        ("JPY", "1000000000000000"),
        ("KWD", "1000000000000.000"),
        ("USD", "99999999999999999999999.00"),
        ("USD", "1e999999"),
        ("USD", "1e999999999"),  # an exponent past Decimal's context: Overflow, not caught
    ],
)
def test_amounts_beyond_15_digits_in_minor_units_are_invalid(currency: str, amount: str) -> None:
    error = refused(payment(currency=currency, amount=amount))
    assert error.error is DeadLetterError.INVALID_EVENT
    assert "too large" in error.detail


def test_the_largest_amount_is_accepted() -> None:
    assert parse(payment(currency="CNY", amount="9999999999999.99")).amount == 10**15 - 1
    assert parse_event(with_amount_literal("999999999999999", "JPY")).amount == 10**15 - 1


# --- a member name given twice ---------------------------------------------------------

_BASE = (
    '"event_id": "e1", "account_id": "a", "currency": "CNY", "occurred_at": "2026-01-31T23:59:00Z"'
)


@pytest.mark.parametrize(
    ("text", "names"),
    [
        ('{"amount": "1.00", "amount": "9000.00", ' + _BASE + "}", "amount"),
        ('{"amount": "1.00", ' + _BASE + ', "amount": "1.00"}', "amount"),  # same value too
        ('{"amount": "1.00", ' + _BASE + ', "amo\\u0075nt": "2.00"}', "amount"),  # escaped
        ('{"amount": "1.00", ' + _BASE + ', "mcc": "1", "mcc": "2", "channel": "a", '
         '"channel": "b"}', "mcc, channel"),
    ],
)  # fmt: skip
def test_an_event_that_names_a_member_twice_is_invalid(text: str, names: str) -> None:
    # msgspec kept the last amount; a reader that keeps the first (or the ledger's) would
    # book 1.00 of a payment counted as 9,000.00, or the other way round
    for parse_it in (parse_event, decode_json):
        with pytest.raises(EventRejected) as caught:
            parse_it(text.encode())
        assert caught.value.error is DeadLetterError.INVALID_EVENT
        assert caught.value.detail == (
            f"{names}: given more than once (which one counts would depend on the reader)"
        )


def test_names_given_twice_inside_an_extra_field_are_its_own_business() -> None:
    # only the event's own members decide anything; a nested object is kept as decoded
    text = '{"amount": "1.00", ' + _BASE + ', "meta": {"k": 1, "k": 2}, "s": "a:\\"}{:"}'
    assert parse_event(text.encode()).amount == 100


_JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(alphabet='ab:{}[]",\\\n\u00e9'),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3)
    ),
    max_leaves=8,
)


@given(st.dictionaries(st.text(alphabet='ab:{}[]",\\', max_size=4), _JSON_VALUES, max_size=6))
def test_members_counts_the_members_of_any_object(doc: dict[str, Any]) -> None:
    text = json.dumps(doc, ensure_ascii=False).encode()
    assert members(text) == len(doc)
    assert decode_json(text) == json.loads(text, parse_float=Decimal)
    if parsing._fast_parse is not None:  # the compiled count (lf_members) agrees
        assert parsing._fast_parse(text) is not None
        if doc:  # and with one name given twice, it leaves the object to decode_json
            first = json.dumps(dict([next(iter(doc.items()))]), ensure_ascii=False).encode()
            twice = text[:-1] + b", " + first[1:-1] + b"}"
            assert members(twice) == len(doc) + 1
            assert parsing._fast_parse(twice) is None
