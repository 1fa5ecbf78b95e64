"""The memory store's verdicts kept by their shape (``stores._shapes``): every verdict comes
back byte for byte, whatever its text; what cannot be kept so is zstd-compressed."""

from __future__ import annotations

import json

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from benchmarks.generate import events as generated
from handlers.state import EventRecord, Keys, Writes
from schemas.events import EventType
from stores import memory
from stores.memory import Codec, MemoryStore
from stores.verdict_codec import make_dictionary
from tests.unit.built import assert_built_after, optional, private
from tests.unit.test_memory_fast import NOW, replayed

_shapes, needs_shapes = optional("stores._shapes")
pytestmark = needs_shapes

_VERDICT = (
    b'{"event_id":"e-1","account_id":"a-1","type":"payment","decision":"accept",'
    b'"reason":null,"seq":1,"violations":[],"occurred_at":"2026-03-01T00:00:00Z",'
    b'"amount":"10.00","currency":"CNY","original_event_id":null,"rules_version":"v1",'
    b'"limits":[{"rule_id":"r","window":"day","period":"2026-03-01","count_used":1}]}'
)

_json_texts = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
).map(lambda doc: json.dumps(doc, separators=(",", ":")).encode())
"""JSON texts as limitflow writes verdicts (no spaces), of any shape and any escapes."""


@pytest.mark.parametrize("blank", [(), (b'":',)], ids=["all-kept", "values-after-names-left-out"])
@given(st.lists(_json_texts | st.binary(max_size=60), min_size=1, max_size=12))
@example([b'{"a":"x\\\\"}', b'{"a":"x\\""}', b'{"a":"\\"', b'"', b'{"a":1}'])
@example([_VERDICT, _VERDICT.replace(b"e-1", b'e\\"1').replace(b'"seq":1', b'"seq":22')])
@example([b"", b"1", b"-", b'{"a":"', b'{"a":"b\\'])
def test_every_text_comes_back_byte_for_byte(blank: tuple[bytes, ...], texts: list[bytes]) -> None:
    shapes = _shapes.Shapes(blank)
    packed = [shapes.pack(text) for text in texts]
    for text, kept in zip(texts, packed, strict=True):
        assert kept is not None
        assert shapes.unpack(kept) == text


def test_a_verdict_of_a_kept_shape_keeps_only_the_values_that_differ() -> None:
    shapes = _shapes.Shapes()
    shapes.pack(_VERDICT)
    second = _VERDICT.replace(b"e-1", b"e-2").replace(b"10.00", b"12.50")
    kept = shapes.pack(second)
    assert kept is not None
    assert len(shapes) == 1
    # the shape's number, a bitmap of its 15 values, and the two that differ
    assert kept == b"\x00\x81\x00" + b'\x05"e-2"' + b'\x07"12.50"'
    assert shapes.unpack(kept) == second


def test_shapes_that_look_the_same_at_a_glance_are_told_apart() -> None:
    shapes = _shapes.Shapes()
    # one value each, and pieces of the same lengths around it: only their bytes differ
    texts = [b'{"a":1}', b'{"b":1}', b'{"a":2}', b'{"b":3}', b'{"c":1}']
    packed = [shapes.pack(text) for text in texts]
    assert len(shapes) == 3
    assert [kept[:1] if kept else None for kept in packed] == [
        b"\x00",
        b"\x01",
        b"\x00",
        b"\x01",
        b"\x02",
    ]
    assert [shapes.unpack(kept) for kept in packed if kept] == texts


def test_past_the_shapes_kept_a_verdict_is_not_packed() -> None:
    shapes = _shapes.Shapes()
    texts = [b"[" + b"1," * n + b"1]" for n in range(_shapes.MAX_SHAPES + 1)]
    packed = [shapes.pack(text) for text in texts]
    assert None not in packed[:-1]
    assert packed[-1] is None
    assert len(shapes) == _shapes.MAX_SHAPES
    assert shapes.unpack(packed[5]) == texts[5]


@given(st.binary(max_size=40))
def test_bytes_that_pack_never_gave_are_refused_not_read_past(damaged: bytes) -> None:
    shapes = _shapes.Shapes()
    shapes.pack(_VERDICT)
    shapes.pack(b"[1,2,3]")
    try:
        verdict = shapes.unpack(damaged)
    except ValueError:
        return
    # read within its bytes: a text of a kept shape, whose values are those bytes
    assert verdict.startswith((b"{", b"["))


def test_a_damaged_packed_verdict_is_a_value_error() -> None:
    shapes = _shapes.Shapes()
    kept = shapes.pack(_VERDICT)
    assert kept is not None
    for damaged in (b"", b"\x05" + kept[1:], kept[:-1], kept + b"x", b"\x80" * 12):
        with pytest.raises(ValueError, match="packed verdict"):
            shapes.unpack(damaged)


def _compressed(packed: bytes) -> bool:
    """Whether a packed record's body (after its 16-byte header) is a zstd frame."""
    return packed[16:20] == b"\x28\xb5\x2f\xfd"  # zstd's magic number


def _by_shape(packed: bytes) -> bool:
    """Whether a packed record's body is tagged as holding its verdict by shape."""
    return packed[16:17] == b"\x02"


def _record(verdict: bytes) -> EventRecord:
    return EventRecord(
        "f" * 32, "a-1", EventType.PAYMENT, True, 1, verdict, 1000, "CNY", 0, ("k",), 0, 1, None
    )


