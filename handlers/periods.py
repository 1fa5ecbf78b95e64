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

# Upper bounds of each period's length in seconds, for expiry; generous for DST and leap years.
PERIOD_SPAN: Final[dict[Window, int | None]] = {
    Window.TRANSACTION: 0,
    Window.MINUTE: 60,
    Window.HOUR: 3_600,
    Window.DAY: 90_000,
    Window.WEEK: 7 * 86_400 + 3_600,
    Window.MONTH: 31 * 86_400 + 3_600,
    Window.YEAR: 366 * 86_400 + 3_600,
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

    Every zone offset in use is a whole number of minutes, so all instants within one
    epoch minute share every period key; events arrive roughly in time order, so the
    cache hit rate is high.
    """

    __slots__ = ("_cache", "_zone")

    def __init__(self, zone: str) -> None:
        self._zone = ZoneInfo(zone)
        self._cache: dict[int, dict[Window, str]] = {}

    def keys(self, epoch: int) -> dict[Window, str]:
        """All period keys of the instant ``epoch`` (seconds)."""
        minute = epoch // 60
        found = self._cache.get(minute)
        if found is None:
            if len(self._cache) >= _CACHE_LIMIT:
                self._cache.clear()
            local = datetime.fromtimestamp(minute * 60, self._zone)
            found = {window: period_key(window, local) for window in Window}
            self._cache[minute] = found
        return found


@lru_cache(maxsize=64)
def clock_for(zone: str) -> PeriodClock:
    """The shared ``PeriodClock`` of a zone."""
    return PeriodClock(zone)
