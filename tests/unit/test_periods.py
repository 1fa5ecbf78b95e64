"""Period strings: calendar periods of the event's instant in the rule's zone."""

from __future__ import annotations

import zoneinfo
from datetime import UTC, datetime
from importlib import resources
from pathlib import Path

import pytest

from handlers.periods import END_SLACK, PeriodClock, clock_for, period_key, window_of
from schemas import zones
from schemas.rules import Window, parse_rules


def epoch(text: str) -> int:
    """Whole seconds since the Unix epoch of an ISO 8601 time with an offset."""
    return int(datetime.fromisoformat(text).timestamp())


def keys(text: str, zone: str = "UTC") -> dict[str, str]:
    """Every window's period of an instant, keyed by window name."""
    return {w.value: key for w, key in clock_for(zone).keys(epoch(text)).items()}


def test_every_window_has_its_contract_string() -> None:
    assert keys("2026-01-31T23:59:30Z") == {
        "transaction": "transaction",
        "minute": "2026-01-31T23:59",
        "hour": "2026-01-31T23",
        "day": "2026-01-31",
        "week": "2026-W05",
        "month": "2026-01",
        "year": "2026",
        "lifetime": "lifetime",
    }


@pytest.mark.parametrize(
    ("window", "expected"),
    [
        (Window.MINUTE, "2026-03-04T05:06"),
        (Window.HOUR, "2026-03-04T05"),
        (Window.DAY, "2026-03-04"),
        (Window.WEEK, "2026-W10"),
        (Window.MONTH, "2026-03"),
        (Window.YEAR, "2026"),
        (Window.LIFETIME, "lifetime"),
        (Window.TRANSACTION, "transaction"),
    ],
)
def test_period_key_pads_every_part(window: Window, expected: str) -> None:
    local = datetime(2026, 3, 4, 5, 6, 7, tzinfo=UTC)
    assert period_key(window, local) == expected


def test_small_years_are_padded_to_four_digits() -> None:
    local = datetime(987, 6, 5, 4, 3, tzinfo=UTC)
    assert period_key(Window.YEAR, local) == "0987"
    assert period_key(Window.DAY, local) == "0987-06-05"


@pytest.mark.parametrize(
    ("day", "week"),
    [
        ("2026-01-26", "2026-W05"),  # Monday: a new week starts
        ("2026-02-01", "2026-W05"),  # Sunday: still the same week
        ("2026-02-02", "2026-W06"),  # Monday again
        ("2025-12-28", "2025-W52"),  # Sunday before the year's first Monday
        ("2025-12-29", "2026-W01"),  # a December day in week 1 of the next year
        ("2025-12-31", "2026-W01"),
        ("2026-01-01", "2026-W01"),
        ("2026-12-31", "2026-W53"),  # 2026 starts on a Thursday: 53 weeks
        ("2027-01-01", "2026-W53"),  # a January day in the last week of the year before
        ("2027-01-03", "2026-W53"),
        ("2027-01-04", "2027-W01"),
        ("2021-01-03", "2020-W53"),
        ("2024-12-30", "2025-W01"),
    ],
)
def test_weeks_are_iso_weeks_starting_on_monday(day: str, week: str) -> None:
    assert keys(f"{day}T12:00:00Z")["week"] == week


def test_the_week_of_the_iso_year_differs_from_the_calendar_year() -> None:
    found = keys("2027-01-01T12:00:00Z")
    assert (found["week"], found["month"], found["year"]) == ("2026-W53", "2027-01", "2027")


def test_a_zone_moves_an_instant_to_another_day_month_and_week() -> None:
    instant = "2026-01-31T16:30:00Z"  # 2026-02-01 00:30 in Shanghai (UTC+8)
    utc = keys(instant)
    shanghai = keys(instant, "Asia/Shanghai")
    assert (utc["day"], utc["month"], utc["hour"]) == ("2026-01-31", "2026-01", "2026-01-31T16")
    assert (shanghai["day"], shanghai["month"], shanghai["hour"]) == (
        "2026-02-01",
        "2026-02",
        "2026-02-01T00",
    )
    assert (utc["week"], shanghai["week"]) == ("2026-W05", "2026-W05")  # Sat vs Sun


