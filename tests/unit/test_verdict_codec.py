"""Verdicts as the sqlite, MongoDB and DynamoDB stores keep them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from stores.verdict_codec import pack_verdict, unpack_verdict

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
