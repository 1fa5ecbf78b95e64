"""The memory store's compiled read and write (``stores._fastmemory``) store the same
bytes, read the same records and raise the same errors as its Python loops."""

from __future__ import annotations

import struct
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from benchmarks.generate import events as generated
from handlers.decide import Decider
from handlers.state import Account, Bucket, EventRecord, Keys, Writes
from limitflow.errors import ConflictError, StoreRejected
from schemas.events import EventType
from schemas.rules import load_rules
from stores import memory
from stores.base import Expected
from stores.memory import MemoryStore
from streams.engine import Engine, Record
from tests.unit.built import SLOTS, assert_built_after, private

RULES = Path(__file__).resolve().parents[2] / "examples" / "rules.yaml"
NOW = 1_772_400_000


def both() -> tuple[MemoryStore, MemoryStore]:
    compiled = MemoryStore(clock=lambda: NOW)
    python = MemoryStore(clock=lambda: NOW, compiled=False)
    assert compiled.compiled, "stores._fastmemory is not built: pip install -e . builds it"
    assert not python.compiled
    return compiled, python


async def replayed(store: MemoryStore, lines: list[bytes]) -> list[tuple[object, ...]]:
    engine = Engine(Decider(load_rules(str(RULES))), store)
    out: list[tuple[object, ...]] = []
    records = [Record(line, {"line": n}) for n, line in enumerate(lines, 1)]
    for start in range(0, len(records), 250):
        for r in await engine.process(records[start : start + 250]):
            out.append((r.kind, r.verdict, r.error))
    return out


async def test_a_replay_stores_and_reads_the_same_bytes_both_ways() -> None:
    compiled, python = both()
    lines = generated(3_000, accounts=60, merchants=8)
    lines += lines[:500]  # read back: duplicates of records stored by earlier batches
    assert await replayed(compiled, lines) == await replayed(python, lines)
    assert compiled.data.buckets == python.data.buckets
    assert compiled.data.accounts == python.data.accounts
    assert compiled.data.events == python.data.events
    keys = Keys(
        set(python.data.buckets) | {"absent"},
        set(python.data.accounts) | {"absent"},
        set(python.data.events) | {"absent"},
    )
    assert await compiled.load(keys) == await python.load(keys)


_INT64 = st.integers(-(2**63) + 1, 2**63 - 1)


@given(
    count=_INT64,
    amount=_INT64,
    version=_INT64,
    period_end=st.none() | _INT64,
    expires_at=st.none() | _INT64,
    born=_INT64,
)
def test_a_bucket_is_packed_alike(
    count: int, amount: int, version: int, period_end: int | None, expires_at: int | None, born: int
) -> None:
    assert private(memory, "_fastmemory") is not None, "stores._fastmemory is not built"
    bucket = Bucket(count, amount, version, period_end, expires_at, born)
    packed = private(memory, "_fastmemory").pack_bucket(bucket)
    assert packed == memory._pack_bucket(bucket)
    assert (
        private(memory, "_fastmemory").unpack_bucket(packed)
        == memory._unpack_bucket(packed)
        == bucket
    )


def _record(version: int, expires_at: int | None) -> EventRecord:
    return EventRecord(
        fingerprint="f",
        account_id="acct-1",
        type=EventType.PAYMENT,
        accepted=True,
        seq=1,
        verdict=b'{"event_id":"e1"}',
        amount=100,
        currency="CNY",
        buckets=("k1",),
        occurred=NOW,
        version=version,
        expires_at=expires_at,
        born=(NOW,),
    )


async def _stored(store: MemoryStore) -> None:
    """One bucket, account and event record, each at version 1."""
    await store.commit(
        Writes(
            buckets={"k1": Bucket(1, 100, 1, NOW + 60)},
            accounts={"acct-1": Account(1, 1)},
            events={"e1": _record(1, None)},
        )
    )


_STALE: list[tuple[str, Callable[[], Writes]]] = [
    ("a bucket created again", lambda: Writes(buckets={"k1": Bucket(2, 200, 1, NOW + 60)})),
    ("a bucket a version ahead", lambda: Writes(buckets={"k1": Bucket(2, 200, 3, NOW + 60)})),
    ("a bucket never stored", lambda: Writes(buckets={"k2": Bucket(1, 1, 2, NOW + 60)})),
    ("an account created again", lambda: Writes(accounts={"acct-1": Account(2, 1)})),
    ("an account a version ahead", lambda: Writes(accounts={"acct-1": Account(2, 3)})),
    ("an event created again", lambda: Writes(events={"e1": _record(1, None)})),
    ("an event never stored", lambda: Writes(events={"e2": _record(2, None)})),
]


@pytest.mark.parametrize("name, stale", _STALE, ids=[name for name, _ in _STALE])
async def test_a_stale_write_is_refused_alike_and_changes_nothing(
    name: str, stale: Callable[[], Writes]
) -> None:
    compiled, python = both()
    errors = []
    for store in (compiled, python):
        await _stored(store)
        before = (dict(store.data.buckets), dict(store.data.accounts), dict(store.data.events))
        # a good write beside the stale one: all or nothing
        writes = stale()
        writes.accounts.setdefault("acct-2", Account(1, 1))
        with pytest.raises(ConflictError) as raised:
            await store.commit(writes)
        errors.append(str(raised.value))
        assert (store.data.buckets, store.data.accounts, store.data.events) == before
    assert errors[0] == errors[1]


async def test_an_expiry_other_than_the_one_read_is_a_conflict_alike() -> None:
    compiled, python = both()
    errors = []
    for store in (compiled, python):
        await _stored(store)
        stored = (await store.load(Keys({"k1"}, set(), {"e1"}))).buckets["k1"]
        for writes in (
            Writes(buckets={"k1": Bucket(2, 200, 2, NOW + 60, (stored.expires_at or 0) + 1)}),
            Writes(events={"e1": _record(2, None)}),  # stored with an expiry, written as none
        ):
            with pytest.raises(ConflictError) as raised:
                await store._write(
                    writes,
                    Expected(
                        buckets={k: b.expires_at for k, b in writes.buckets.items()},
                        events={k: r.expires_at for k, r in writes.events.items()},
                    ),
                )
            errors.append(str(raised.value))
    assert errors[:2] == errors[2:]


async def test_a_damaged_record_is_rejected_alike() -> None:
    for store in both():
        await _stored(store)
        store.data.buckets["k1"] = b"\x00" * 7
        with pytest.raises(StoreRejected):
            await store.load(Keys({"k1"}, set(), set()))
        with pytest.raises(struct.error):
            await store.commit(Writes(buckets={"k1": Bucket(2, 200, 2, NOW + 60)}))
        store.data.events["e1"] = b"\x00" * 3
        with pytest.raises(struct.error):
            await store.commit(Writes(events={"e1": _record(2, None)}))


def test_every_attribute_the_compiled_store_reads_is_read_in_its_slot() -> None:
    assert private(memory, "_fastmemory") is not None, "stores._fastmemory is not built"
    fields = private(memory, "_fastmemory").slot_fields()
    assert len(fields) == 33
    assert all(fields.values()), fields


def test_the_built_extension_is_not_older_than_its_source() -> None:
    """An edit to ``_fastmemory.pyx`` (or to the ``_slots`` code it takes in) takes effect
    only once built again."""
    assert_built_after(private(memory, "_fastmemory"), "stores/_fastmemory.pyx", *SLOTS)
