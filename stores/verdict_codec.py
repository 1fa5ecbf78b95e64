"""How the stores that persist verdicts keep them: zstd-compressed.

A verdict explains every applicable rule, so its field names, rule ids and limits repeat
from one verdict to the next; it is most of an idempotency record. Alone, a verdict of
the sample rules compresses to ~37% of its JSON (~460 of ~1,270 bytes): a record then
fits in one DynamoDB write unit (1 KB) instead of two. Against a dictionary trained for
the workload (``make_dictionary``), it compresses to ~14% (~170 bytes) in under half the
time (~2.5 µs instead of ~6 µs): the sqlite store keeps one such dictionary in its file.

Stored forms, told apart by their first byte, all read back:
- ``{``: the JSON itself (records written before compression);
- zstd's magic number: a zstd frame of the verdict alone (``pack_verdict``);
- ``DICTIONARY_TAG``: the tag, then a zstd frame made against the store's dictionary
  (``VerdictCodec``); reading it needs that dictionary.
"""

from __future__ import annotations

import itertools
import random
import string
from collections.abc import Callable, Iterable
from typing import Any, Final

import msgspec
import zstandard

from stores.base import DamagedRecord

_compress: Final = zstandard.ZstdCompressor(level=1, write_checksum=False).compress
_decompress: Final = zstandard.ZstdDecompressor().decompress
_ZSTD_MAGIC: Final = b"\x28\xb5\x2f\xfd"
DICTIONARY_TAG: Final = b"\x01"
"""The first byte of a verdict compressed against a dictionary."""

VERDICT_WORDS: Final = (
    b'{"event_id":"","account_id":"","type":"reversal","decision":"reject","reason":'
    b'"limit_exceeded","seq":,"violations":[{"rule_id":"","metric":"amount","period":"",'
    b'"limit":"","used":""}],"occurred_at":"","amount":"","currency":"",'
    b'"original_event_id":null,"rules_version":"","limits":[{"rule_id":"",'
    b'"window":"transaction","period":"","count_used":,"count_limit":null,'
    b'"count_remaining":null,"amount_used":null,"amount_limit":null,"amount_remaining":null}]}'
)
"""Every field name and word a verdict may hold: the start of a dictionary."""

_IDENTIFYING: Final = ("event_id", "account_id", "original_event_id", "occurred_at", "amount")
_USED: Final = ("count_used", "count_remaining", "amount_used", "amount_remaining", "used")
TELLING: Final = tuple(f'"{name}":'.encode() for name in (*_IDENTIFYING, *_USED, "seq"))
"""What comes before each value of a verdict that tells of its event or account (its
field name): what a dictionary or a shape kept beyond the records leaves out."""


def pack_verdict(verdict: bytes) -> bytes:
    """The verdict as stored without a dictionary (the frame records its size)."""
    return _compress(verdict)


def unpack_verdict(stored: bytes | memoryview, codec: VerdictCodec | None = None) -> bytes:
    """The published verdict bytes of a stored one, in any of its forms; one compressed
    against a dictionary needs ``codec``, made from that dictionary (else ValueError)."""
    data = bytes(stored)
    if data[:1] == DICTIONARY_TAG:
        if codec is None:
            raise DamagedRecord("a verdict compressed against a dictionary, and none was found")
        verdict = codec.decompress(data[1:])
    else:
        verdict = _decompress(data) if data[:4] == _ZSTD_MAGIC else data
    if not verdict or verdict[0] != 0x7B or verdict[-1] != 0x7D:  # {…}, no copies made
        # published again to every resend as it is: a damaged or hand-written one is not
        raise DamagedRecord("a stored verdict that is not a JSON object")
    return verdict


def richest(verdicts: Iterable[bytes], look_at: int = 100) -> bytes | None:
    """The verdict to make a store's dictionary from, among the first ``look_at`` of
    ``verdicts``: the longest, which explains the most rules (a reversal's explains
    none), or None when there are none."""
    return max(itertools.islice(verdicts, look_at), key=len, default=None)


def make_dictionary(verdict: bytes) -> bytes:
    """A zstd dictionary for the verdicts of a workload, trained from one of them.

    Trained, the dictionary carries entropy tables as well as content: a verdict then
    compresses in ~2 µs to ~130 bytes, where against its content alone (the fallback,
    ``dictionary_content``) it took ~3-6 µs, most of it building the tables again for
    every verdict. The samples are ``verdict`` disguised: every letter and digit of its
    ids, time, amount and usage replaced at random (the form kept, the values gone), in
    copies as it is, as a rejection and as a reversal. The dictionary outlives every
    record (they expire; it stays), so it must tell nothing of a payment or an account:
    what it keeps of ``verdict`` is what every verdict of the rules shares (field names,
    rule ids, windows, limits, the rules version) and its periods.
    """
    fields = _verdict_fields(verdict)
    if fields is None:  # not a verdict: the words will do
        return VERDICT_WORDS
    chance = random.Random(0)  # noqa: S311 - not for security: the same dictionary each time
    samples: list[bytes | bytearray | memoryview] = [
        msgspec.json.encode(_disguised(fields, chance, n % 4)) for n in range(_SAMPLES)
    ]
    try:
        return zstandard.train_dictionary(_DICTIONARY_BYTES, samples).as_bytes()
    except zstandard.ZstdError:  # too little to train on: the content is the dictionary
        return dictionary_content(verdict)