def test_the_last_second_before_local_midnight_is_still_the_old_day() -> None:
    assert keys("2026-01-31T15:59:59Z", "Asia/Shanghai")["day"] == "2026-01-31"
    assert keys("2026-01-31T16:00:00Z", "Asia/Shanghai")["day"] == "2026-02-01"


def test_a_new_year_comes_earlier_east_and_later_west() -> None:
    instant = "2026-12-31T20:00:00Z"
    assert keys(instant, "Asia/Tokyo")["year"] == "2027"
    assert keys(instant)["year"] == "2026"
    assert keys("2027-01-01T03:00:00Z", "America/Los_Angeles")["year"] == "2026"


def test_half_and_quarter_hour_zones() -> None:
    # 2026-01-31T23:59Z is 2026-02-01 05:29 in Kolkata (+05:30), 05:44 in Kathmandu (+05:45)
    assert keys("2026-01-31T23:59:00Z", "Asia/Kolkata")["minute"] == "2026-02-01T05:29"
    assert keys("2026-01-31T23:59:00Z", "Asia/Kathmandu")["minute"] == "2026-02-01T05:44"


def test_spring_forward_skips_the_missing_hour() -> None:
    # America/New_York on 2026-03-08: 01:59:59 EST is followed by 03:00:00 EDT
    before = keys("2026-03-08T06:59:59Z", "America/New_York")
    after = keys("2026-03-08T07:00:00Z", "America/New_York")
    assert (before["hour"], before["minute"]) == ("2026-03-08T01", "2026-03-08T01:59")
    assert (after["hour"], after["minute"]) == ("2026-03-08T03", "2026-03-08T03:00")
    assert before["day"] == after["day"] == "2026-03-08"


def test_the_short_day_still_ends_at_local_midnight() -> None:
    # 2026-03-08 is 23 hours long in New York: it ends at 04:00Z the next day
    assert keys("2026-03-09T03:59:59Z", "America/New_York")["day"] == "2026-03-08"
    assert keys("2026-03-09T04:00:00Z", "America/New_York")["day"] == "2026-03-09"


def test_fall_back_repeats_a_local_hour_in_one_bucket() -> None:
    # America/New_York on 2026-11-01: 01:00-02:00 happens twice (EDT, then EST); the
    # period string is the local wall-clock hour, so both real hours share one bucket.
    first = keys("2026-11-01T05:30:00Z", "America/New_York")  # 01:30 EDT
    second = keys("2026-11-01T06:30:00Z", "America/New_York")  # 01:30 EST
    assert first["hour"] == second["hour"] == "2026-11-01T01"
    assert first["minute"] == second["minute"] == "2026-11-01T01:30"
    assert keys("2026-11-01T07:00:00Z", "America/New_York")["hour"] == "2026-11-01T02"


def test_the_long_day_still_ends_at_local_midnight() -> None:
    # 2026-11-01 is 25 hours long in New York: it ends at 05:00Z the next day
    assert keys("2026-11-02T04:59:59Z", "America/New_York")["day"] == "2026-11-01"
    assert keys("2026-11-02T05:00:00Z", "America/New_York")["day"] == "2026-11-02"


def test_january_2025_and_january_2026_are_different_periods() -> None:
    # A month key of just "01" (or a week number without its year) would merge them.
    jan_2025 = keys("2025-01-15T12:00:00Z")
    jan_2026 = keys("2026-01-15T12:00:00Z")
    for window in ("minute", "hour", "day", "week", "month", "year"):
        assert jan_2025[window] != jan_2026[window], window
    assert (jan_2025["month"], jan_2026["month"]) == ("2025-01", "2026-01")
    assert (jan_2025["week"], jan_2026["week"]) == ("2025-W03", "2026-W03")


