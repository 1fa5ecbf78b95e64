"""A line over ``--max-line-bytes`` is read past, not kept: ``replay`` dead-letters it by
its size and SHA-256. Before, a file with no line ends (a JSON array of gigabytes, a
binary file) was read whole into memory, three times over."""

from __future__ import annotations

import hashlib
import io
import json
import subprocess
import sys
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import streams.replay as replay_module
from schemas.events import JSON_BLANK_BYTES
from streams.engine import Record
from streams.replay import LongLine, read_lines

ROOT = Path(__file__).resolve().parents[2]
BOM = b"\xef\xbb\xbf"


def _expected(lines: list[bytes], limit: int) -> list[tuple[int, bytes | tuple[int, str]]]:
    """(line number, its bytes, or the size and SHA-256 of a line over ``limit``) of each
    non-blank line, as a replay reads them: without line end and a first line's BOM."""
    out: list[tuple[int, bytes | tuple[int, str]]] = []
    for number, line in enumerate(lines, start=1):
        raw = line.rstrip(b"\r\n")
        if number == 1 and raw.startswith(BOM):
            raw = raw[len(BOM) :]
        if not raw.strip(JSON_BLANK_BYTES):
            continue
        kept = raw if len(raw) <= limit else (len(raw), hashlib.sha256(raw).hexdigest())
        out.append((number, kept))
    return out


def _read(data: bytes, limit: int) -> list[tuple[int, bytes | tuple[int, str]]]:
    pending: list[Record] = []
    for _ in read_lines(io.BytesIO(data), 10**6, pending, limit):
        pass
    out: list[tuple[int, bytes | tuple[int, str]]] = []
    for record in pending:
        line = record.source["line"]
        assert isinstance(line, int)
        if isinstance(record, LongLine):
            assert record.raw == b"" and record.limit == limit
            out.append((line, (record.size, record.sha256)))
        else:
            out.append((line, record.raw))
    return out


_LINE = st.lists(
    st.sampled_from([b"a", b"{", b" ", b"\r", b"\t", b"\xef\xbb\xbf", b"\xff", b"\r\r"]),
    max_size=12,
).map(b"".join)


@settings(max_examples=400, deadline=None)
@given(
    lines=st.lists(_LINE, min_size=1, max_size=8),
    ends=st.lists(st.sampled_from([b"\n", b"\r\n", b"\r\r\n"]), min_size=8, max_size=8),
    last_ended=st.booleans(),
    limit=st.integers(0, 14),
    chunk=st.integers(1, 4),
)
def test_each_line_is_kept_or_named_by_size_and_hash_as_a_model_says(
    lines: list[bytes], ends: list[bytes], last_ended: bool, limit: int, chunk: int
) -> None:
    ended = [line + end for line, end in zip(lines, ends, strict=False)]
    if not last_ended:
        ended[-1] = lines[-1]  # the file's last line without its line end
    with mock.patch.object(replay_module, "_CHUNK", chunk):  # lines read in small pieces
        assert _read(b"".join(ended), limit) == _expected(ended, limit)


def test_a_line_of_exactly_the_limit_is_kept_and_one_byte_more_is_not() -> None:
    line = b'{"event_id": "x"}'
    data = line + b"\r\n" + line + b"!\n" + line
    assert _read(data, len(line)) == [
        (1, line),
        (2, (len(line) + 1, hashlib.sha256(line + b"!").hexdigest())),
        (3, line),
    ]