_SAMPLES: Final = 128
_DICTIONARY_BYTES: Final = 4096


def _verdict_fields(verdict: bytes) -> dict[str, Any] | None:
    try:
        fields = msgspec.json.decode(verdict)
    except msgspec.DecodeError:
        return None
    return fields if isinstance(fields, dict) else None


def _disguised(fields: dict[str, Any], chance: random.Random, kind: int) -> dict[str, Any]:
    """A copy of a verdict's ``fields`` with every value that tells of its event made up,
    as it is (``kind`` 0, 1), as a rejection (2) or as a reversal (3)."""
    made: dict[str, Any] = msgspec.json.decode(msgspec.json.encode(fields))  # a deep copy
    for name in _IDENTIFYING:
        made[name] = _made_up(made.get(name), chance, letters=name != "occurred_at")
    for entry in [*_objects(made.get("limits")), *_objects(made.get("violations"))]:
        for name in _USED:
            entry[name] = _made_up(entry.get(name), chance)
    if "seq" in made:
        made["seq"] = chance.randrange(1, 1000)
    limits = _objects(made.get("limits"))
    if kind == 2 and limits:
        limit = limits[0]
        made["decision"], made["reason"] = "reject", "limit_exceeded"
        made["violations"] = [
            {
                "rule_id": limit.get("rule_id"),
                "metric": metric,
                "period": limit.get("period"),
                "limit": str(limit.get(f"{metric}_limit") or 0),
                "used": _made_up(str(limit.get(f"{metric}_limit") or 0), chance),
            }
            for metric in ("count", "amount")
        ]
    elif kind == 3:
        made["type"], made["limits"], made["violations"] = "reversal", [], []
        made["original_event_id"] = _made_up(fields.get("event_id") or "e", chance)
        made["reason"] = chance.choice([None, "original_not_found", "already_reversed"])
        made["decision"] = "accept" if made["reason"] is None else "reject"
    return made


def _made_up(value: object, chance: random.Random, *, letters: bool = True) -> object:
    """``value`` with each ASCII digit and (with ``letters``) letter replaced by a random
    one of its kind, and anything else not ASCII by a random letter; numbers made up
    alike. (A time keeps its letters: T and Z are its form.)"""
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        return chance.randrange(0, 10 ** len(str(abs(value))))
    if not isinstance(value, str):
        return value
    out = []
    for char in value:
        if "0" <= char <= "9":
            out.append(chance.choice(string.digits))
        elif not char.isascii() or (letters and "a" <= char <= "z"):
            out.append(chance.choice(string.ascii_lowercase))
        elif letters and "A" <= char <= "Z":
            out.append(chance.choice(string.ascii_uppercase))
        else:
            out.append(char)
    return "".join(out)


def dictionary_content(verdict: bytes) -> bytes:
    """A dictionary of content only, for when there is too little to train on: the
    verdict words, then ``verdict`` without what tells of its event (ids, time, amount,
    sequence, and the amounts and counts used)."""
    fields = _verdict_fields(verdict)
    if fields is None:
        return VERDICT_WORDS
    for name in _IDENTIFYING:
        if name in fields:
            fields[name] = ""
    if "seq" in fields:
        fields["seq"] = 0
    for entry in [*_objects(fields.get("limits")), *_objects(fields.get("violations"))]:
        for name in _USED:
            if entry.get(name) is not None:
                entry[name] = 0 if name.startswith("count") else ""
    return VERDICT_WORDS + msgspec.json.encode(fields)


def _objects(items: object) -> list[dict[str, object]]:
    return [item for item in items if isinstance(item, dict)] if isinstance(items, list) else []


def zstd_pair(
    dictionary: bytes,
) -> tuple[Callable[[bytes], bytes], Callable[[bytes | memoryview], bytes]]:
    """zstd's compress and decompress against ``dictionary`` (level 1, frames without a
    checksum or the dictionary's id). A trained dictionary starts with zstd's dictionary
    magic number, one of content never does (it starts with "{"): AUTO tells them apart."""
    zdict = zstandard.ZstdCompressionDict(dictionary, dict_type=zstandard.DICT_TYPE_AUTO)
    compress = zstandard.ZstdCompressor(
        level=1, dict_data=zdict, write_checksum=False, write_dict_id=False
    ).compress
    return compress, zstandard.ZstdDecompressor(dict_data=zdict).decompress


class VerdictCodec:
    """Packs verdicts against a dictionary (``make_dictionary``'s, trained, or one of
    content only)."""

    __slots__ = ("_compress", "decompress", "dictionary")

    def __init__(self, dictionary: bytes) -> None:
        self.dictionary = dictionary
        self._compress, self.decompress = zstd_pair(dictionary)

    def pack(self, verdict: bytes) -> bytes:
        """``verdict`` as stored: the tag, then its frame."""
        return DICTIONARY_TAG + self._compress(verdict)
