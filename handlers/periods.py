"""Calendar period keys of an instant in a time zone.

Keys carry the full date (``2026-01`` not ``0``), so January 2025 and January 2026 are
different buckets. Only the event's own time is used, never the wall clock.
"""

from __future__ import annotations

import calendar
from datetime import UTC, datetime, timedelta
from typing import Final

from schemas import zones
from schemas.rules import Window

END_SLACK: Final = 86_400
"""Added to a period's local end read as UTC: Python holds every UTC offset strictly
within ±24 h, so no zone reaches the local end of a period (or passes it, clocks set
forward) later than 24 h after that local time read as UTC. Clocks set back make a
local period last longer than its nominal length (New York's hour 01 on the first
Sunday of November lasts two hours, and each of its minutes happens twice;
Kwajalein's 30 Sept 1969 lasted 47 h): the end is that of its last instant."""

Periods = tuple[dict[Window, str], dict[Window, int | None]]
"""An instant's period keys, and each period's end (``period_end``), by window."""

_CACHE_LIMIT: Final = 20_000
"""Epoch minutes a clock keeps the periods of (~1.4 KB each: keys and ends): two weeks
of minutes, 28 MB at most, whatever the spread of a replay's events; less where rules
are in many zones (``_CACHE_BUDGET``)."""
_CACHE_BUDGET: Final = 120_000
"""Epoch minutes all clocks keep together, ~170 MB: up to 6 zones, each keeps
``_CACHE_LIMIT``; with more, each an equal share, a day at least (rules in 100 zones
kept 28 MB in each, 2.8 GB once their events spanned two weeks)."""
_DAY_OF_MINUTES: Final = 1_440


def period_key(window: Window, local: datetime) -> str:
    """The period string of a zone-aware local time: ``2026-W05``, ``2026-01-31T23``…"""
    if window is Window.DAY:
        return f"{local.year:04d}-{local.month:02d}-{local.day:02d}"
    if window is Window.MONTH:
        return f"{local.year:04d}-{local.month:02d}"
    if window is Window.WEEK:
        year, week, _ = local.isocalendar()
        return f"{year:04d}-W{week:02d}"
    if window is Window.YEAR:
        return f"{local.year:04d}"
    if window is Window.HOUR:
        return f"{local.year:04d}-{local.month:02d}-{local.day:02d}T{local.hour:02d}"
    if window is Window.MINUTE:
        return (
            f"{local.year:04d}-{local.month:02d}-{local.day:02d}"
            f"T{local.hour:02d}:{local.minute:02d}"
        )
    return window.value  # "lifetime" and "transaction" have a single period


_WINDOW_BY_LENGTH: Final = {
    4: Window.YEAR,  # 2026
    7: Window.MONTH,  # 2026-01
    8: Window.WEEK,  # 2026-W05 ("lifetime" too: taken first)
    10: Window.DAY,  # 2026-01-31
    13: Window.HOUR,  # 2026-01-31T23
    16: Window.MINUTE,  # 2026-01-31T23:59
}


def window_of(period: str) -> Window | None:
    """The window whose period strings look like ``period`` (``period_key``'s forms, each
    of its own length); None for none of them. A bucket's key names its period, not its
    rule's window: a rule changed in place to another window keeps the old window's
    buckets under the same id."""
    if period == "lifetime":
        return Window.LIFETIME
    return _WINDOW_BY_LENGTH.get(len(period))


_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)


