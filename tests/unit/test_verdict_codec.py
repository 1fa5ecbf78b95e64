"""Verdicts as the sqlite, MongoDB and DynamoDB stores keep them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

from stores.verdict_codec import (
    VERDICT_WORDS,
    VerdictCodec,
    dictionary_content,
    pack_verdict,
    unpack_verdict,
)

ROOT = Path(__file__).resolve().parents[2]


def _sample_verdicts() -> list[bytes]:
    command = [sys.executable, "-m", "limitflow", "replay", "--rules", "examples/rules.yaml"]
    done = subprocess.run(
        [*command, "--input", "examples/events.jsonl", "--output", "-", "--dead-letter", "-"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    )
    return [line for line in done.stdout.splitlines() if b'"decision"' in line]


def test_verdicts_come_back_byte_for_byte_and_take_one_dynamodb_write_unit() -> None:
    verdicts = _sample_verdicts()
    assert verdicts
    for verdict in verdicts:
        stored = pack_verdict(verdict)
        assert unpack_verdict(stored) == verdict
        assert unpack_verdict(memoryview(stored)) == verdict  # as sqlite hands a BLOB
        # the rest of an idempotency item is ~250 bytes; DynamoDB bills writes per KB
        assert len(stored) < min(700, len(verdict))


def test_verdicts_stored_before_compression_read_as_they_are() -> None:
    for verdict in _sample_verdicts():
        assert unpack_verdict(verdict) == verdict


def test_verdicts_against_a_dictionary_come_back_and_take_a_quarter_of_the_space() -> None:
    verdicts = _sample_verdicts()
    codec = VerdictCodec(dictionary_content(verdicts[0]))
    for verdict in verdicts:
        stored = codec.pack(verdict)
        assert unpack_verdict(stored, codec) == verdict
        assert unpack_verdict(memoryview(stored), codec) == verdict
        assert len(stored) < len(pack_verdict(verdict)) / 2
        assert len(stored) < len(verdict) / 4
        with pytest.raises(ValueError, match="dictionary"):
            unpack_verdict(stored)  # never read as JSON or as a frame without one
    # and the other forms still read with a codec at hand
    assert unpack_verdict(pack_verdict(verdicts[1]), codec) == verdicts[1]
    assert unpack_verdict(verdicts[1], codec) == verdicts[1]


def test_a_dictionary_holds_nothing_that_names_an_event() -> None:
    """The dictionary outlives the records it was made from: no id, time or amount."""
    assert b'"amount_used":"' in _sample_verdicts()[0]
    for verdict in _sample_verdicts():
        fields = msgspec.json.decode(verdict)
        content = dictionary_content(verdict)
        for name in ("event_id", "account_id", "occurred_at", "amount", "original_event_id"):
            value = fields[name]
            if value:
                assert f'"{value}"'.encode() not in content, name
        assert content.startswith(VERDICT_WORDS)
        kept = msgspec.json.decode(content[len(VERDICT_WORDS) :])
        for entry in kept["limits"] + kept["violations"]:
            for name in ("count_used", "count_remaining", "amount_used", "amount_remaining"):
                assert entry.get(name) in (None, 0, ""), name
            assert entry.get("used", "") == ""
        assert fields["rules_version"].encode() in content  # what verdicts share stays
    assert dictionary_content(b"not json") == VERDICT_WORDS
