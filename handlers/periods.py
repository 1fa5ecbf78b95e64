"""Calendar period keys of an instant in a time zone.

Keys carry the full date (``2026-01`` not ``0``), so January 2025 and January 2026 are
different buckets. Only the event's own time is used, never the wall clock.
"""

from __future__ import annotations

from datetime import datetime
from functools import lru_cache
from typing import Final
from zoneinfo import ZoneInfo

from schemas.rules import Window

FOLD_BOUND: Final = 2 * 86_400
"""More than a zone's clock can be set back across one period: Python holds every UTC
offset strictly within ±24 h, so between any two instants a zone's offset falls by less
than 48 h. A period is a span of local time [start, next start): from an instant of it
to its last one, local time moves at most the period's nominal length, and UTC that
plus the fall of the offset meanwhile. Clocks set back make a local period longer than
its nominal length: New York's hour 01 on the first Sunday of November lasts two hours
(its minutes happen twice), Antarctica/Troll's day of 25 Oct 2026 lasts 26 h,
Kwajalein's minutes of Sept 1969 happened twice 23 h apart."""

# For expiry: a bucket's period end is the instant of its latest event + its window's
# span, which must not fall before the period's last instant (a bucket that expired
# while its period still ran would forget what it counted). Its nominal length at most
# (a day has 86,400 local seconds, a month 31 days, a year 366), plus FOLD_BOUND.
PERIOD_SPAN: Final[dict[Window, int | None]] = {
    Window.TRANSACTION: 0,
    Window.MINUTE: 60 + FOLD_BOUND,
    Window.HOUR: 3_600 + FOLD_BOUND,
    Window.DAY: 86_400 + FOLD_BOUND,
    Window.WEEK: 7 * 86_400 + FOLD_BOUND,
    Window.MONTH: 31 * 86_400 + FOLD_BOUND,
    Window.YEAR: 366 * 86_400 + FOLD_BOUND,
    Window.LIFETIME: None,
}

_CACHE_LIMIT: Final = 200_000


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


class PeriodClock:
    """Period keys for one zone, cached per minute of epoch time.

    All instants of an epoch minute share every period key when the zone's offset is a
    whole number of minutes throughout that minute, as every offset since 1972 is;
    events arrive roughly in time order, so the cache hit rate is high. Older local mean
    times have offsets with seconds (Africa/Monrovia was -0:44:30 until 1972): such a
    minute straddles a local minute, and its keys are worked out for each instant.
    """

    __slots__ = ("_cache", "_zone")

    def __init__(self, zone: str) -> None:
        self._zone = ZoneInfo(zone)
        self._cache: dict[int, dict[Window, str] | None] = {}
        """Keys of an epoch minute; None for a minute that is not one local minute."""

    def keys(self, epoch: int) -> dict[Window, str]:
        """All period keys of the instant ``epoch`` (seconds)."""
        found = self.minute_keys(epoch // 60)
        if found is None:
            return _keys_of(datetime.fromtimestamp(epoch, self._zone))
        return found

    def minute_keys(self, minute: int) -> dict[Window, str] | None:
        """The period keys that every instant of an epoch minute shares; None when its
        instants differ (an offset with seconds), whose keys ``keys`` works out each."""
        found = self._cache.get(minute, _UNKNOWN)
        if found is _UNKNOWN:
            if len(self._cache) >= _CACHE_LIMIT:
                self._cache.clear()
            local = datetime.fromtimestamp(minute * 60, self._zone)
            last = datetime.fromtimestamp(minute * 60 + 59, self._zone)
            offset = local.utcoffset()
            if offset is not None and offset == last.utcoffset() and not offset.seconds % 60:
                found = self._cache[minute] = _keys_of(local)
            else:
                found = self._cache[minute] = None
        return found


_UNKNOWN: Final[dict[Window, str]] = {}


def _keys_of(local: datetime) -> dict[Window, str]:
    return {window: period_key(window, local) for window in Window}


@lru_cache(maxsize=64)
def clock_for(zone: str) -> PeriodClock:
    """The shared ``PeriodClock`` of a zone."""
    return PeriodClock(zone)