def period_end(window: Window, local: datetime) -> int | None:
    """A bound on the end of the period of a zone-aware local time, in epoch seconds:
    its local end (the next period's start) read as UTC, + ``END_SLACK``. The same for
    every instant of the period, so a bucket's expiry does not move with each event in
    it (a record that counted in the bucket then expires no earlier than the bucket, as
    ``stores.base.stamp`` left them). None for a window whose bucket never expires
    (lifetime) or that has none (transaction)."""
    if window is Window.MINUTE:
        start, length = local.replace(tzinfo=UTC, second=0, microsecond=0), 60
    elif window is Window.HOUR:
        start, length = local.replace(tzinfo=UTC, minute=0, second=0, microsecond=0), 3_600
    elif window in (Window.LIFETIME, Window.TRANSACTION):
        return None
    else:
        day = datetime(local.year, local.month, local.day, tzinfo=UTC)  # its wall time
        if window is Window.DAY:
            start, length = day, 86_400
        elif window is Window.WEEK:  # ISO weeks start on Monday
            start, length = day - timedelta(days=day.weekday()), 7 * 86_400
        elif window is Window.MONTH:
            days = calendar.monthrange(local.year, local.month)[1]
            start, length = day.replace(day=1), days * 86_400
        else:
            days = 366 if calendar.isleap(local.year) else 365
            start, length = datetime(local.year, 1, 1, tzinfo=UTC), days * 86_400
    return (start - _EPOCH) // timedelta(seconds=1) + length + END_SLACK


class PeriodClock:
    """Period keys (and their periods' ends) for one zone, cached per minute of epoch
    time.

    All instants of an epoch minute share every period key when the zone's offset is a
    whole number of minutes throughout that minute, as every offset since 1972 is;
    events arrive roughly in time order, so the cache hit rate is high. Older local mean
    times have offsets with seconds (Africa/Monrovia was -0:44:30 until 1972): such a
    minute straddles a local minute, and its keys are worked out for each instant.
    """

    __slots__ = ("_cache", "_zone")

    def __init__(self, zone: str) -> None:
        self._zone = zones.zone(zone)
        self._cache: dict[int, Periods | None] = {}
        """Periods of an epoch minute; None for a minute that is not one local minute."""

    def keys(self, epoch: int) -> dict[Window, str]:
        """All period keys of the instant ``epoch`` (seconds)."""
        return self.periods(epoch)[0]

    def periods(self, epoch: int) -> Periods:
        """All period keys of the instant ``epoch`` (seconds), and their ends."""
        found = self.minute_periods(epoch // 60)
        if found is None:
            return _periods_of(datetime.fromtimestamp(epoch, self._zone))
        return found

    def minute_periods(self, minute: int) -> Periods | None:
        """The periods (keys and ends) that every instant of an epoch minute shares;
        None when its instants differ (an offset with seconds), whose periods
        ``periods`` works out each."""
        found = self._cache.get(minute, _UNKNOWN)
        if found is _UNKNOWN:
            if len(self._cache) >= _cache_limit:
                self._cache.clear()
            local = datetime.fromtimestamp(minute * 60, self._zone)
            last = datetime.fromtimestamp(minute * 60 + 59, self._zone)
            offset = local.utcoffset()
            if offset is not None and offset == last.utcoffset() and not offset.seconds % 60:
                found = self._cache[minute] = _periods_of(local)
            else:
                found = self._cache[minute] = None
        return found


_UNKNOWN: Final[Periods] = ({}, {})


def _periods_of(local: datetime) -> Periods:
    return (
        {window: period_key(window, local) for window in Window},
        {window: period_end(window, local) for window in Window},
    )


_clocks: dict[str, PeriodClock] = {}
_cache_limit = _CACHE_LIMIT
"""Epoch minutes each clock keeps, by the number of clocks (``_CACHE_BUDGET``)."""


def clock_for(zone: str) -> PeriodClock:
    """The shared ``PeriodClock`` of a zone: one per zone. (An LRU cache of 64 made rules
    in more zones each a clock of its own as they were compiled, 374 for 100 zones, each
    with its own cache of minutes.)"""
    global _cache_limit
    clock = _clocks.get(zone)
    if clock is None:
        clock = _clocks[zone] = PeriodClock(zone)
        _cache_limit = max(_DAY_OF_MINUTES, min(_CACHE_LIMIT, _CACHE_BUDGET // len(_clocks)))
    return clock