def test_a_replay_dead_letters_a_long_line_and_decides_the_rest(tmp_path: Path) -> None:
    event = {
        "event_id": "e1",
        "account_id": "a1",
        "amount": "1.00",
        "currency": "CNY",
        "occurred_at": "2026-03-14T01:00:00Z",
    }
    long = json.dumps({**event, "event_id": "e2", "note": "x" * 3_000}).encode()
    source = tmp_path / "events.jsonl"
    source.write_bytes(b"\n".join([json.dumps(event).encode(), long, b"", b"[1,"]) + b"\n")
    done = subprocess.run(
        [
            *(sys.executable, "-m", "limitflow", "replay"),
            *("--rules", str(ROOT / "examples" / "rules.yaml"), "--input", str(source)),
            *("--output", "v.jsonl", "--dead-letter", "d.jsonl", "--store", "memory://"),
            *("--max-line-bytes", "2000"),
        ],
        cwd=tmp_path,
        capture_output=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr.decode()
    verdicts = [json.loads(x) for x in (tmp_path / "v.jsonl").read_bytes().splitlines()]
    assert [v["event_id"] for v in verdicts] == ["e1"]
    letters = [json.loads(x) for x in (tmp_path / "d.jsonl").read_bytes().splitlines()]
    assert [x["source"] for x in letters] == [{"line": 2}, {"line": 4}]
    assert letters[0] == {
        "error": "invalid_event",
        "detail": f"a line of {len(long):,} bytes, over the 2,000 a replay takes"
        " (--max-line-bytes): not decided; its size and SHA-256 name it",
        "raw": None,
        "source": {"line": 2},
        "raw_size": len(long),
        "raw_sha256": hashlib.sha256(long).hexdigest(),
    }
    assert letters[1]["error"] == "invalid_json"  # a short line is read as before


class _CarriageReturns(io.RawIOBase):
    """``start``, then ``count`` bytes of \\r, then ``end``: made as they are read, so
    the source holds none of them."""

    def __init__(self, start: bytes, count: int, end: bytes) -> None:
        self.parts: list[bytes | int] = [start, count, end]

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while self.parts:
            part = self.parts[0]
            if isinstance(part, int):
                n = min(part, len(buffer))
                buffer[:n] = b"\r" * n
                self.parts[0] = part - n
            else:
                n = min(len(part), len(buffer))
                buffer[:n] = part[:n]
                self.parts[0] = part[n:]
            if not self.parts[0]:
                self.parts.pop(0)
            if n:
                return n
        return 0


def test_a_long_run_of_carriage_returns_in_a_line_is_read_past_not_held() -> None:
    # a run of \r in a long line was held until the line went on or ended, and copied
    # once more at every chunk read: memory as large as the run, time as its square
    import tracemalloc

    count = 4 * 2**20
    for end, expected in (
        (b"x\n", (8 + count + 1, hashlib.sha256(b'{"a": 1}' + b"\r" * count + b"x").hexdigest())),
        (b"\n", None),  # the line ends at them: its bytes were the first 8
    ):
        source = io.BufferedReader(_CarriageReturns(b'{"a": 1}', count, end))
        pending: list[Record] = []
        tracemalloc.start()
        try:
            for _ in read_lines(source, 10, pending, 1000):
                pass
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak < 2**20, f"{peak:,} bytes held"
        [record] = pending
        if expected is None:
            assert type(record) is Record and record.raw == b'{"a": 1}'
        else:
            assert isinstance(record, LongLine)
            assert (record.size, record.sha256) == expected


@pytest.mark.parametrize("value", ["1_000", "+5", "\u0665", "0", "-3", "2k"])
def test_max_line_bytes_takes_a_whole_number_as_run_s_flags_do(tmp_path: Path, value: str) -> None:
    # int() took 1_000, +5 and other scripts' digits, which run's number flags refuse
    done = subprocess.run(
        [
            *(sys.executable, "-m", "limitflow", "replay"),
            *("--rules", str(ROOT / "examples" / "rules.yaml"), "--input", "-"),
            *("--output", "-", "--dead-letter", "-", "--store", "memory://"),
            *("--max-line-bytes", value),
        ],
        cwd=tmp_path,
        input=b"",
        capture_output=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr.decode()
    assert "--max-line-bytes" in done.stderr.decode()


def test_a_batch_of_long_lines_holds_at_most_batch_bytes_and_one_line() -> None:
    # a batch ended only at its 2,000 lines: lines of up to --max-line-bytes held 2 GB
    # at once, and decoded (1 MB of numbers in an extra field is ~14 MB of objects)
    # ~28 GB, for a replay that takes them one at a time
    line = b'{"pad": "' + b"x" * 900_000 + b'"}\n'
    data = line * 60 + b'{"a": 1}\n' * 5_000
    pending: list[Record] = []
    batches: list[list[Record]] = []
    for _ in read_lines(io.BytesIO(data), 2_000, pending):
        batches.append(pending[:])
        pending.clear()
    batches.append(pending)
    # 19 long lines make 16 MiB; then 3 long lines and 1,997 short ones: short lines
    # still make whole batches, and every line is read once, in order
    assert [len(batch) for batch in batches] == [19, 19, 19, 2_000, 2_000, 1_003]
    assert replay_module.BATCH_BYTES == 16 * 2**20
    assert all(sum(len(r.raw) for r in batch[:-1]) < replay_module.BATCH_BYTES for batch in batches)
    numbers = [r.source["line"] for batch in batches for r in batch]
    assert numbers == list(range(1, 5_061))
