"""IANA time zones, always from the ``tzdata`` package installed with limitflow.

``zoneinfo.ZoneInfo(name)`` reads the host's zone files first (``/usr/share/zoneinfo``)
and the ``tzdata`` package only where the host has none. The host's data follow its OS
updates, so two machines running the same limitflow could put one event in different
periods: on 2026-11-27 this build machine's files (IANA 2025b) and the package (2026f)
differed for 15 zones, America/Vancouver's days among them, from 2026-11-01 on. A
member of a consumer group, a backfill replayed on a laptop and a worker in a slim
container without zone files would each decide by their own calendar. Reading the
package alone makes the periods a function of what is installed with limitflow (its
version is ``DATA_VERSION``); upgrading ``tzdata`` is then a deployment like any other.
"""

from __future__ import annotations

import functools
import importlib
import io
from importlib import resources
from typing import Final
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

DATA_VERSION: Final[str] = importlib.import_module("tzdata").IANA_VERSION
"""The IANA release of the zone data in use, such as ``2026f``."""


@functools.cache
def names() -> frozenset[str]:
    """Every zone name the data define, aliases (``PRC``, ``US/Eastern``) included."""
    return frozenset(resources.files("tzdata").joinpath("zones").read_text().split())


@functools.cache
def zone(name: str) -> ZoneInfo:
    """The zone ``name`` (``ZoneInfoNotFoundError`` for a name the data do not define)."""
    return ZoneInfo.from_file(io.BytesIO(_raw(name)), key=name)


def same_zone(a: str, b: str) -> bool:
    """Whether two names are one zone: the same name, or one an alias of the other (the
    data give both the same rules, as for ``PRC`` and ``Asia/Shanghai``)."""
    return a == b or (a in names() and b in names() and _raw(a) == _raw(b))


@functools.cache
def _raw(name: str) -> bytes:
    if name not in names():
        raise ZoneInfoNotFoundError(name)
    return resources.files("tzdata.zoneinfo").joinpath(*name.split("/")).read_bytes()