def test_a_record_whose_verdict_has_no_shape_kept_is_compressed_and_read_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    made: list[bytes] = []

    def recorded(verdict: bytes) -> bytes:
        made.append(verdict)
        return make_dictionary(verdict)

    monkeypatch.setattr(memory, "make_dictionary", recorded)
    codec = Codec()
    assert codec.shapes is not None
    for n in range(_shapes.MAX_SHAPES):
        codec.pack(_record(b"[" + b"1," * n + b"1]"))
    assert made == []  # every verdict had a shape: no dictionary yet
    odd = _record(b'{"odd":[' + b"2," * 300 + b"2]}")
    packed = codec.pack(odd)
    assert _compressed(packed)
    assert made == [odd.verdict]  # made from the first verdict of no shape kept
    assert codec.unpack(packed) == odd
    other = _record(b'{"other":[' + b"3," * 200 + b"3]}")
    assert codec.unpack(codec.pack(other)) == other
    assert len(made) == 1
    shaped = codec.pack(_record(b"[" + b"1," * 7 + b"9]"))
    assert _by_shape(shaped)
    assert codec.unpack(shaped).verdict == b"[" + b"1," * 7 + b"9]"


async def test_past_the_shapes_both_loops_store_compressed_records_that_load_back() -> None:
    stores = MemoryStore(clock=lambda: NOW), MemoryStore(clock=lambda: NOW, compiled=False)
    verdicts = [b"[" + b"1," * n + b"1]" for n in range(_shapes.MAX_SHAPES + 40)]
    records = {f"e{n}": _record(verdict) for n, verdict in enumerate(verdicts)}
    for store in stores:
        for start in range(0, len(records), 100):  # the dictionary made mid-commit
            keys = list(records)[start : start + 100]
            await store.commit(Writes(events={key: records[key] for key in keys}))
        events = store.data.events
        assert all(_by_shape(events[f"e{n}"]) for n in range(_shapes.MAX_SHAPES))
        assert all(_compressed(events[f"e{n}"]) for n in range(_shapes.MAX_SHAPES, len(verdicts)))
        loaded = await store.load(Keys(events=set(records)))
        assert {key: r.verdict for key, r in loaded.events.items()} == {
            key: r.verdict for key, r in records.items()
        }
    assert stores[0].data.events == stores[1].data.events


def test_a_compressed_record_without_a_dictionary_made_is_refused() -> None:
    compressing = Codec(_VERDICT)
    compressing.shapes = None  # every record compressed, as without the extension
    packed = compressing.pack(_record(_VERDICT))
    assert _compressed(packed)
    with pytest.raises(ValueError, match="no dictionary"):
        Codec().unpack(packed)  # a store's records are its own: this one trained none


async def test_a_store_whose_verdicts_all_have_a_shape_trains_no_dictionary(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    made: list[bytes] = []
    monkeypatch.setattr(memory, "make_dictionary", made.append)
    store = MemoryStore()
    lines = generated(2_000, accounts=40, merchants=6)
    first = await replayed(store, lines)
    again = await replayed(store, lines)
    assert [verdict for _, verdict, _ in again] == [verdict for _, verdict, _ in first]
    assert made == []  # ~34 ms a store (the first commit's) no longer spent


async def test_built_without_shapes_every_record_is_compressed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(memory, "_shapes", None)  # as without a C compiler
    # one clock for both: a record's expiry is counted from the store's clock
    compiled = MemoryStore(clock=lambda: NOW)
    python = MemoryStore(clock=lambda: NOW, compiled=False)
    lines = generated(500, accounts=20, merchants=4)
    for store in (compiled, python):
        first = await replayed(store, lines)
        again = await replayed(store, lines)
        assert [verdict for _, verdict, _ in again] == [verdict for _, verdict, _ in first]
        assert all(_compressed(packed) for packed in store.data.events.values())
    assert compiled.data.events == python.data.events


async def test_a_replay_stores_its_verdicts_by_shape_and_resends_get_them_again() -> None:
    store = MemoryStore()
    lines = generated(2_000, accounts=40, merchants=6)
    first = await replayed(store, lines)
    again = await replayed(store, lines)  # every event a resend: its stored verdict
    assert [verdict for _, verdict, _ in again] == [verdict for _, verdict, _ in first]
    assert all(_by_shape(packed) for packed in store.data.events.values())
    codec = store.data.codec
    assert codec is not None and codec.shapes is not None
    assert 0 < len(codec.shapes) < 20


async def test_the_shapes_kept_tell_nothing_of_an_event_or_an_account() -> None:
    store = MemoryStore()
    lines = generated(2_000, accounts=40, merchants=6)
    await replayed(store, lines)
    codec = store.data.codec
    assert codec is not None and codec.shapes is not None
    events = [json.loads(line) for line in lines]
    told = {e[name].encode() for e in events for name in ("event_id", "account_id")}
    told |= {e["occurred_at"].encode() for e in events}
    for text in codec.shapes.texts:
        assert b'"rules_version":"' in text  # what verdicts share is kept
        assert not [value for value in told if value in text]
        assert b'"event_id":,"account_id":,' in text


def test_the_shapes_are_built_from_their_source() -> None:
    assert_built_after(private(memory, "_shapes"), "stores/_shapes.pyx")