@pytest.mark.parametrize(
    "local",
    [
        datetime(1, 1, 2, tzinfo=UTC),
        datetime(2026, 1, 1, tzinfo=UTC),
        datetime(2027, 1, 3, 23, 59, tzinfo=UTC),  # ISO week 53 of 2026
        datetime(9999, 12, 30, 23, 59, tzinfo=UTC),
    ],
)
def test_the_window_of_a_period_is_the_one_that_named_it(local: datetime) -> None:
    for window in Window:
        if window is not Window.TRANSACTION:  # no bucket, no key
            assert window_of(period_key(window, local)) is window
    assert window_of("2026-03-14T10:00:00") is None


def test_lifetime_and_transaction_never_change() -> None:
    for text in ("1999-01-01T00:00:00Z", "2026-06-15T12:34:56+08:00", "2090-12-31T23:59:59Z"):
        found = keys(text, "Asia/Shanghai")
        assert (found["lifetime"], found["transaction"]) == ("lifetime", "transaction")


@pytest.mark.parametrize("zone", ["UTC", "Asia/Shanghai", "America/New_York", "Asia/Kolkata"])
def test_the_clock_agrees_with_period_key_second_by_second(zone: str) -> None:
    # PeriodClock caches per epoch minute; walk across minute, hour, day and DST edges
    clock = PeriodClock(zone)
    tz = zones.zone(zone)
    starts = ["2026-03-08T06:58:30Z", "2026-11-01T05:58:30Z", "2026-01-31T15:58:30Z"]
    for start in starts:
        first = epoch(start)
        for second in range(first, first + 240, 7):
            local = datetime.fromtimestamp(second, tz)
            expected = {w: period_key(w, local) for w in Window}
            assert clock.keys(second) == expected, (zone, second)


@pytest.mark.parametrize(
    ("zone", "start"),
    [
        ("Africa/Monrovia", "1971-06-01T00:43:30Z"),  # -0:44:30 until 1972
        ("Africa/Monrovia", "1972-01-07T00:43:30Z"),  # the change to -0:44:30 -> UTC
        ("Europe/Amsterdam", "1937-06-30T23:38:00Z"),  # +0:19:32 -> +0:20
        ("Asia/Shanghai", "1900-12-31T15:53:00Z"),  # local mean time +8:05:43
    ],
)
def test_offsets_with_seconds_give_the_local_period_of_each_instant(zone: str, start: str) -> None:
    # the per-minute cache gave a whole epoch minute the keys of its first second, so
    # 00:00:15 local on 1 June 1971 in Monrovia counted in 31 May
    clock = PeriodClock(zone)
    tz = zones.zone(zone)
    first = epoch(start)
    for second in range(first, first + 240):
        local = datetime.fromtimestamp(second, tz)
        expected = {w: period_key(w, local) for w in Window}
        assert clock.keys(second) == expected, (zone, second)


def test_clock_for_shares_one_clock_per_zone() -> None:
    assert clock_for("Asia/Shanghai") is clock_for("Asia/Shanghai")
    assert clock_for("Asia/Shanghai") is not clock_for("UTC")


@pytest.mark.parametrize("zone", ["Pacific/Kiritimati", "Etc/GMT+12", "America/New_York"])
@pytest.mark.parametrize("text", ["0001-01-02T00:00:00Z", "9999-12-30T23:59:59Z"])
def test_the_ends_of_the_accepted_range_have_periods_in_every_zone(zone: str, text: str) -> None:
    # events accept instants from 0001-01-02 to 9999-12-30 UTC; no zone is a day away
    found = keys(text, zone)
    assert found["year"] in {"0001", "9999"}


