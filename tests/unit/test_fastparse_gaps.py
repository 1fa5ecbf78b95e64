"""The compiled parser (schemas/_fastparse.pyx) at the exact ends of the time range that
schemas.events accepts: [_FIRST_MICROS, _END_MICROS), i.e. from 0001-01-02T00:00:00Z up
to, not including, 9999-12-31T00:00:00Z. The hypothesis tests never draw those
instants."""

from __future__ import annotations

import pytest

from schemas import events as parsing
from schemas.events import EventRejected, _common_event, parse_event
from tests.unit.built import private

_compiled = None if private(parsing, "_fastparse") is None else parsing._fast_event


def _doc(time: str) -> dict[str, str]:
    return {
        "event_id": "e",
        "account_id": "a",
        "amount": "1.00",
        "currency": "CNY",
        "occurred_at": time,
    }


@pytest.mark.parametrize(
    ("time", "inside"),
    [
        ("9999-12-31T00:00:00Z", False),  # == _END_MICROS: refused
        ("9999-12-31T00:00:00+00:00", False),
        ("9999-12-30T23:59:59-00:00", True),
        ("9999-12-30T23:59:59.999999Z", True),  # the last instant taken
        ("0001-01-02T00:00:00Z", True),  # == _FIRST_MICROS: taken
        ("0001-01-01T23:59:59.999999Z", False),
    ],
)
def test_the_compiled_parser_takes_the_time_range_exactly(time: str, inside: bool) -> None:
    """Kills `micros < self.end_micros` -> `<=` (and `first_micros <=` -> `<`)."""
    assert _compiled is not None, "schemas._fastparse is not built"
    compiled = _compiled(_doc(time))
    python = _common_event(_doc(time))
    assert (compiled is not None) == inside
    assert (python is not None) == inside
    raw = (
        '{"event_id":"e","account_id":"a","amount":"1.00","currency":"CNY",'
        f'"occurred_at":"{time}"}}'
    ).encode()
    if inside:
        assert parse_event(raw).occurred_at == time
    else:
        with pytest.raises(EventRejected):
            parse_event(raw)
