"""The sqlite store's compiled row building (``stores._fastsqlite``) gives the statements
the same parameters, and reads the same buckets, as its Python loops."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from benchmarks.generate import events as generated
from handlers.decide import Decider
from handlers.state import Bucket, Snapshot, WorkingState, Writes
from schemas.events import parse_event
from schemas.rules import load_rules
from stores import sqlite
from stores.base import LATEST_EXPIRY, stamp
from stores.verdict_codec import pack_verdict
from tests.unit.built import SLOTS, assert_built_after, optional, private

_fastsqlite, needs_compiled = optional("stores._fastsqlite")
RULES = Path(__file__).resolve().parents[2] / "examples" / "rules.yaml"
NOW = 1_772_400_000


def decided_writes() -> list[tuple[Writes, dict[str, int | None], dict[str, int | None]]]:
    """The writes of a generated stream decided in two units (so that the second one
    updates records the first created), each stamped as ``Store.commit`` stamps it."""
    decider = Decider(load_rules(str(RULES)))
    state = WorkingState(Snapshot())
    lines = list(generated(3_000, accounts=40, merchants=6))
    found = []
    for part in (lines[:1_500], lines[1_500:]):
        for line in part:
            event = parse_event(line)
            decider.decide(event, decider.plan(event), state)
        writes = state.take_writes()
        held_buckets, held_events = stamp(writes, NOW, 35 * 86_400, 400 * 86_400, LATEST_EXPIRY)
        found.append((writes, held_buckets, held_events))
    return found


def _rows(build: Callable[..., Any], writes: Writes, held: tuple[Any, Any]) -> Any:
    return build(
        writes.buckets,
        writes.accounts,
        writes.events,
        *held,
        pack_verdict,
        sqlite._json_text,
    )


@needs_compiled
def test_rows_are_the_same_both_ways() -> None:
    units = decided_writes()
    updated = 0
    for writes, held_buckets, held_events in units:
        compiled = _rows(_fastsqlite.rows, writes, (held_buckets, held_events))
        python = _rows(sqlite.rows, writes, (held_buckets, held_events))
        assert compiled == python
        assert [[type(v) for v in row] for part in compiled for row in part] == [
            [type(v) for v in row] for part in python for row in part
        ]
        updated += len(python[1]) + len(python[3]) + len(python[5])
    assert updated, "the second unit updates records of the first"


@needs_compiled
def test_a_record_of_another_version_gets_no_row_either_way() -> None:
    writes = Writes({"b": Bucket(1, 2, 0)}, {}, {})
    held: tuple[dict[str, int | None], dict[str, int | None]] = ({"b": None}, {})
    assert _rows(_fastsqlite.rows, writes, held) == _rows(sqlite.rows, writes, held)
    assert _rows(_fastsqlite.rows, writes, held) == ([], [], [], [], [], [])


@needs_compiled
def test_buckets_read_the_same_both_ways() -> None:
    db = sqlite3.connect(":memory:")
    db.execute(
        "CREATE TABLE buckets (key TEXT PRIMARY KEY, count INTEGER, amount INTEGER,"
        " version INTEGER, period_end INTEGER, expires_at INTEGER, born INTEGER)"
    )
    db.executemany(
        "INSERT INTO buckets VALUES (?, ?, ?, ?, ?, ?, ?)",
        [("a", 1, 2, 3, 4, 5, 6), ("b", 0, 0, 1, None, None, None), ("c", 7, 8, 9, 10, 11, 0)],
    )
    select = "SELECT key, count, amount, version, period_end, expires_at, born FROM buckets"
    compiled: dict[str, Bucket] = {}
    python: dict[str, Bucket] = {}
    _fastsqlite.buckets_into(db.execute(select), compiled)
    sqlite.buckets_into(db.execute(select), python)
    assert compiled == python
    assert python["b"] == Bucket(0, 0, 1, None, None, 0)
    with pytest.raises(ValueError):
        _fastsqlite.buckets_into(iter([("k", 1, 2)]), {})


@pytest.mark.parametrize(
    "row",
    [
        ("k", 1, 1.5, 1, 4, 5, 6),  # a REAL amount was published as "3551..5"
        ("k", "abc", 2, 1, 4, 5, 6),  # text: a TypeError and a traceback
        ("k", 1, 2, 1, "x", 5, 6),
        ("k", 1, 2, 1, 4, "x", 6),
        ("k", 1, 2, 1, 4, 5, 2.0),
        ("k", 1, 2, None, 4, 5, 6),
        ("k", -3, 2, 1, 4, 5, 6),  # a negative count would let more through
        ("k", 1, -2, 1, 4, 5, 6),
        ("k", True, 2, 1, 4, 5, 6),
    ],
)
def test_a_bucket_row_that_is_not_a_buckets_is_refused_both_ways(row: tuple[object, ...]) -> None:
    # SQLite keeps any value in any column (a file edited by hand, or damaged)
    readers = [sqlite.buckets_into]
    if _fastsqlite is not None:
        readers.append(_fastsqlite.buckets_into)
    for buckets_into in readers:
        # named by its rule and period, not its scope values or the values stored
        with pytest.raises(ValueError, match=r"^bucket r\|2026-03\|…: a row that is not"):
            buckets_into(iter([("r|2026-03|4111111111111111", *row[1:])]), {})


@needs_compiled
def test_the_store_uses_the_compiled_loops() -> None:
    assert private(sqlite, "_rows") is _fastsqlite.rows
    assert private(sqlite, "_buckets_into") is _fastsqlite.buckets_into
    assert private(sqlite, "_event_row_ok") is _fastsqlite.event_row_ok
    fields = _fastsqlite.slot_fields()
    assert len(fields) == 22
    assert all(fields.values()), fields


@needs_compiled
def test_the_built_extension_is_not_older_than_its_source() -> None:
    """An edit to ``_fastsqlite.pyx`` (or to the ``_slots`` code it takes in) takes effect
    only once built again."""
    assert_built_after(_fastsqlite, "stores/_fastsqlite.pyx", *SLOTS)


def test_an_events_row_is_checked_the_same_both_ways() -> None:
    # id, fingerprint, account, type, accepted, seq, verdict, amount, currency, reversed,
    # buckets, occurred, version, expires_at, born
    good = ("e", "f", "a", "payment", 1, 3, b"{}", 100, "CNY", 0, "[]", 17, 2, None, None)
    checks = [sqlite.event_row_ok]
    if _fastsqlite is not None:
        checks.append(_fastsqlite.event_row_ok)
    for check in checks:
        assert check(good)
        assert check((*good[:13], 1_800_000_000, None))
        assert check((*good[:4], 0, *good[5:]))
        for index, bad in [
            (4, 2),
            (4, "yes"),
            (4, 1.0),
            (5, "x"),
            (5, 2.5),
            (7, 2.5),
            (9, None),
            (11, "t"),
            (12, 1.0),
            (13, "x"),
            (13, 1.5),
        ]:
            row = (*good[:index], bad, *good[index + 1 :])
            assert not check(row), (check, index, bad)