# Clocks set back within a period make it longer than its nominal length: (zone, an
# instant, a window, how long its period runs on from that instant, in seconds at least).
# New York's hour 01 of the first Sunday of November lasts two hours, and each of its
# minutes happens twice; Lord Howe's minutes of 5 April 2026 repeat half an hour apart;
# Troll's day, ISO week and month of 25 Oct 2026 are 2 h longer; Kwajalein set its clocks
# back 23 h on 30 Sept 1969 (that day lasted 47 h), Sitka 24 h in 1867.
_H = 3_600
_LONG_PERIODS = [
    ("America/New_York", "2026-11-01T01:00:00-04:00", Window.MINUTE, _H + 59),
    ("America/New_York", "2026-11-01T01:00:00-04:00", Window.HOUR, 2 * _H - 1),
    ("America/New_York", "2026-11-01T01:00:00-04:00", Window.DAY, 24 * _H - 1),
    ("Australia/Lord_Howe", "2026-04-05T01:30:00+11:00", Window.MINUTE, 1_800 + 59),
    ("Antarctica/Troll", "2026-10-25T00:00:00+02:00", Window.DAY, 26 * _H - 1),
    ("Antarctica/Troll", "2026-10-19T00:00:00+02:00", Window.WEEK, (7 * 24 + 2) * _H - 1),
    ("Antarctica/Troll", "2026-10-01T00:00:00+02:00", Window.MONTH, (31 * 24 + 2) * _H - 1),
    ("Pacific/Kwajalein", "1969-09-30T23:30:00+11:00", Window.MINUTE, 23 * _H + 59),
    ("Pacific/Kwajalein", "1969-09-30T00:00:00+11:00", Window.DAY, 47 * _H - 1),
    ("America/Sitka", "1867-10-19T00:00:00+14:58:47", Window.DAY, 48 * _H - 1),
]


def _last_instant(zone: str, start: int, window: Window, step: int, reach: int) -> int:
    """The last instant, to ``step`` seconds, within ``reach`` of ``start`` whose period
    in ``window`` is ``start``'s: found by walking the zone's clock, not by reasoning."""
    clock = PeriodClock(zone)
    period = clock.keys(start)[window]
    last = start
    for at in range(start, start + reach, step):
        if clock.keys(at)[window] == period:
            last = at
    return last + step - 1


def ends(text: str, zone: str) -> dict[Window, int | None]:
    """Every window's period end of an instant."""
    return PeriodClock(zone).periods(epoch(text))[1]


@pytest.mark.parametrize(("zone", "text", "window", "runs_on"), _LONG_PERIODS)
def test_a_period_end_is_never_before_its_last_instant(
    zone: str, text: str, window: Window, runs_on: int
) -> None:
    """A bucket's period end decides when it may expire: one that fell before the
    period's last instant let a bucket expire while its period still ran, and forget
    what it had counted."""
    start = epoch(text)
    end = ends(text, zone)[window]
    assert end is not None
    step = 60 if window is Window.MINUTE else 900
    last = _last_instant(zone, start, window, step, 40 * 86_400)
    assert last - start >= runs_on - step  # the walk finds the long period
    assert end >= last


@pytest.mark.parametrize(
    ("zone", "first", "last"),
    [
        ("UTC", "2026-01-01T00:00:00Z", "2026-12-31T23:59:59Z"),
        ("America/New_York", "2026-01-01T00:00:00-05:00", "2026-12-31T23:59:59-05:00"),
        ("Antarctica/Troll", "2026-01-01T00:00:00Z", "2026-12-31T23:59:59Z"),
    ],
)
def test_every_instant_of_a_period_has_the_same_end(zone: str, first: str, last: str) -> None:
    """The end is the period's, not the event's: so a later payment of the period does
    not carry its bucket's expiry past that of an earlier payment's idempotency record
    (which a resend of it would then miss, and be counted again)."""
    clock = PeriodClock(zone)
    seen: dict[tuple[Window, str], set[int | None]] = {}
    for at in range(epoch(first), epoch(last) + 1, 3_541):  # every hour of the year, or so
        keys, found = clock.periods(at)
        for window in Window:
            seen.setdefault((window, keys[window]), set()).add(found[window])
    assert all(len(found) == 1 for found in seen.values())
    assert len({period for window, period in seen if window is Window.YEAR}) == 1


def test_a_period_ends_a_day_after_its_local_end_read_as_utc() -> None:
    day = 86_400
    assert day == END_SLACK
    found = ends("2026-02-14T10:30:15+08:00", "Asia/Shanghai")
    assert found[Window.TRANSACTION] is None and found[Window.LIFETIME] is None
    assert found[Window.MINUTE] == epoch("2026-02-14T10:31:00Z") + day
    assert found[Window.HOUR] == epoch("2026-02-14T11:00:00Z") + day
    assert found[Window.DAY] == epoch("2026-02-15T00:00:00Z") + day
    assert found[Window.WEEK] == epoch("2026-02-16T00:00:00Z") + day  # Monday
    assert found[Window.MONTH] == epoch("2026-03-01T00:00:00Z") + day
    assert found[Window.YEAR] == epoch("2027-01-01T00:00:00Z") + day
    leap = ends("2028-02-29T23:59:59-12:00", "Etc/GMT+12")
    assert leap[Window.MONTH] == epoch("2028-03-01T00:00:00Z") + day
    assert leap[Window.YEAR] == epoch("2029-01-01T00:00:00Z") + day
    far = ends("9999-12-30T23:59:59Z", "Pacific/Kiritimati")  # 9999-12-31 there
    assert far[Window.YEAR] == epoch("9999-12-31T00:00:00Z") + 2 * day


def test_a_clock_keeps_a_bounded_number_of_minutes() -> None:
    """A replay of events spread over years (each in a minute of its own) keeps at most
    two weeks of minutes (~28 MB), not a cache that grows with the input."""
    from handlers import periods

    clock = PeriodClock("Asia/Shanghai")
    first = epoch("2026-01-01T00:00:00Z") // 60
    for minute in range(first, first + periods._CACHE_LIMIT + 10):
        clock.minute_periods(minute)
    assert 0 < len(clock._cache) <= periods._CACHE_LIMIT <= 20_000


def test_zones_come_from_the_tzdata_package_whatever_the_host_holds(tmp_path: Path) -> None:
    # zoneinfo reads the host's zone files first: a host whose data said otherwise (older
    # or newer than the package, as this machine's 2025b against the package's 2026f
    # for America/Vancouver from 2026-11-01) put the same event in another period
    (tmp_path / "Asia").mkdir()
    (tmp_path / "Asia" / "Shanghai").write_bytes(
        resources.files("tzdata.zoneinfo").joinpath("UTC").read_bytes()
    )
    zoneinfo.reset_tzpath([str(tmp_path)])
    zoneinfo.ZoneInfo.clear_cache()
    zones.zone.cache_clear()
    try:
        moment = datetime(2026, 1, 31, 16, 30, tzinfo=UTC)
        assert moment.astimezone(zoneinfo.ZoneInfo("Asia/Shanghai")).day == 31  # the host's
        assert PeriodClock("Asia/Shanghai").keys(int(moment.timestamp()))[Window.DAY] == (
            "2026-02-01"
        )
        parse_rules("rules: [{id: a, window: day, max_count: 1, timezone: Asia/Tokyo}]")
    finally:
        zoneinfo.reset_tzpath()
        zoneinfo.ZoneInfo.clear_cache()
        zones.zone.cache_clear()


def test_rules_in_many_zones_share_one_clock_a_zone_and_a_budget_of_minutes() -> None:
    # clock_for was an LRU cache of 64: rules in 100 zones, compiled zone after zone,
    # each found its zone's clock evicted and made another (374 clocks for 1,000 rules),
    # each keeping up to two weeks of minutes (~28 MB)
    from handlers import periods
    from handlers.decide import Decider

    names = [
        z
        for z in sorted(zoneinfo.available_timezones())
        if z.startswith(("America/", "Europe/", "Asia/"))
    ][:100]
    text = "rules:\n" + "".join(
        f"  - {{id: r{n}, window: day, max_count: 1, timezone: {zone}}}\n"
        for n, zone in enumerate(names * 3)
    )
    decider = Decider(parse_rules(text))
    assert len({id(c.clock) for c in decider._compiled}) == 100
    assert len(periods._clocks) >= 100  # and those of other tests
    assert periods._cache_limit == 1_440  # a day of minutes each: 120,000 / 100 and more
    clock = clock_for(names[0])
    first = epoch("2026-01-01T00:00:00Z") // 60
    for minute in range(first, first + 1_450):
        clock.minute_periods(minute)
    assert 0 < len(clock._cache) <= 1_440
