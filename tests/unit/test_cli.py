"""The CLI as a user runs it: ``python -m limitflow`` in a subprocess, files in tmp_path."""

from __future__ import annotations

import base64
import importlib.util
import json
import os
import platform
import signal
import socket
import sqlite3
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from contextlib import closing, contextmanager, suppress
from pathlib import Path
from typing import Any

import pytest

from tests.signals import catches, needs_proc

RULES = textwrap.dedent(
    """\
    rules:
      - id: acct-day-2            # two payments per account per UTC day
        window: day
        max_count: 2
      - id: single-usd            # no single USD payment over 100.00
        window: transaction
        currency: USD
        max_amount: "100.00"
    """
)


def pay(event_id: str, account: str = "a1", amount: str = "10.00", day: str = "2026-01-31") -> str:
    return json.dumps(
        {
            "event_id": event_id,
            "account_id": account,
            "amount": amount,
            "currency": "USD",
            "occurred_at": f"{day}T10:00:00Z",
        }
    )


def reverse(event_id: str, original: str, account: str = "a1") -> str:
    return json.dumps(
        {
            "event_id": event_id,
            "type": "reversal",
            "account_id": account,
            "original_event_id": original,
            "occurred_at": "2026-01-31T11:00:00Z",
        }
    )


# Line numbers matter: dead letters report them.
FILE_A = [
    pay("p1"),  # 1 accept, a1 seq 1
    "",  # 2 blank
    pay("p2", amount="150.00"),  # 3 reject: single-usd, a1 seq 2
    "this is not json",  # 4 invalid_json
    pay("p3", amount="20.00"),  # 5 accept, a1 seq 3 (second of the day)
    "   \t ",  # 6 blank
    pay("p4", amount="5.00"),  # 7 reject: acct-day-2, a1 seq 4
    "[1, 2]",  # 8 invalid_event
    pay("p1"),  # 9 duplicate of line 1
    pay("p1", amount="11.00"),  # 10 idempotency_conflict
    pay("q1", account="a2"),  # 11 accept, a2 seq 1
    reverse("r1", "p3"),  # 12 accept, a1 seq 5: releases p3's count
    pay("p5", amount="1.00"),  # 13 accept, a1 seq 6 (the count is back to one)
]
FILE_A_VERDICTS = [
    ("p1", "accept", None, 1),
    ("p2", "reject", "limit_exceeded", 2),
    ("p3", "accept", None, 3),
    ("p4", "reject", "limit_exceeded", 4),
    ("p1", "accept", None, 1),
    ("q1", "accept", None, 1),
    ("r1", "accept", None, 5),
    ("p5", "accept", None, 6),
]
FILE_A_DEAD = [("invalid_json", 4), ("invalid_event", 8), ("idempotency_conflict", 10)]
FILE_A_SUMMARY = "11 events: 5 accepted, 2 rejected, 1 duplicate, 3 dead letters"


def limitflow(
    *args: str, cwd: Path, stdin: bytes | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "limitflow", *args],
        cwd=cwd,
        env=env,
        input=stdin,
        capture_output=True,
        timeout=120,
        check=False,
    )


def write(path: Path, lines: list[str], end: str = "\n") -> Path:
    path.write_bytes("".join(line + end for line in lines).encode())
    return path


def jsonl(data: bytes) -> list[dict[str, Any]]:
    return [json.loads(line) for line in data.splitlines()]


def summary(verdicts: list[dict[str, Any]]) -> list[tuple[str, str, str | None, int]]:
    return [(v["event_id"], v["decision"], v["reason"], v["seq"]) for v in verdicts]


def one_line_reason(result: subprocess.CompletedProcess[bytes]) -> str:
    """The error message of a failed run, checked to be a single line."""
    assert result.returncode != 0
    text = result.stderr.decode()
    assert text.endswith("\n")
    assert text.count("\n") == 1, text
    assert text.startswith("limitflow: ")
    return text.strip()


@pytest.fixture
def rules(tmp_path: Path) -> Path:
    path = tmp_path / "rules.yaml"
    path.write_text(RULES, encoding="utf-8")
    return path


class Replay:
    """Runs ``limitflow replay`` on lines, into fresh output files."""

    def __init__(self, tmp_path: Path, rules: Path) -> None:
        self.dir = tmp_path
        self.rules = rules
        self.runs = 0

    def __call__(
        self, lines: list[str], store: str = "memory://"
    ) -> tuple[subprocess.CompletedProcess[bytes], bytes, bytes]:
        self.runs += 1
        source = write(self.dir / f"in{self.runs}.jsonl", lines)
        output, dead = self.dir / f"out{self.runs}.jsonl", self.dir / f"dead{self.runs}.jsonl"
        result = limitflow(
            "replay",
            *("--rules", str(self.rules), "--input", str(source)),
            *("--output", str(output), "--dead-letter", str(dead), "--store", store),
            cwd=self.dir,
        )
        assert result.returncode == 0, result.stderr.decode()
        return result, output.read_bytes(), dead.read_bytes()


@pytest.fixture
def replay(tmp_path: Path, rules: Path) -> Replay:
    return Replay(tmp_path, rules)


# --- replay with files -------------------------------------------------------------------


class Run:
    """One finished ``limitflow replay``: its process, verdicts and dead letters."""

    def __init__(self, result: subprocess.CompletedProcess[bytes], out: bytes, dead: bytes):
        self.result, self.out, self.dead = result, out, dead
        self.verdicts, self.letters = jsonl(out), jsonl(dead)


@pytest.fixture(scope="module")
def run_a(tmp_path_factory: pytest.TempPathFactory) -> Run:
    """FILE_A replayed once into ``memory://``, shared by the tests that only read it."""
    tmp = tmp_path_factory.mktemp("file-a")
    (tmp / "rules.yaml").write_text(RULES, encoding="utf-8")
    return Run(*Replay(tmp, tmp / "rules.yaml")(FILE_A))


def test_replay_decides_every_line_in_input_order(run_a: Run) -> None:
    assert summary(run_a.verdicts) == FILE_A_VERDICTS
    assert [(d["error"], d["source"]["line"]) for d in run_a.letters] == FILE_A_DEAD
    non_blank = [line for line in FILE_A if line.strip()]
    assert len(run_a.verdicts) + len(run_a.letters) == len(non_blank) == 11


def test_replay_exits_0_with_dead_letters_and_prints_a_summary(run_a: Run) -> None:
    assert run_a.result.returncode == 0
    assert run_a.result.stdout == b""
    assert run_a.result.stderr.decode().startswith(FILE_A_SUMMARY)


def test_verdicts_explain_violations(run_a: Run) -> None:
    verdicts = run_a.verdicts
    assert verdicts[1]["violations"] == [
        {
            "rule_id": "single-usd",
            "metric": "amount",
            "period": "transaction",
            "limit": "100.00",
            "used": "0.00",
        }
    ]
    assert verdicts[3]["violations"] == [
        {
            "rule_id": "acct-day-2",
            "metric": "count",
            "period": "2026-01-31",
            "limit": "2",
            "used": "2",
        }
    ]
    assert all(v["violations"] == [] for v in verdicts if v["decision"] == "accept")


def test_a_duplicate_repeats_the_original_verdict_byte_for_byte(run_a: Run) -> None:
    lines = run_a.out.splitlines()
    assert lines[4] == lines[0]


def test_dead_letters_carry_error_detail_raw_and_line(run_a: Run) -> None:
    letters = run_a.letters
    assert [d["raw"] for d in letters] == [FILE_A[3], FILE_A[7], FILE_A[9]]
    assert [d["source"] for d in letters] == [{"line": 4}, {"line": 8}, {"line": 10}]
    for letter in letters:
        assert isinstance(letter["detail"], str) and letter["detail"]
    assert letters[0]["detail"].startswith("not valid JSON")
    assert letters[1]["detail"] == "an event must be a JSON object"
    assert "p1" in letters[2]["detail"]


NON_UTF8 = b'{"event_id": "caf\xe9", "account_id": "a1"}'
NAIVE = json.dumps(
    {
        "event_id": "n1",
        "account_id": "a1",
        "amount": "1.00",
        "currency": "USD",
        "occurred_at": "2026-01-31T10:00:00",
    }
)
FAR = json.dumps(
    {
        "event_id": "far",
        "account_id": "a1",
        "amount": "1.00",
        "currency": "USD",
        "occurred_at": "9999-12-31T23:59:59-12:00",
    }
)
ODD_LINES = [
    pay("x1", amount="1.005").encode(),  # 1 too many fraction digits
    b"",  # 2
    NAIVE.encode(),  # 3 no offset
    NON_UTF8,  # 4 not UTF-8
    FAR.encode(),  # 5 an instant whose year leaves the calendar in some zone
    b"  ",  # 6
    pay("p1").encode(),  # 7 accept
    b"oops",  # 8
]


@pytest.fixture(scope="module")
def odd_run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    """Awkward input with CRLF line endings, replayed once into ``memory://``."""
    tmp = tmp_path_factory.mktemp("odd")
    (tmp / "rules.yaml").write_text(RULES, encoding="utf-8")
    (tmp / "in.jsonl").write_bytes(b"".join(line + b"\r\n" for line in ODD_LINES))
    result = limitflow(*_replay_args("rules.yaml", "in.jsonl"), cwd=tmp)
    assert result.returncode == 0, result.stderr.decode()
    return Run(result, (tmp / "out.jsonl").read_bytes(), (tmp / "dead.jsonl").read_bytes())


def test_odd_lines_each_end_up_in_one_output(odd_run: Run) -> None:
    assert summary(odd_run.verdicts) == [("p1", "accept", None, 1)]
    assert [(d["error"], d["source"]["line"]) for d in odd_run.letters] == [
        ("invalid_event", 1),
        ("invalid_event", 3),
        ("invalid_json", 4),
        ("invalid_event", 5),
        ("invalid_json", 8),
    ]
    assert odd_run.result.stderr.decode().startswith("6 events: 1 accepted, 0 rejected")


def test_dead_letter_detail_names_the_field(odd_run: Run) -> None:
    details = [d["detail"] for d in odd_run.letters]
    assert details[0].startswith("amount: ")
    assert details[1].startswith("occurred_at: ")
    assert details[3].startswith("occurred_at: ")


def test_crlf_line_endings_are_not_part_of_the_record(odd_run: Run) -> None:
    assert odd_run.letters[-1]["raw"] == "oops"
    assert odd_run.letters[0]["raw"] == ODD_LINES[0].decode()


def test_a_non_utf8_line_is_dead_lettered_with_its_exact_bytes(odd_run: Run) -> None:
    letter = odd_run.letters[2]
    # "raw" is text; bytes that are not UTF-8 travel in raw_base64 instead
    assert letter["raw"] is None
    assert base64.b64decode(letter["raw_base64"]) == NON_UTF8


def test_a_number_out_of_decimals_range_is_a_dead_letter_and_the_replay_goes_on(
    replay: Replay, tmp_path: Path
) -> None:
    # it stopped replay with a traceback, the lines before it in its batch in neither
    # output, and a sqlite store stuck on it on every rerun
    huge = pay("p2")[:-1] + ', "x": 1e99999999999999999999}'
    lines = [pay("p1"), huge, pay("p3")]
    result, out, dead = replay(lines, store=f"sqlite:///{tmp_path / 'store.db'}")
    assert summary(jsonl(out)) == [("p1", "accept", None, 1), ("p3", "accept", None, 2)]
    assert [(d["error"], d["source"]["line"], d["raw"]) for d in jsonl(dead)] == [
        ("invalid_json", 2, huge)
    ]
    assert result.stderr.decode().startswith("3 events: 2 accepted")


def test_an_input_of_only_blank_lines_gives_empty_outputs(replay: Replay) -> None:
    result, out, dead = replay(["", "  ", "\t"])
    assert (out, dead) == (b"", b"")
    assert result.stderr.decode().startswith("0 events: ")


@pytest.mark.parametrize("odd", ["\x0b", "\x0c", " \x0c\t"])
def test_a_line_of_whitespace_json_does_not_know_is_dead_lettered(replay: Replay, odd: str) -> None:
    # bytes.strip() takes vertical tab and form feed for blanks; JSON does not: such a
    # line is bad input, and every non-blank line ends up in one of the outputs
    _, out, dead = replay(["", odd, "  "])
    assert out == b""
    letters = jsonl(dead)
    assert [(d["error"], d["source"]["line"], d["raw"]) for d in letters] == [
        ("invalid_json", 2, odd)
    ]


# --- stdin and stdout --------------------------------------------------------------------


def test_dash_reads_stdin_and_writes_stdout(tmp_path: Path, rules: Path, run_a: Run) -> None:
    stdin = "".join(line + "\n" for line in FILE_A).encode()
    result = limitflow(
        "replay",
        *("--rules", str(rules), "--input", "-", "--output", "-"),
        *("--dead-letter", "dead.jsonl", "--store", "memory://"),
        cwd=tmp_path,
        stdin=stdin,
    )
    assert result.returncode == 0
    assert result.stdout == run_a.out
    assert (tmp_path / "dead.jsonl").read_bytes() == run_a.dead
    assert result.stderr.decode().startswith(FILE_A_SUMMARY)


def test_dead_letters_can_go_to_stdout(tmp_path: Path, rules: Path) -> None:
    result = limitflow(
        "replay",
        *("--rules", str(rules), "--input", "-", "--output", "out.jsonl"),
        *("--dead-letter", "-", "--store", "memory://"),
        cwd=tmp_path,
        stdin=b"nope\n" + pay("p1").encode() + b"\n",
    )
    assert result.returncode == 0
    assert [(d["error"], d["source"]) for d in jsonl(result.stdout)] == [
        ("invalid_json", {"line": 1})
    ]
    assert summary(jsonl((tmp_path / "out.jsonl").read_bytes())) == [("p1", "accept", None, 1)]


def test_both_outputs_on_stdout_come_in_input_order(tmp_path: Path, rules: Path) -> None:
    result = limitflow(
        "replay",
        *("--rules", str(rules), "--input", "-", "--output", "-"),
        *("--dead-letter", "-", "--store", "memory://"),
        cwd=tmp_path,
        stdin=b"nope\n" + pay("p1").encode() + b"\n{}\n" + pay("p2").encode() + b"\n",
    )
    assert result.returncode == 0
    lines = jsonl(result.stdout)
    assert [d.get("error") or d["event_id"] for d in lines] == [
        "invalid_json",
        "p1",
        "invalid_event",
        "p2",
    ]


def test_one_file_for_both_outputs_keeps_every_line_in_input_order(
    tmp_path: Path, rules: Path
) -> None:
    source = write(tmp_path / "in.jsonl", ["nope", pay("p1"), "{}", pay("p2")])
    result = limitflow(
        "replay",
        *("--rules", str(rules), "--input", str(source), "--output", "all.jsonl"),
        # the same file by another name: opening it twice, each truncating and writing
        # from its own position, overwrote lines
        *("--dead-letter", str(tmp_path / "." / "all.jsonl"), "--store", "memory://"),
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    lines = jsonl((tmp_path / "all.jsonl").read_bytes())
    assert [d.get("error") or d["event_id"] for d in lines] == [
        "invalid_json",
        "p1",
        "invalid_event",
        "p2",
    ]


def test_one_file_reached_two_ways_is_still_one_file(tmp_path: Path, rules: Path) -> None:
    # by a symlinked folder (the file not there yet), and as - and /dev/stdout
    source = write(tmp_path / "in.jsonl", ["nope", pay("p1"), "{}", pay("p2")])
    (tmp_path / "d1").mkdir()
    (tmp_path / "d2").symlink_to(tmp_path / "d1")
    result = limitflow(
        *("replay", "--rules", str(rules), "--input", str(source)),
        *("--output", "d1/all.jsonl", "--dead-letter", "d2/all.jsonl", "--store", "memory://"),
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    expected = ["invalid_json", "p1", "invalid_event", "p2"]
    lines = jsonl((tmp_path / "d1" / "all.jsonl").read_bytes())
    assert [d.get("error") or d["event_id"] for d in lines] == expected
    # either way round, and standard output redirected to the output named: with - the
    # second, each was written from its own offset and one overwrote the other's lines
    for output, dead_letter in (
        ("-", "/dev/stdout"),
        ("/dev/stdout", "-"),
        ("out.jsonl", "-"),
    ):
        with open(tmp_path / "out.jsonl", "wb") as out:
            subprocess.run(
                [
                    *(sys.executable, "-m", "limitflow", "replay", "--rules", str(rules)),
                    *("--input", str(source), "--output", output, "--dead-letter", dead_letter),
                    *("--store", "memory://"),
                ],
                stdout=out,
                check=True,
                cwd=tmp_path,
                timeout=120,
            )
        lines = jsonl((tmp_path / "out.jsonl").read_bytes())
        assert [d.get("error") or d["event_id"] for d in lines] == expected, (output, dead_letter)


def test_a_non_blocking_stdin_is_waited_on_not_taken_for_its_end(tmp_path: Path) -> None:
    # a pipe whose O_NONBLOCK the starter set: the first read finding it empty ended the
    # input, exit 0, with its last line cut short as an invalid_json dead letter and the
    # rest of the events never read
    rules = write(tmp_path / "rules.yaml", [RULES])
    lines = [pay(f"e{n}", account=f"a{n}").encode() + b"\n" for n in range(40)]
    data = b"".join(lines)
    cut = len(lines[0]) * 20 + 7  # in the middle of a line
    read_end, write_end = os.pipe()
    os.set_blocking(read_end, False)
    with open(read_end, "rb") as stdin:
        proc = subprocess.Popen(
            [
                *(sys.executable, "-m", "limitflow", "replay", "--rules", str(rules)),
                *("--input", "-", "--output", "v.jsonl", "--dead-letter", "d.jsonl"),
                *("--store", "memory://"),
            ],
            cwd=tmp_path,
            stdin=stdin,
            stderr=subprocess.PIPE,
        )
    with open(write_end, "wb", buffering=0) as writer:
        writer.write(data[:cut])
        time.sleep(2)  # the replay has read all there is, and finds the pipe empty
        with suppress(BrokenPipeError):  # as it did: it had ended
            writer.write(data[cut:])
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err.decode()
    assert (tmp_path / "d.jsonl").read_bytes() == b""
    verdicts = [json.loads(line) for line in (tmp_path / "v.jsonl").read_bytes().splitlines()]
    assert [v["event_id"] for v in verdicts] == [f"e{n}" for n in range(40)]


def test_a_non_blocking_stdout_is_waited_on_not_written_in_part(tmp_path: Path) -> None:
    # a pipe whose O_NONBLOCK the starter set, its reader slower than the replay: the
    # writes that found it full wrote part of the verdicts and dropped the rest without
    # a word, and the replay ended with exit 0
    rules = write(tmp_path / "rules.yaml", [RULES])
    note = "x" * 2_000  # verdicts of more than the pipe holds (64 KiB)
    lines = [pay(f"e{n}", account=f"a{n}")[:-1] + f', "note": "{note}"}}\n' for n in range(200)]
    source = write(tmp_path / "events.jsonl", ["".join(lines)])
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)
    with open(write_end, "wb") as stdout:
        proc = subprocess.Popen(
            [
                *(sys.executable, "-m", "limitflow", "replay", "--rules", str(rules)),
                *("--input", str(source), "--output", "-", "--dead-letter", "d.jsonl"),
                *("--store", "memory://"),
            ],
            cwd=tmp_path,
            stdout=stdout,
            stderr=subprocess.PIPE,
        )
    with open(read_end, "rb") as reader:
        time.sleep(2)  # the replay has filled the pipe
        out = reader.read()
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err.decode()
    assert out.count(b"\n") == 200 and out.endswith(b"\n")
    verdicts = [json.loads(line) for line in out.splitlines()]
    assert [v["event_id"] for v in verdicts] == [f"e{n}" for n in range(200)]


def test_a_non_blocking_stdout_is_waited_on_by_a_command_s_answer(tmp_path: Path) -> None:
    # as the replay's verdicts: Python's print dropped what found the pipe full without a
    # word, and `rules check` of 3,000 rules ended with exit 0, its listing cut short
    body = "".join(f"  - {{id: rule-{n:05d}, window: day, max_count: 5}}\n" for n in range(3000))
    (tmp_path / "many.yaml").write_text("rules:\n" + body, encoding="utf-8")
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)
    with open(write_end, "wb") as stdout:
        proc = subprocess.Popen(
            [sys.executable, "-m", "limitflow", "rules", "check", "many.yaml"],
            cwd=tmp_path,
            stdout=stdout,
            stderr=subprocess.PIPE,
        )
    with open(read_end, "rb") as reader:
        time.sleep(2)  # the listing has filled the pipe
        out = reader.read()
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err.decode()
    lines = out.decode().splitlines()
    assert lines[0].startswith("many.yaml: 3000 rules, version ")
    assert [line.split(":")[0].strip() for line in lines[1:3001]] == [
        f"rule-{n:05d}" for n in range(3000)
    ]


def test_stdin_redirected_from_the_output_file_is_refused(tmp_path: Path, rules: Path) -> None:
    source = write(tmp_path / "in.jsonl", [pay("p1")])
    before = source.read_bytes()
    with open(source, "rb") as stdin:
        result = subprocess.run(
            [
                *(sys.executable, "-m", "limitflow", "replay", "--rules", str(rules)),
                *("--input", "-", "--output", "in.jsonl", "--dead-letter", "dead.jsonl"),
                *("--store", "memory://"),
            ],
            stdin=stdin,
            capture_output=True,
            check=False,
            cwd=tmp_path,
            timeout=120,
        )
    assert result.returncode == 2
    assert "is the input file" in one_line_reason(result)
    assert source.read_bytes() == before


@pytest.mark.parametrize("option", ["--output", "--dead-letter"])
def test_an_output_that_is_the_input_file_is_refused_and_the_input_kept(
    tmp_path: Path, rules: Path, option: str
) -> None:
    source = write(tmp_path / "in.jsonl", [pay("p1")])
    before = source.read_bytes()
    args = _replay_args(rules, source)
    args[args.index(option) + 1] = "in.jsonl"
    result = limitflow(*args, cwd=tmp_path)
    assert result.returncode == 2
    assert "is the input file" in one_line_reason(result)
    assert source.read_bytes() == before


def test_a_byte_order_mark_starting_the_file_is_not_part_of_the_first_event(
    tmp_path: Path, rules: Path
) -> None:
    source = tmp_path / "in.jsonl"
    source.write_bytes(b"\xef\xbb\xbf" + pay("p1").encode() + b"\n" + pay("p2").encode() + b"\n")
    result = limitflow(*_replay_args(rules, source), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "dead.jsonl").read_bytes() == b""
    assert [v["event_id"] for v in jsonl((tmp_path / "out.jsonl").read_bytes())] == ["p1", "p2"]


# --- failures: non-zero with a one-line reason -------------------------------------------


def _replay_args(rules: Path | str, source: Path | str, store: str = "memory://") -> list[str]:
    return [
        "replay",
        *("--rules", str(rules), "--input", str(source)),
        *("--output", "out.jsonl", "--dead-letter", "dead.jsonl", "--store", store),
    ]


@pytest.mark.parametrize(
    ("text", "names"),
    [
        ("rules:\n  - {id: r-bad, window: fortnight, max_count: 1}\n", ["r-bad", "window"]),
        ("rules: [\n", ["not valid YAML"]),
        ("rules: []\n", ["no rules"]),
    ],
)
def test_a_bad_rules_file_fails_before_anything_is_processed(
    tmp_path: Path, text: str, names: list[str]
) -> None:
    (tmp_path / "bad.yaml").write_text(text, encoding="utf-8")
    source = write(tmp_path / "in.jsonl", [pay("p1")])
    result = limitflow(*_replay_args("bad.yaml", source), cwd=tmp_path)
    assert result.returncode == 2
    reason = one_line_reason(result)
    assert reason.startswith("limitflow: rules: bad.yaml: ")  # which file, too
    for name in names:
        assert name in reason
    assert not (tmp_path / "out.jsonl").exists()
    assert not (tmp_path / "dead.jsonl").exists()


def test_a_missing_rules_file_fails(tmp_path: Path) -> None:
    source = write(tmp_path / "in.jsonl", [pay("p1")])
    result = limitflow(*_replay_args("missing.yaml", source), cwd=tmp_path)
    assert result.returncode == 2
    assert one_line_reason(result) == (
        "limitflow: rules: cannot read rules file missing.yaml: No such file or directory"
    )


def test_a_missing_input_fails(tmp_path: Path, rules: Path) -> None:
    result = limitflow(*_replay_args(rules, "missing.jsonl"), cwd=tmp_path)
    assert result.returncode == 1
    assert one_line_reason(result) == (
        "limitflow: cannot open missing.jsonl: No such file or directory"
    )


def test_a_missing_input_leaves_no_store_file_behind(tmp_path: Path, rules: Path) -> None:
    result = limitflow(*_replay_args(rules, "missing.jsonl", "sqlite:///state.db"), cwd=tmp_path)
    assert result.returncode == 1
    assert not (tmp_path / "state.db").exists()


def test_a_directory_as_input_fails(tmp_path: Path, rules: Path) -> None:
    (tmp_path / "events").mkdir()
    result = limitflow(*_replay_args(rules, "events"), cwd=tmp_path)
    assert result.returncode == 1
    assert one_line_reason(result) == "limitflow: cannot open events: Is a directory"


@pytest.mark.parametrize(
    "store",
    ["foo://", "sqlite://", "sqlite:///no-such-dir/state.db", "memory://x", "memory:///x"],
)
def test_an_unusable_store_fails(tmp_path: Path, rules: Path, store: str) -> None:
    source = write(tmp_path / "in.jsonl", [pay("p1")])
    result = limitflow(*_replay_args(rules, source, store), cwd=tmp_path)
    assert result.returncode == 3
    reason = one_line_reason(result)
    assert reason.startswith("limitflow: store: ")
    assert not (tmp_path / "no-such-dir").exists()
    if store == "foo://":
        assert "memory://" in reason and "sqlite://" in reason
    if store.startswith("sqlite:///no"):  # what to write for the absolute path
        assert reason.endswith(
            f"(a relative path, from {tmp_path}; an absolute one takes four slashes:"
            " sqlite:////no-such-dir/state.db)"
        )
    if store.startswith("memory"):
        assert reason == f"limitflow: store: {store}: expected memory:// (it takes no host or path)"


def test_a_relative_store_path_whose_folder_exists_gets_no_four_slash_hint(
    tmp_path: Path, rules: Path
) -> None:
    # the hint was given for any relative path that failed: in a folder that exists but
    # cannot be written (read-only), it pointed at the wrong slip
    source = write(tmp_path / "in.jsonl", [pay("p1")])
    (tmp_path / "state.db").mkdir()  # a folder where the file should be: cannot be opened
    result = limitflow(*_replay_args(rules, source, "sqlite:///state.db"), cwd=tmp_path)
    assert result.returncode == 3
    reason = one_line_reason(result)
    assert reason.startswith("limitflow: store: cannot open SQLite database state.db")
    assert "four slashes" not in reason


@pytest.mark.parametrize(
    "tables",
    [
        "CREATE TABLE events (id TEXT PRIMARY KEY, payload TEXT)",
        # tables of limitflow's names that are not its: common names
        "CREATE TABLE customers (id INTEGER); CREATE TABLE events (id INTEGER, kind TEXT)",
        "CREATE TABLE users (id INTEGER); CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT)",
    ],
)
def test_a_sqlite_file_of_another_program_with_the_same_table_names_is_refused(
    tmp_path: Path, rules: Path, tables: str
) -> None:
    # its own events table: "no such column" read as an outage, which run retries for
    # ever with /readyz 503, instead of the one line and exit 3 of any other such file.
    # Then refused at the first commit, once limitflow had added its tables to the file,
    # a `born` column to that program's table, and the rules' meanings
    with closing(sqlite3.connect(tmp_path / "other.db")) as db:
        db.executescript(tables)
    schema = _schema(tmp_path / "other.db")
    source = write(tmp_path / "in.jsonl", [pay("p1")])
    result = limitflow(*_replay_args(rules, source, "sqlite:///other.db"), cwd=tmp_path)
    assert result.returncode == 3
    reason = one_line_reason(result)
    name = "meta" if "meta" in tables else "events"
    assert reason == (
        f"limitflow: store: other.db holds a table of another program under the name of"
        f" one of limitflow's ({name}): give limitflow a file of its own"
    )
    assert _schema(tmp_path / "other.db") == schema  # nothing added, nothing altered
    # nor by `store init`, which said "ready", and no start could use the file
    init = limitflow("store", "init", "--store", "sqlite:///other.db", cwd=tmp_path)
    assert init.returncode == 3
    assert one_line_reason(init) == reason
    assert _schema(tmp_path / "other.db") == schema


def _schema(path: Path) -> list[tuple[str, list[str]]]:
    """Each table of a sqlite file, with its columns."""
    with closing(sqlite3.connect(path)) as db:
        names = [n for (n,) in db.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        return [(n, [c[1] for c in db.execute(f"PRAGMA table_info({n})")]) for n in names]


@pytest.mark.parametrize(
    "query",
    [
        "bucket_retention_days=-1",  # every bucket written already expired: no limit held
        "event_retention_days=0",  # every resend decided again
        "bucket_retention_days=inf",  # was an OverflowError traceback
        "event_retention_days=nan",
        "bucket_retention_days=0.000001",  # under a second
        "event_retention_days=ten",
        # the first was taken, and an override appended to the URL ignored
        "event_retention_days=400&event_retention_days=abc",
    ],
)
def test_a_retention_that_cannot_keep_state_is_refused(
    tmp_path: Path, rules: Path, query: str
) -> None:
    source = write(tmp_path / "in.jsonl", [pay("p1")])
    result = limitflow(*_replay_args(rules, source, f"memory://?{query}"), cwd=tmp_path)
    assert result.returncode == 3
    assert one_line_reason(result).startswith(f"limitflow: store: {query.split('=')[0]}: ")


@pytest.mark.parametrize("days", ["1e308", "1e306", "1e12"])
def test_a_retention_past_the_latest_expiry_keeps_records_until_then(days: str) -> None:
    # 1e308 days is past what a float holds in seconds: an OverflowError traceback
    from stores import embedded
    from stores.base import LATEST_EXPIRY

    retention, _ = embedded(f"memory://?bucket_retention_days={days}&event_retention_days={days}")
    assert retention.bucket_seconds == retention.event_seconds == LATEST_EXPIRY


def test_a_replay_with_a_retention_past_the_latest_expiry_runs(tmp_path: Path, rules: Path) -> None:
    source = write(tmp_path / "in.jsonl", [pay("p1"), pay("p1")])
    url = f"sqlite:///{tmp_path / 'state.db'}?bucket_retention_days=1e308"
    result = limitflow(*_replay_args(rules, source, url), cwd=tmp_path)
    assert result.returncode == 0, result.stderr.decode()
    assert b"1 duplicate" in result.stderr


# --- replay --dry-run: decided against a store, nothing stored --------------------------


def _store_rows(path: Path) -> list[list[Any]]:
    with closing(sqlite3.connect(path)) as db:
        tables = [t for (t,) in db.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        return [sorted(db.execute(f"SELECT * FROM {table}")) for table in sorted(tables)]


@pytest.fixture
def store_a(tmp_path: Path, replay: Replay) -> Path:
    """A sqlite store's file, FILE_A replayed into it."""
    path = tmp_path / "state.db"
    replay(FILE_A, f"sqlite:///{path}")
    return path


def test_a_dry_run_gives_the_verdicts_a_replay_would_and_stores_nothing(
    tmp_path: Path, rules: Path, replay: Replay, store_a: Path
) -> None:
    path, store = store_a, f"sqlite:///{store_a}"
    before = _store_rows(path)
    later = [
        pay("p6"),  # rejected: a1's day holds two payments
        reverse("r2", "p5"),  # releases p5
        pay("p7"),  # accepted: it sees the reversal before it, in the same dry run
        pay("q2", account="a2"),
        pay("p1"),  # decided before: its stored verdict again
        pay("n1", account="a9"),
    ]
    source = write(tmp_path / "later.jsonl", later)
    dry = limitflow(
        "replay",
        *("--rules", str(rules), "--input", str(source), "--store", store, "--dry-run"),
        *("--output", str(tmp_path / "dry.jsonl"), "--dead-letter", str(tmp_path / "d.jsonl")),
        "--batch-size",
        "2",  # later batches see what the earlier ones decided
        cwd=tmp_path,
    )
    assert dry.returncode == 0, dry.stderr.decode()
    assert dry.stderr.decode().endswith("s (a dry run: nothing was stored)\n")
    assert _store_rows(path) == before
    _, out, dead = replay(later, store)  # the same events, stored this time
    assert (tmp_path / "dry.jsonl").read_bytes() == out
    assert dead == b"" and (tmp_path / "d.jsonl").read_bytes() == b""
    assert summary(jsonl(out))[:3] == [
        ("p6", "reject", "limit_exceeded", 7),
        ("r2", "accept", None, 8),
        ("p7", "accept", None, 9),
    ]
    assert _store_rows(path) != before


def test_a_dry_run_keeps_no_new_rule_and_refuses_a_changed_one(
    tmp_path: Path, store_a: Path
) -> None:
    path, store = store_a, f"sqlite:///{store_a}"
    before = _store_rows(path)
    grown = tmp_path / "grown.yaml"
    grown.write_text(RULES + "  - id: acct-week\n    window: week\n    max_count: 9\n")
    source = write(tmp_path / "one.jsonl", [pay("p9")])
    argv = ["replay", "--input", str(source), "--store", store, "--dry-run"]
    argv += ["--output", str(tmp_path / "o.jsonl"), "--dead-letter", str(tmp_path / "d.jsonl")]
    assert limitflow(*argv, "--rules", str(grown), cwd=tmp_path).returncode == 0
    assert _store_rows(path) == before  # acct-week's meaning is not kept
    changed = tmp_path / "changed.yaml"
    changed.write_text(RULES.replace("window: day", "window: day\n    timezone: Asia/Tokyo"))
    refused = limitflow(*argv, "--rules", str(changed), cwd=tmp_path)
    assert refused.returncode == 2
    assert one_line_reason(refused).startswith(
        "limitflow: rules: rule 'acct-day-2': the store keeps its day counters for timezone UTC"
    )


def test_a_dry_run_on_a_store_not_made_yet_makes_none(tmp_path: Path, rules: Path) -> None:
    source = write(tmp_path / "one.jsonl", [pay("p1")])
    result = limitflow(
        "replay",
        *("--rules", str(rules), "--input", str(source), "--dry-run"),
        *("--store", f"sqlite:///{tmp_path / 'none.db'}"),
        *("--output", str(tmp_path / "o.jsonl"), "--dead-letter", str(tmp_path / "d.jsonl")),
        cwd=tmp_path,
    )
    assert result.returncode == 3
    assert "no store there yet; a dry run decides against the counters" in one_line_reason(result)
    assert not (tmp_path / "none.db").exists()
    assert not (tmp_path / "o.jsonl").exists()


def test_a_dry_run_on_a_store_of_an_older_version_says_to_run_store_init(
    tmp_path: Path, rules: Path, store_a: Path
) -> None:
    # a file made before 2026-11-24 has no `born` columns: a replay or a run adds them,
    # a dry run may not, and read the file as another program's ("no such column")
    with closing(sqlite3.connect(store_a)) as db:
        db.execute("ALTER TABLE buckets DROP COLUMN born")
        db.execute("ALTER TABLE events DROP COLUMN born")
    before = _store_rows(store_a)
    source = write(tmp_path / "one.jsonl", [pay("p9")])
    args = [
        *("replay", "--rules", str(rules), "--input", str(source), "--dry-run"),
        *("--store", f"sqlite:///{store_a}"),
        *("--output", str(tmp_path / "o.jsonl"), "--dead-letter", str(tmp_path / "d.jsonl")),
    ]
    result = limitflow(*args, cwd=tmp_path)
    assert result.returncode == 3
    assert one_line_reason(result) == (
        f"limitflow: store: {store_a} was made by an older version of limitflow (no column"
        " buckets.born, events.born; a replay or a run adds what is missing, a dry run writes"
        " nothing):"
        f" run `limitflow store init --store 'sqlite:///{store_a}'`"
    )
    assert _store_rows(store_a) == before
    assert not (tmp_path / "o.jsonl").exists()
    assert (
        limitflow("store", "init", "--store", f"sqlite:///{store_a}", cwd=tmp_path).returncode == 0
    )
    done = limitflow(*args, cwd=tmp_path)
    assert done.returncode == 0, done.stderr.decode()


@pytest.mark.parametrize("made", ["older", "no-tables"])
def test_rules_check_and_forget_rule_take_a_sqlite_file_a_start_would_take(
    tmp_path: Path, rules: Path, store_a: Path, made: str
) -> None:
    # a file of a version before 2026-11-24 (no `born` columns, no meta table), or one
    # made and left without tables: a replay or a run adds what is missing, and keeps no
    # meaning there before it. Both commands said "run `limitflow store init`" (exit 3),
    # which, on a file older consumers still wrote, broke their inserts
    if made == "older":
        with closing(sqlite3.connect(store_a)) as db:
            db.execute("ALTER TABLE buckets DROP COLUMN born")
            db.execute("ALTER TABLE events DROP COLUMN born")
            db.execute("DROP TABLE meta")
    else:
        store_a.unlink()
        with closing(sqlite3.connect(store_a)) as db:
            db.execute("PRAGMA journal_mode=WAL")  # the header alone, as an open makes it
    before = store_a.read_bytes()
    store = f"sqlite:///{store_a}"
    checked = limitflow("rules", "check", str(rules), "--store", store, cwd=tmp_path)
    assert checked.returncode == 0, checked.stderr.decode()
    assert checked.stdout.decode().endswith(
        f"{store}: takes these rules (none kept there yet, 1 new: kept at the first start,"
        " 1 transaction rule (no counters))\n"
    )
    forget = limitflow("store", "forget-rule", "acct-day-2", "--store", store, cwd=tmp_path)
    assert forget.returncode == 0, forget.stderr.decode()
    assert forget.stdout.decode() == f"{store}: keeps nothing for rule 'acct-day-2'\n"
    assert store_a.read_bytes() == before
    # and a start takes it, as the check said
    source = write(tmp_path / "one.jsonl", [pay("p9")])
    started = limitflow(
        *("replay", "--rules", str(rules), "--input", str(source), "--store", store),
        *("--output", str(tmp_path / "o.jsonl"), "--dead-letter", str(tmp_path / "d.jsonl")),
        cwd=tmp_path,
    )
    assert started.returncode == 0, started.stderr.decode()


@pytest.mark.parametrize("command", ["dry-run", "rules-check"])
def test_a_command_that_writes_nothing_leaves_the_file_s_journal_mode(
    tmp_path: Path, rules: Path, store_a: Path, command: str
) -> None:
    # a copy made by `VACUUM INTO` (the way to snapshot a store in use) is in rollback
    # mode: the file's header said WAL once a dry run or a check had opened it
    copy = tmp_path / "copy.db"
    with closing(sqlite3.connect(store_a)) as db:
        db.execute(f"VACUUM INTO '{copy}'")
    before = copy.read_bytes()
    store = f"sqlite:///{copy}"
    args = {
        "dry-run": [
            *("replay", "--rules", str(rules), "--dry-run", "--store", store),
            *("--input", str(write(tmp_path / "one.jsonl", [pay("p9")]))),
            *("--output", str(tmp_path / "o.jsonl"), "--dead-letter", str(tmp_path / "d.jsonl")),
        ],
        "rules-check": ["rules", "check", str(rules), "--store", store],
    }[command]
    result = limitflow(*args, cwd=tmp_path)
    assert result.returncode == 0, result.stderr.decode()
    assert copy.read_bytes() == before
    with closing(sqlite3.connect(copy)) as db:
        assert db.execute("PRAGMA journal_mode").fetchone() == ("delete",)


@pytest.mark.parametrize("command", ["dry-run", "rules-check", "forget-rule"])
def test_a_command_that_writes_nothing_refuses_another_program_s_file(
    tmp_path: Path, rules: Path, command: str
) -> None:
    # they advised `limitflow store init`, which would put limitflow's tables into it
    other = tmp_path / "shop.db"
    with closing(sqlite3.connect(other)) as db:
        db.executescript("CREATE TABLE customers (id INTEGER); CREATE TABLE orders (id INTEGER);")
    store = f"sqlite:///{other}"
    args = {
        "dry-run": [
            *("replay", "--rules", str(rules), "--dry-run", "--store", store),
            *("--input", str(write(tmp_path / "one.jsonl", [pay("p1")]))),
            *("--output", str(tmp_path / "o.jsonl"), "--dead-letter", str(tmp_path / "d.jsonl")),
        ],
        "rules-check": ["rules", "check", str(rules), "--store", store],
        "forget-rule": ["store", "forget-rule", "acct-day-cny", "--store", store],
    }[command]
    result = limitflow(*args, cwd=tmp_path)
    assert result.returncode == 3
    assert one_line_reason(result) == (
        f"limitflow: store: {other} holds tables of another program (customers, orders) and"
        " none of limitflow's: give limitflow a file of its own (`limitflow store init` adds"
        " its tables there all the same)"
    )


# --- stores: sqlite is durable, memory is not -------------------------------------------


def test_sqlite_state_survives_between_runs(tmp_path: Path, replay: Replay) -> None:
    store = f"sqlite:///{tmp_path / 'state.db'}"
    _, first_out, first_dead = replay(FILE_A, store)
    assert summary(jsonl(first_out)) == FILE_A_VERDICTS

    # a later file continues from the saved state: seq goes on, counts add up, and a
    # payment of the first run can be reversed
    later = [
        pay("p6"),
        pay("q2", account="a2"),
        reverse("r2", "p5"),
        pay("p7", day="2026-02-01"),
    ]
    _, out, dead = replay(later, store)
    assert dead == b""
    verdicts = jsonl(out)
    assert summary(verdicts) == [
        ("p6", "reject", "limit_exceeded", 7),  # p1 and p5 already used a1's day
        ("q2", "accept", None, 2),
        ("r2", "accept", None, 8),  # releases p5: one payment left on 2026-01-31
        ("p7", "accept", None, 9),
    ]
    assert verdicts[0]["violations"][0]["used"] == "2"

    # the same file again: identical verdicts (all duplicates) and the same dead letters
    result, again_out, again_dead = replay(FILE_A, store)
    assert again_out == first_out
    assert again_dead == first_dead
    assert result.stderr.decode().startswith(
        "11 events: 0 accepted, 0 rejected, 8 duplicates, 3 dead letters"
    )

    # ... which changed nothing: seq goes on from 9, and 2026-01-31 still holds one payment
    _, out, _ = replay([pay("p8"), pay("p9")], store)
    verdicts = jsonl(out)
    assert summary(verdicts) == [
        ("p8", "accept", None, 10),
        ("p9", "reject", "limit_exceeded", 11),
    ]
    assert verdicts[1]["violations"][0]["used"] == "2"


def test_an_absurd_amount_is_a_dead_letter_not_a_store_crash(
    tmp_path: Path, replay: Replay
) -> None:
    # 10^25 minor units: no store keeps it (SQLite raised OverflowError and the run died)
    store = f"sqlite:///{tmp_path / 'state.db'}"
    _, out, dead = replay([pay("huge", amount="99999999999999999999999.00"), pay("p1")], store)
    assert [v["event_id"] for v in jsonl(out)] == ["p1"]
    (letter,) = jsonl(dead)
    assert (letter["error"], letter["event_id"]) == ("invalid_event", "huge")
    assert "too large" in letter["detail"]


def test_each_store_batches_its_own_way_and_the_outputs_are_the_same(tmp_path: Path) -> None:
    """memory:// decides in batches of 500 unless told (sqlite:// in 2,000): payments,
    resends and reversals across batch boundaries come out the same either way."""
    from benchmarks.generate import events
    from stores.memory import MemoryStore
    from stores.sqlite import SqliteStore

    assert (MemoryStore.replay_batch_size, SqliteStore.replay_batch_size) == (500, 2_000)
    source = tmp_path / "events.jsonl"
    source.write_bytes(b"\n".join(events(2_300, accounts=60, merchants=5)) + b"\n")
    rules = Path(__file__).resolve().parents[2] / "examples" / "rules.yaml"
    outputs = []
    for n, extra in enumerate(
        (
            ("--store", "memory://"),
            ("--store", "memory://", "--batch-size", "5000"),
            ("--store", f"sqlite:///{tmp_path / 'state.db'}"),
        )
    ):
        out, dead = tmp_path / f"out{n}.jsonl", tmp_path / f"dead{n}.jsonl"
        result = limitflow(
            "replay",
            *("--rules", str(rules), "--input", str(source)),
            *("--output", str(out), "--dead-letter", str(dead), *extra),
            cwd=tmp_path,
        )
        assert result.returncode == 0, result.stderr.decode()
        outputs.append((out.read_bytes(), dead.read_bytes()))
    assert outputs[0] == outputs[1] == outputs[2]
    verdicts = jsonl(outputs[0][0])
    assert {v["type"] for v in verdicts} == {"payment", "reversal"}
    assert len({v["event_id"] for v in verdicts}) < len(verdicts)  # resends among them


@pytest.mark.parametrize("size", ["0", "-3", "ten"])
def test_a_batch_size_not_above_0_is_a_usage_error(tmp_path: Path, rules: Path, size: str) -> None:
    source = write(tmp_path / "in.jsonl", [pay("p1")])
    result = limitflow(
        "replay",
        *("--rules", str(rules), "--input", str(source), "--store", "memory://"),
        *("--output", str(tmp_path / "out"), "--dead-letter", str(tmp_path / "dead")),
        *("--batch-size", size),
        cwd=tmp_path,
    )
    assert result.returncode == 2
    assert "--batch-size" in result.stderr.decode()
    assert not (tmp_path / "out").exists()


def test_memory_state_is_gone_after_the_run(run_a: Run, replay: Replay) -> None:
    # run_a replayed FILE_A into memory:// already; a new run starts from nothing
    _, out, _ = replay([pay("p6"), pay("p1")], "memory://")
    assert summary(jsonl(out)) == [("p6", "accept", None, 1), ("p1", "accept", None, 2)]


def test_the_default_store_is_a_sqlite_file_in_the_working_directory(
    tmp_path: Path, rules: Path
) -> None:
    source = write(tmp_path / "in.jsonl", [pay("p1")])
    args = ["replay", "--rules", str(rules), "--input", str(source)]
    first = limitflow(*args, "--output", "-", "--dead-letter", "dead.jsonl", cwd=tmp_path)
    again = limitflow(*args, "--output", "-", "--dead-letter", "dead.jsonl", cwd=tmp_path)
    assert (tmp_path / "limitflow.db").is_file()
    assert first.returncode == again.returncode == 0
    assert again.stdout == first.stdout
    assert again.stderr.decode().startswith("1 event: 0 accepted, 0 rejected, 1 duplicate,")


# --- rules check ---------------------------------------------------------------------------


def test_rules_check_summarises_a_valid_file(tmp_path: Path, rules: Path) -> None:
    result = limitflow("rules", "check", "rules.yaml", cwd=tmp_path)
    assert result.returncode == 0
    lines = result.stdout.decode().splitlines()
    assert lines[0].startswith("rules.yaml: 2 rules, version ")
    assert lines[1:] == [
        "  acct-day-2: count <= 2, per account_id, day (UTC)",
        "  single-usd: amount <= 100.00 USD, each payment alone (those with account_id)",
    ]


def test_rules_check_notes_when_too_many_rules_may_apply_to_one_event(tmp_path: Path) -> None:
    body = "".join(f"  - {{id: r{n}, window: day, max_count: 9}}\n" for n in range(90))
    body += "".join(
        f"  - {{id: c{n}, window: day, currency: CNY, max_count: 9}}\n" for n in range(8)
    )
    body += "  - {id: u, window: day, currency: USD, max_count: 9}\n"
    (tmp_path / "wide.yaml").write_text("rules:\n" + body, encoding="utf-8")
    result = limitflow("rules", "check", "wide.yaml", cwd=tmp_path)
    assert result.returncode == 0
    assert result.stdout.decode().splitlines()[-1] == (
        "note: up to 98 rules may apply to one event; an event that more than 200 apply to"
        " (97 on DynamoDB) becomes an invalid_event dead letter"
    )
    (tmp_path / "narrow.yaml").write_text("rules:\n" + body[: body.index("  - {id: c1,")])
    result = limitflow("rules", "check", "narrow.yaml", cwd=tmp_path)
    assert "note:" not in result.stdout.decode()


def test_rules_check_counts_match_in_how_many_rules_may_apply_to_one_event(
    tmp_path: Path,
) -> None:
    """An issuer's 1,000 rules by MCC, each listing a few of 500 codes, meet an event a
    handful at a time: no note, where counting by currency alone said 1,000. Rules on
    two fields add up (the value that most rules list, on each), with those of the
    event's currency and those without a match."""
    body = "".join(
        f"  - {{id: m{n}, window: day, currency: CNY, max_count: 9,"
        f" match: {{mcc: ['{n % 500:04d}', '{(n + 1) % 500:04d}']}}}}\n"
        for n in range(1_000)
    )  # each MCC is listed by 4 rules
    body += "".join(
        f"  - {{id: ch{n}, window: day, max_count: 9, match: {{channel: [atm]}}}}\n"
        for n in range(90)
    )
    (tmp_path / "mcc.yaml").write_text("rules:\n" + body, encoding="utf-8")
    result = limitflow("rules", "check", "mcc.yaml", cwd=tmp_path)
    assert result.returncode == 0
    assert "note:" not in result.stdout.decode()  # 4 + 90
    more = "".join(f"  - {{id: any{n}, window: hour, max_count: 9}}\n" for n in range(4))
    (tmp_path / "mcc.yaml").write_text("rules:\n" + body + more, encoding="utf-8")
    result = limitflow("rules", "check", "mcc.yaml", cwd=tmp_path)
    assert (
        result.stdout.decode()
        .splitlines()[-1]
        .startswith("note: up to 98 rules may apply to one event;")
    )


DRIVERS = ("aioboto3", "aiobotocore", "boto3", "botocore", "pymongo", "aiokafka", "faust")
"""What only a server's store or Kafka needs: the AWS SDK alone takes ~0.5 s to import,
paid at every start (`rules check` took 0.8 s instead of 0.3 when it read DynamoDB's
commit limit from the store's class)."""
LOADED = (
    "import sys\nfrom limitflow.cli import main\ncode = main(sys.argv[1:])\n"
    "print(*sorted({m.split('.')[0] for m in sys.modules}), file=sys.stderr)\n"
    "sys.exit(code)\n"
)


@pytest.mark.parametrize("command", ["rules check", "replay memory", "replay sqlite"])
def test_commands_without_a_server_load_no_driver(
    tmp_path: Path, rules: Path, command: str
) -> None:
    """A check in a deploy pipeline, or a replay on an embedded store, starts without
    loading a driver it does not use."""
    source = write(tmp_path / "in.jsonl", [pay("p1")])
    argv = ["rules", "check", "rules.yaml"]
    if command != "rules check":
        store = "memory://" if command == "replay memory" else f"sqlite:///{tmp_path / 's.db'}"
        argv = ["replay", "--rules", "rules.yaml", "--input", str(source), "--store", store]
        argv += ["--output", str(tmp_path / "out.jsonl"), "--dead-letter", "dead.jsonl"]
    result = subprocess.run(
        [sys.executable, "-c", LOADED, *argv], cwd=tmp_path, capture_output=True, check=False
    )
    assert result.returncode == 0, result.stderr.decode()
    loaded = set(result.stderr.decode().splitlines()[-1].split())
    assert "yaml" in loaded  # the probe saw the command's imports
    assert loaded.isdisjoint(DRIVERS), sorted(loaded & set(DRIVERS))


def test_rules_check_fails_on_a_bad_file(tmp_path: Path) -> None:
    (tmp_path / "bad.yaml").write_text(
        "rules:\n"
        "  - {id: ok, window: day, max_count: 1}\n"
        "  - {id: ok, window: hour, max_count: 1}\n",
        encoding="utf-8",
    )
    result = limitflow("rules", "check", "bad.yaml", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stdout == b""
    assert one_line_reason(result) == (
        "limitflow: rules: bad.yaml: rule 'ok': id: used by more than one rule"
    )


def test_rules_check_fails_on_a_missing_file(tmp_path: Path) -> None:
    result = limitflow("rules", "check", "missing.yaml", cwd=tmp_path)
    assert result.returncode == 2
    assert one_line_reason(result).startswith("limitflow: rules: cannot read rules file")


# -- found by an operator's review of replay ------------------------------------------


def _stderr_once_ended(proc: subprocess.Popen[bytes], timeout: float) -> bytes:
    """The standard error of ``proc`` once it has ended, within ``timeout`` seconds; if
    it has not, it is killed and its pipes closed all the same."""
    with proc:
        try:
            return proc.communicate(timeout=timeout)[1]
        finally:
            proc.kill()


def test_a_first_signal_ends_a_replay_after_its_batch_and_a_rerun_completes_it(
    tmp_path: Path,
) -> None:
    # Ctrl-C reached the replay only when it had finished the whole file, which then
    # exited 130 all the same
    events = [
        pay(f"e{n}", account=f"a{n % 50}", day=f"2026-01-{n % 28 + 1:02d}") for n in range(60_000)
    ]
    source = write(tmp_path / "events.jsonl", events)
    rules = write(tmp_path / "rules.yaml", [RULES])
    args = ["--rules", str(rules), "--input", str(source), "--batch-size", "200"]
    store = ["--store", f"sqlite:///{tmp_path / 'state.db'}"]
    out = tmp_path / "v1.jsonl"
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "limitflow", "replay", *args, *store),
            *("--output", str(out), "--dead-letter", str(tmp_path / "d1.jsonl")),
        ],
        cwd=tmp_path,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 60
    while not (out.exists() and out.stat().st_size) and time.monotonic() < deadline:
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGINT)
    err = _stderr_once_ended(proc, 30)
    assert proc.returncode == 130, err.decode()
    assert b"stopped by a signal after" in err and b"Traceback" not in err
    first = out.read_bytes().splitlines()
    assert 0 < len(first) < len(events)  # whole batches, decided and written

    again = limitflow(
        "replay", *args, *store, "--output", "v2.jsonl", "--dead-letter", "d2.jsonl", cwd=tmp_path
    )
    clean = limitflow(
        "replay",
        *args,
        "--store",
        "memory://",
        "--output",
        "v3.jsonl",
        "--dead-letter",
        "d3.jsonl",
        cwd=tmp_path,
    )
    assert again.returncode == clean.returncode == 0
    complete = (tmp_path / "v3.jsonl").read_bytes().splitlines()
    assert (tmp_path / "v2.jsonl").read_bytes().splitlines() == complete
    assert first == complete[: len(first)]


@pytest.mark.parametrize("dry_run", [False, True])
def test_a_signal_while_a_replay_waits_on_a_pipe_decides_the_lines_read_before_it(
    tmp_path: Path, dry_run: bool
) -> None:
    # the lines read into the batch in hand were dropped: 0 verdicts, 0 dead letters, and
    # "stopped after 0 events; they are decided and written", while 100 events had been
    # taken from the pipe, which cannot be read again (a dry run did not say how many)
    read = {"x86_64": "0", "aarch64": "63"}.get(platform.machine())
    if read is None:
        pytest.skip("the read system call's number on this machine is not known here")
    rules = write(tmp_path / "rules.yaml", [RULES])
    out = tmp_path / "v.jsonl"
    store = f"sqlite:///{tmp_path / 'state.db'}"
    if dry_run:  # on a store that exists
        assert limitflow("store", "init", "--store", store, cwd=tmp_path).returncode == 0
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "limitflow", "replay", "--rules", str(rules)),
            *("--input", "-", "--store", store, *(["--dry-run"] if dry_run else [])),
            *("--output", str(out), "--dead-letter", str(tmp_path / "d.jsonl")),
        ],
        cwd=tmp_path,
        stdin=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdin is not None
    lines = [pay(f"e{n}", account=f"a{n % 7}").encode() for n in range(100)]
    proc.stdin.write(b"\n".join([*lines, b"", b""]))  # a blank line last: line 101
    proc.stdin.flush()  # and the pipe stays open: the replay waits for more
    # until it waits in a read of its standard input, all that was sent read
    in_syscall = Path(f"/proc/{proc.pid}/syscall")
    deadline = time.monotonic() + 60
    while in_syscall.read_text().split()[:2] != [read, "0x0"] and time.monotonic() < deadline:
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGINT)
    err = _stderr_once_ended(proc, 30)
    assert proc.returncode == 130, err.decode()
    assert b"Traceback" not in err
    said = "stopped by a signal after 100 events (input lines 1-100); " + (
        "a dry run stores nothing"
        if dry_run
        else "they are decided and written. Send the same input again on the same store to finish"
    )
    assert said in err.decode()
    verdicts = [json.loads(line) for line in out.read_bytes().splitlines()]
    assert [v["event_id"] for v in verdicts] == [f"e{n}" for n in range(100)]


@contextmanager
def _waiting_for_the_lock(
    store: Path, args: list[str], cwd: Path
) -> Iterator[tuple[subprocess.Popen[bytes], sqlite3.Connection, Path]]:
    """``limitflow ARGS`` started while another connection holds ``store``'s write lock
    (the holder, yielded with it and the file of its standard error), once the process
    sleeps in SQLite's wait for it; killed at the end if it has not ended."""
    sleeps = {"x86_64": ("35", "230"), "aarch64": ("101", "115")}.get(platform.machine())
    if sleeps is None:  # nanosleep, clock_nanosleep
        pytest.skip("the sleep system calls' numbers on this machine are not known here")
    err = cwd / "stderr"
    with closing(sqlite3.connect(store, isolation_level=None)) as holder, open(err, "wb") as sink:
        holder.execute("BEGIN IMMEDIATE")  # another process's write lock, held
        proc = subprocess.Popen([sys.executable, "-m", "limitflow", *args], cwd=cwd, stderr=sink)
        try:
            in_syscall = Path(f"/proc/{proc.pid}/syscall")
            deadline = time.monotonic() + 60
            while in_syscall.read_text().split()[0] not in sleeps:
                assert proc.poll() is None, err.read_text(errors="replace")
                assert time.monotonic() < deadline, "never waited for the lock"
                time.sleep(0.02)
            yield proc, holder, err
        finally:
            proc.kill()
            proc.wait()


def test_a_second_signal_stops_a_replay_waiting_for_another_process_s_write_lock(
    tmp_path: Path,
) -> None:
    # SQLite waited for the lock inside one call, for up to 30 s, where no signal handler
    # runs: "a second Ctrl-C stops at once" took until the other process let go
    rules = write(tmp_path / "rules.yaml", [RULES])
    source = write(tmp_path / "events.jsonl", [pay(f"e{n}") for n in range(10)])
    store = tmp_path / "state.db"
    args = ["replay", "--rules", str(rules), "--input", str(source)]
    args += ["--store", f"sqlite:///{store}", "--dead-letter", "d.jsonl"]
    assert limitflow(*args, "--output", "v0.jsonl", cwd=tmp_path).returncode == 0
    again = write(tmp_path / "more.jsonl", [pay(f"f{n}") for n in range(10)])
    args[args.index(str(source))] = str(again)
    with _waiting_for_the_lock(store, [*args, "--output", "v1.jsonl"], tmp_path) as (
        proc,
        holder,
        err,
    ):
        os.kill(proc.pid, signal.SIGINT)
        # the second once the first is said: a fixed 0.3 s could end before the handler
        # ran, in SQLite's busy wait, and the two signals then were one
        deadline = time.monotonic() + 20
        while "finishing the batch in hand" not in err.read_text() and proc.poll() is None:
            assert time.monotonic() < deadline, err.read_text()
            time.sleep(0.02)
        os.kill(proc.pid, signal.SIGINT)
        started = time.monotonic()
        proc.wait(timeout=20)
        waited = time.monotonic() - started
        holder.execute("ROLLBACK")
    assert proc.returncode == 130, err.read_text()
    assert "stopping now" in err.read_text()
    assert waited < 5, err.read_text()
    assert (tmp_path / "v1.jsonl").read_bytes() == b""  # nothing decided was stored


def test_a_signal_while_a_replay_waits_to_keep_a_new_rule_stops_it_keeping_nothing(
    tmp_path: Path,
) -> None:
    # the first Ctrl-C was noted but the wait for the lock went on, and once the other
    # process let go the new rule's meaning was kept: "nothing was decided or written",
    # and a corrected rules file (the zone it should have had) was then refused
    rules = write(tmp_path / "rules.yaml", [RULES])
    store = tmp_path / "state.db"
    args = ["--store", f"sqlite:///{store}", "--dead-letter", "d.jsonl"]
    first = write(tmp_path / "events.jsonl", [pay("e1")])
    done = limitflow(
        *("replay", "--rules", str(rules), "--input", str(first), "--output", "v0.jsonl"),
        *args,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr.decode()
    weekly = "  - id: acct-week-9\n    window: week\n    timezone: Asia/Tokyo\n    max_count: 9\n"
    more = write(tmp_path / "more.yaml", [RULES + weekly])
    replay = ["replay", "--rules", str(more), "--input", str(first), "--output", "v1.jsonl"]
    with _waiting_for_the_lock(store, [*replay, *args], tmp_path) as (proc, holder, err):
        os.kill(proc.pid, signal.SIGINT)
        started = time.monotonic()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            holder.execute("ROLLBACK")
            proc.wait(timeout=60)
            pytest.fail(f"the stop waited for the lock: {err.read_text()}")
        waited = time.monotonic() - started
        holder.execute("ROLLBACK")
    assert proc.returncode == 130, err.read_text()
    assert "stopped before the replay started: nothing was decided or written" in err.read_text()
    assert waited < 5
    with closing(sqlite3.connect(store)) as db:
        kept = [name for (name,) in db.execute("SELECT name FROM meta")]
    assert not [name for name in kept if "acct-week-9" in name], kept
    assert not (tmp_path / "v1.jsonl").exists()


@pytest.mark.parametrize(("signals", "code"), [(1, 0), (2, 130)])
def test_a_signal_as_a_finished_replay_s_event_loop_closes_keeps_its_exit_code(
    tmp_path: Path, signals: int, code: int
) -> None:
    # the replay put the default actions back before the event loop had closed: a SIGTERM
    # there ended a finished replay with 143 (in 8 of 40 tries, one as the summary came)
    rules = write(tmp_path / "rules.yaml", [RULES])
    source = write(tmp_path / "events.jsonl", [pay(f"e{n}") for n in range(5)])
    script = f"""
import asyncio, signal, sys
from limitflow import cli
real_run = asyncio.run
def run_then_signal(main, **options):
    result = real_run(main, **options)
    for _ in range({signals}):  # the replay is done; main has no exit code yet
        signal.raise_signal(signal.SIGTERM)
    return result
asyncio.run = run_then_signal
sys.exit(cli.main(["replay", "--rules", {str(rules)!r}, "--input", {str(source)!r},
    "--output", "v.jsonl", "--dead-letter", "d.jsonl"], console=True))
"""
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=tmp_path, capture_output=True, timeout=120
    )
    assert done.returncode == code, done.stderr.decode()
    assert "5 events: " in done.stderr.decode()  # the summary said
    assert len((tmp_path / "v.jsonl").read_bytes().splitlines()) == 5


def test_a_signal_once_a_replay_is_over_does_not_end_the_process_by_its_default() -> None:
    # the default actions came back as the replay ended: a SIGTERM while the store
    # closed or the summary was said ended the process with 143 and no summary
    from limitflow.cli import _Signals

    before = signal.getsignal(signal.SIGTERM)
    signals = _Signals()
    try:
        with signals:
            pass
        signal.raise_signal(signal.SIGTERM)  # noted: the replay is over
        assert signals.stop.requested
        with pytest.raises(KeyboardInterrupt):  # a second stops at once: exit 130
            signal.raise_signal(signal.SIGTERM)
    finally:
        signals.restore()
    assert signal.getsignal(signal.SIGTERM) == before


def test_an_output_that_is_the_rules_file_is_refused(tmp_path: Path) -> None:
    # it was taken, and the rules file, just read, overwritten with verdicts
    source = write(tmp_path / "events.jsonl", FILE_A)
    rules = write(tmp_path / "rules.yaml", [RULES])
    before = rules.read_bytes()
    for option in ("--output", "--dead-letter"):
        outputs = {"--output": "v.jsonl", "--dead-letter": "d.jsonl", option: "./rules.yaml"}
        result = limitflow(
            *("replay", "--rules", str(rules), "--input", str(source)),
            *(part for pair in outputs.items() for part in pair),
            cwd=tmp_path,
        )
        assert result.returncode == 2
        assert one_line_reason(result) == (
            f"limitflow: {option} ./rules.yaml is the rules file: verdicts would overwrite"
            " the rules"
        )
        assert rules.read_bytes() == before


def test_an_output_that_is_the_store_file_is_refused(tmp_path: Path) -> None:
    source = write(tmp_path / "events.jsonl", FILE_A)
    rules = write(tmp_path / "rules.yaml", [RULES])
    args = ["replay", "--rules", str(rules), "--input", str(source)]
    store = f"sqlite:///{tmp_path / 'state.db'}"
    assert (
        limitflow(
            *args, "--store", store, "--output", "v", "--dead-letter", "d", cwd=tmp_path
        ).returncode
        == 0
    )
    before = (tmp_path / "state.db").read_bytes()
    for option in ("--output", "--dead-letter"):
        other = "--dead-letter" if option == "--output" else "--output"
        result = limitflow(
            *args, "--store", store, option, str(tmp_path / "state.db"), other, "x", cwd=tmp_path
        )
        assert result.returncode == 2
        assert "is the store's file" in one_line_reason(result)
    assert (tmp_path / "state.db").read_bytes() == before


@pytest.mark.parametrize("option", ["--output", "--dead-letter"])
def test_an_output_that_is_a_store_file_not_made_yet_is_refused(
    tmp_path: Path, option: str
) -> None:
    # the check looked at the files on disk before the store was opened: a new store's
    # file did not exist yet, the store made it, the output then truncated and shared
    # it, and the replay exited 0 with its verdicts lost
    source = write(tmp_path / "events.jsonl", FILE_A)
    rules = write(tmp_path / "rules.yaml", [RULES])
    other = "--dead-letter" if option == "--output" else "--output"
    result = limitflow(
        *("replay", "--rules", str(rules), "--input", str(source)),
        *("--store", f"sqlite:///{tmp_path / 'new.db'}", option, "new.db", other, "x"),
        cwd=tmp_path,
    )
    assert result.returncode == 2
    assert "is the store's file" in one_line_reason(result)
    # refused before the store was opened: nothing is left behind, the empty files the
    # outputs made included
    assert sorted(p.name for p in tmp_path.iterdir()) == ["events.jsonl", "rules.yaml"]


def test_a_replay_refused_for_an_output_keeps_nothing_and_its_file_put_right_starts(
    tmp_path: Path,
) -> None:
    # the outputs were opened only once the store was: a typo in --output (exit 2) left a
    # new sqlite store holding the rules' meanings, and with both mistakes put right the
    # replay was refused for a zone no counter was ever written under
    source = write(tmp_path / "events.jsonl", FILE_A)
    wrong = write(
        tmp_path / "wrong.yaml",
        [RULES.replace("window: day", "window: day\n    timezone: Asia/Hong_Kong")],
    )
    right = write(
        tmp_path / "right.yaml",
        [RULES.replace("window: day", "window: day\n    timezone: Asia/Shanghai")],
    )
    store = ["--store", f"sqlite:///{tmp_path / 'state.db'}"]
    refused = limitflow(
        *("replay", "--rules", str(wrong), "--input", str(source), *store),
        *("--output", str(tmp_path / "typo" / "v.jsonl"), "--dead-letter", "d.jsonl"),
        cwd=tmp_path,
    )
    assert refused.returncode == 2
    assert "cannot open" in one_line_reason(refused)
    assert not (tmp_path / "state.db").exists()
    assert not (tmp_path / "d.jsonl").exists()  # made to be checked, and removed again
    done = limitflow(
        *("replay", "--rules", str(right), "--input", str(source), *store),
        *("--output", "v.jsonl", "--dead-letter", "d.jsonl"),
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr.decode()
    assert len((tmp_path / "v.jsonl").read_bytes().splitlines()) == 8


def test_a_refused_replay_leaves_an_existing_output_as_it_was(tmp_path: Path) -> None:
    source = write(tmp_path / "events.jsonl", FILE_A)
    rules = write(tmp_path / "rules.yaml", [RULES])
    kept = write(tmp_path / "v.jsonl", ["an earlier replay's verdicts"])
    refused = limitflow(
        *("replay", "--rules", str(rules), "--input", str(source), "--store", "nosuch://x"),
        *("--output", str(kept), "--dead-letter", "d.jsonl"),
        cwd=tmp_path,
    )
    assert refused.returncode == 3, refused.stderr.decode()
    assert kept.read_text() == "an earlier replay's verdicts\n"
    assert not (tmp_path / "d.jsonl").exists()


def test_a_replay_refuses_another_program_s_sqlite_file(tmp_path: Path) -> None:
    # a store URL naming another program's database (a typo, a wrong setting copied):
    # the replay made limitflow's tables in it and decided into it
    other = tmp_path / "shop.db"
    with closing(sqlite3.connect(other)) as db:
        db.executescript("CREATE TABLE customers (id INTEGER); CREATE TABLE orders (id INTEGER);")
    source = write(tmp_path / "events.jsonl", FILE_A)
    rules = write(tmp_path / "rules.yaml", [RULES])
    args = ["replay", "--rules", str(rules), "--input", str(source)]
    outputs = ["--output", "v.jsonl", "--dead-letter", "d.jsonl"]
    refused = limitflow(*args, "--store", f"sqlite:///{other}", *outputs, cwd=tmp_path)
    assert refused.returncode == 3
    assert one_line_reason(refused) == (
        f"limitflow: store: {other} holds tables of another program (customers, orders) and"
        " none of limitflow's: give limitflow a file of its own (`limitflow store init` adds"
        " its tables there all the same)"
    )
    with closing(sqlite3.connect(other)) as db:
        tables = sorted(t for (t,) in db.execute("SELECT name FROM sqlite_master"))
        # nor switched to WAL, which opening it to make a store did before refusing it
        assert db.execute("PRAGMA journal_mode").fetchone() == ("delete",)
    assert tables == ["customers", "orders"]
    assert not (tmp_path / "v.jsonl").exists()
    # asked for, limitflow's tables go there all the same
    assert limitflow("store", "init", "--store", f"sqlite:///{other}", cwd=tmp_path).returncode == 0
    done = limitflow(*args, "--store", f"sqlite:///{other}", *outputs, cwd=tmp_path)
    assert done.returncode == 0, done.stderr.decode()


def _reader_gone() -> int:
    """The write end of a pipe whose reader has left (writes fail with EPIPE)."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    return write_end


@pytest.mark.parametrize("stderr", ["/dev/full", "reader gone"])
def test_a_replay_whose_stderr_cannot_be_written_ends_as_it_would_with_one(
    tmp_path: Path, stderr: str
) -> None:
    # its closing line failed: exit 1 and a traceback on a full disk, 141 with a reader
    # that had left, for a replay that had decided and written every line
    source = write(tmp_path / "events.jsonl", FILE_A)
    rules = write(tmp_path / "rules.yaml", [RULES])
    err = os.open(stderr, os.O_WRONLY) if stderr.startswith("/") else _reader_gone()
    try:
        code = subprocess.run(
            [
                *(sys.executable, "-m", "limitflow", "replay", "--rules", str(rules)),
                *("--input", str(source), "--output", "v.jsonl", "--dead-letter", "d.jsonl"),
                *("--store", "memory://"),
            ],
            cwd=tmp_path,
            stderr=err,
            timeout=120,
            check=False,
        ).returncode
    finally:
        os.close(err)
    assert code == 0
    assert len((tmp_path / "v.jsonl").read_bytes().splitlines()) == 8
    assert len((tmp_path / "d.jsonl").read_bytes().splitlines()) == 3


def _busy_replay(tmp_path: Path, stderr: int) -> tuple[subprocess.Popen[bytes], Path]:
    """A sqlite replay of 60,000 events in batches of 200, started, with its verdicts'
    file, once it has written some."""
    events = [
        pay(f"e{n}", account=f"a{n % 50}", day=f"2026-01-{n % 28 + 1:02d}") for n in range(60_000)
    ]
    source = write(tmp_path / "events.jsonl", events)
    rules = write(tmp_path / "rules.yaml", [RULES])
    out = tmp_path / "v.jsonl"
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "limitflow", "replay", "--rules", str(rules)),
            *("--input", str(source), "--batch-size", "200"),
            *("--store", f"sqlite:///{tmp_path / 'state.db'}"),
            *("--output", str(out), "--dead-letter", str(tmp_path / "d.jsonl")),
        ],
        cwd=tmp_path,
        stderr=stderr,
    )
    deadline = time.monotonic() + 60
    while not (out.exists() and out.stat().st_size) and time.monotonic() < deadline:
        time.sleep(0.05)
    return proc, out


def test_a_signal_to_a_replay_whose_stderr_is_a_full_disk_still_exits_130(tmp_path: Path) -> None:
    # the signal's message failed inside the handler: exit 1 and "cannot read <input>: No
    # space left on device", of an input that read fine
    with open("/dev/full", "wb") as full:
        proc, out = _busy_replay(tmp_path, full.fileno())
        os.kill(proc.pid, signal.SIGTERM)
        assert proc.wait(timeout=60) == 130
    assert 0 < len(out.read_bytes().splitlines()) < 60_000  # whole batches


def test_a_replay_whose_terminal_goes_away_finishes_without_its_progress_display(
    tmp_path: Path,
) -> None:
    # the progress display's write failed (EIO) once the terminal closed: the replay
    # stopped there, exit 1, blaming the input ("cannot read …: Input/output error")
    import pty

    terminal, its_end = pty.openpty()
    try:
        proc, out = _busy_replay(tmp_path, its_end)
    finally:
        os.close(its_end)
    os.close(terminal)  # an ssh session dropped; the replay ignores SIGHUP (not its terminal)
    assert proc.wait(timeout=120) == 0
    assert len(out.read_bytes().splitlines()) == 60_000


@pytest.mark.parametrize(
    "command", [["rules", "check", "rules.yaml"], ["store", "init", "--store", "memory://"]]
)
def test_a_command_whose_stdout_is_a_full_disk_says_so_in_one_line(
    tmp_path: Path, command: list[str]
) -> None:
    # a traceback, exit 1
    write(tmp_path / "rules.yaml", [RULES])
    with open("/dev/full", "wb") as full:
        result = subprocess.run(
            [sys.executable, "-m", "limitflow", *command],
            cwd=tmp_path,
            stdout=full,
            stderr=subprocess.PIPE,
            timeout=120,
            check=False,
        )
    assert result.returncode == 1
    assert one_line_reason(result) == (
        "limitflow: cannot write standard output: No space left on device"
    )


def test_a_failed_write_names_the_output_not_the_input(tmp_path: Path) -> None:
    source = write(tmp_path / "events.jsonl", FILE_A)
    rules = write(tmp_path / "rules.yaml", [RULES])
    args = ["replay", "--rules", str(rules), "--input", str(source), "--store", "memory://"]
    for option, other in (("--output", "--dead-letter"), ("--dead-letter", "--output")):
        result = limitflow(*args, option, "/dev/full", other, "x", cwd=tmp_path)
        assert result.returncode == 1
        assert (
            one_line_reason(result) == "limitflow: cannot write /dev/full: No space left on device"
        )


def test_a_failed_write_says_what_the_store_holds_and_a_replay_again_writes_it_all(
    tmp_path: Path,
) -> None:
    # "cannot write …" alone, while the store held every event decided: on a full disk
    # nothing said which lines of a pipe were decided and could be sent again
    source = write(tmp_path / "events.jsonl", FILE_A)
    rules = write(tmp_path / "rules.yaml", [RULES])
    args = ["replay", "--rules", str(rules), "--input", str(source), "--batch-size", "4"]
    args += ["--store", f"sqlite:///{tmp_path / 'state.db'}"]
    failed = limitflow(*args, "--output", "/dev/full", "--dead-letter", "d0", cwd=tmp_path)
    assert failed.returncode == 1
    assert one_line_reason(failed) == (
        "limitflow: cannot write /dev/full: No space left on device; before it, 11 events"
        " (input lines 1-13) were decided and stored, not all their output lines written:"
        " replay the same input on the same store to write them"
    )
    again = limitflow(*args, "--output", "v1", "--dead-letter", "d1", cwd=tmp_path)
    assert again.returncode == 0, again.stderr.decode()
    verdicts = [json.loads(x) for x in (tmp_path / "v1").read_bytes().splitlines()]
    assert [(v["event_id"], v["decision"], v["reason"], v["seq"]) for v in verdicts] == (
        FILE_A_VERDICTS
    )
    assert "11 events: 0 accepted, 0 rejected, 8 duplicates, 3 dead letters" in (
        again.stderr.decode()
    )


def test_a_replay_failing_on_its_store_says_dead_letters_unwritten_are_not_written(
    tmp_path: Path,
) -> None:
    # the dead letters of the lines said "decided and written" were in the file's buffer:
    # its flush failed on the full disk as the replay ended, unsaid, and the lines were
    # not in the file (a pipe's cannot be read again)
    lines = [pay("n1"), "not json", pay("p1"), pay("n3")]
    result = _replay_meeting_a_damaged_record(tmp_path, lines, "/dev/full")
    assert result.returncode == 3
    reason = one_line_reason(result)
    assert "a stored record cannot be read" in reason
    assert reason.endswith(
        "; before it, 2 events (input lines 1-2) were decided and stored, but not all their"
        " output lines written (No space left on device): replay the same input on the same"
        " store to write them"
    )


def _on_a_full_disk(tmp_path: Path, script: str) -> subprocess.CompletedProcess[bytes]:
    """``script`` (sh) run in a mount namespace of its own where ``tmp_path/disk`` is a
    256 KiB tmpfs, gone with it; skipped where mounts are not allowed (not root)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mount = f"mount -t tmpfs -o size=256k tmpfs {disk} && cd {disk} && {script}"
    unshare = ["unshare", "--mount", "--propagation", "private", "sh", "-c"]
    try:
        probe = subprocess.run([*unshare, "true"], capture_output=True, check=False, timeout=60)
    except FileNotFoundError:
        pytest.skip("no unshare here to mount a small disk")
    if probe.returncode != 0:
        pytest.skip(f"no mount namespace here: {probe.stderr.decode().strip()}")
    return subprocess.run([*unshare, mount], capture_output=True, check=False, timeout=120)


def test_a_full_disk_under_a_sqlite_store_is_said_so_not_an_io_error(tmp_path: Path) -> None:
    # "cannot open SQLite database …: disk I/O error": no room for the -shm file beside
    # the database read as a failing disk
    limitflow_cmd = f"{sys.executable} -m limitflow store init --store sqlite:///$PWD/s.db"
    result = _on_a_full_disk(
        tmp_path,
        f"{limitflow_cmd} && rm -f s.db-shm"
        " && (head -c 1000000 /dev/zero > filler 2>/dev/null; true)"  # the disk filled
        f" && {limitflow_cmd}",
    )
    assert result.returncode == 3, result.stderr.decode()
    assert result.stderr.decode() == (
        f"limitflow: store: cannot open SQLite database {tmp_path}/disk/s.db: disk I/O error"
        " (SQLITE_IOERR_SHMSIZE; 0 KiB free on the file's disk)\n"
    )


def test_a_damaged_sqlite_store_is_one_line_and_exit_3(tmp_path: Path) -> None:
    source = write(tmp_path / "events.jsonl", FILE_A)
    rules = write(tmp_path / "rules.yaml", [RULES])
    args = ["replay", "--rules", str(rules), "--input", str(source), "--output", "v"]
    args += ["--dead-letter", "d", "--store", f"sqlite:///{tmp_path / 'state.db'}"]
    assert limitflow(*args, cwd=tmp_path).returncode == 0
    with open(tmp_path / "state.db", "r+b") as db:
        db.seek(4096)  # in the first page (8 KB): found as the file is opened
        db.write(b"\xde\xad" * 20_000)
    result = limitflow(*args, cwd=tmp_path)
    assert result.returncode == 3
    assert "damaged or not a database" in one_line_reason(result)
    assert f"SQLite {tmp_path / 'state.db'}: " in one_line_reason(result)  # which file
    # damage further in is found when the store first reads it: the same
    assert limitflow(*args[:-1], f"sqlite:///{tmp_path / 'other.db'}", cwd=tmp_path).returncode == 0
    with open(tmp_path / "other.db", "r+b") as db:
        db.seek(3 * 8192)
        db.write(b"\xde\xad" * 20_000)
    result = limitflow(*args[:-1], f"sqlite:///{tmp_path / 'other.db'}", cwd=tmp_path)
    assert result.returncode == 3
    assert "damaged or not a database" in one_line_reason(result)


def test_a_closed_standard_input_is_one_line(tmp_path: Path) -> None:
    rules = write(tmp_path / "rules.yaml", [RULES])
    result = subprocess.run(
        [
            *(sys.executable, "-m", "limitflow", "replay", "--rules", str(rules), "--input", "-"),
            *("--output", "v", "--dead-letter", "d", "--store", "memory://"),
        ],
        cwd=tmp_path,
        stdin=None,
        capture_output=True,
        timeout=60,
        check=False,
        preexec_fn=lambda: os.close(0),  # closes stdin, in the child only
    )
    assert result.returncode == 1
    assert one_line_reason(result) == "limitflow: cannot use -: standard input is closed"


def test_a_closed_standard_output_is_refused_before_anything_is_touched(
    tmp_path: Path,
) -> None:
    # found only once the replay started: the other output (an existing file) emptied,
    # the sqlite store made and the rules' meanings kept in it
    rules = write(tmp_path / "rules.yaml", [RULES])
    source = write(tmp_path / "in.jsonl", [pay("p1")])
    write(tmp_path / "kept.jsonl", ["what was there"])
    for output, dead_letter in (("kept.jsonl", "-"), ("-", "new.jsonl")):
        result = subprocess.run(
            [
                *(sys.executable, "-m", "limitflow", "replay", "--rules", str(rules)),
                *("--input", str(source), "--output", output, "--dead-letter", dead_letter),
                *("--store", "sqlite:///state.db"),
            ],
            cwd=tmp_path,
            stderr=subprocess.PIPE,
            timeout=60,
            check=False,
            preexec_fn=lambda: os.close(1),  # closes stdout, in the child only
        )
        assert result.returncode == 2
        assert one_line_reason(result) == "limitflow: cannot use -: standard output is closed"
        assert (tmp_path / "kept.jsonl").read_text() == "what was there\n"
        assert not (tmp_path / "new.jsonl").exists()
        assert not (tmp_path / "state.db").exists()


def test_a_rules_file_of_nested_aliases_is_refused_at_once(tmp_path: Path) -> None:
    # 331 bytes that expand to 9^7 values: walking them took seconds and gigabytes
    lines = ['a: &a ["x","x","x","x","x","x","x","x","x"]']
    for level in range(1, 9):
        name, before = "abcdefghi"[level], "abcdefghi"[level - 1]
        lines.append(f"{name}: &{name} [" + ",".join([f"*{before}"] * 9) + "]")
    lines.append("rules:\n  - {id: a, window: day, max_count: 1, match: {channel: *i}}")
    rules = write(tmp_path / "bomb.yaml", lines)
    result = limitflow("rules", "check", str(rules), cwd=tmp_path)
    assert result.returncode == 2
    assert "aliases repeat" in one_line_reason(result)


def test_rules_sharing_a_large_match_list_through_an_anchor_are_taken(tmp_path: Path) -> None:
    # the alias limit counts what aliases repeat, not what the file holds
    merchants = ", ".join(f"m{n}" for n in range(50_001))
    lines = [
        "rules:",
        "  - {id: r0, window: day, max_count: 1,"
        f" match: {{merchant_id: &blocked [{merchants}]}}}}",
    ]
    lines += [
        f"  - {{id: r{n}, window: day, max_count: 1, match: {{merchant_id: *blocked}}}}"
        for n in range(1, 20)
    ]
    rules = write(tmp_path / "shared.yaml", lines)
    result = limitflow("rules", "check", str(rules), cwd=tmp_path)
    assert result.returncode == 0, result.stderr.decode()


def test_a_stored_record_limitflow_did_not_write_is_one_line_and_exit_3(tmp_path: Path) -> None:
    # found by a review of the stores: a ValueError traceback (sqlite), AttributeError
    # (MongoDB), KeyError (DynamoDB) for a record with another format
    import sqlite3

    source = write(tmp_path / "events.jsonl", FILE_A)
    rules = write(tmp_path / "rules.yaml", [RULES])
    args = ["replay", "--rules", str(rules), "--input", str(source), "--output", "v"]
    args += ["--dead-letter", "d", "--store", f"sqlite:///{tmp_path / 'state.db'}"]
    assert limitflow(*args, cwd=tmp_path).returncode == 0
    db = sqlite3.connect(tmp_path / "state.db")
    db.execute("UPDATE events SET type = 'refund'")
    db.commit()
    db.close()
    result = limitflow(*args, cwd=tmp_path)
    assert result.returncode == 3
    assert "a stored record cannot be read" in one_line_reason(result)


def _replay_meeting_a_damaged_record(
    tmp_path: Path, lines: list[str], dead_letter: str
) -> subprocess.CompletedProcess[bytes]:
    """A replay of ``lines`` from a pipe, in batches of 2, on a sqlite store whose record
    of ``p1`` is not limitflow's: the batch with ``p1`` fails; verdicts in v1.jsonl."""
    rules = write(tmp_path / "rules.yaml", [RULES])
    store = ["--store", f"sqlite:///{tmp_path / 'state.db'}"]
    first = write(tmp_path / "events.jsonl", [pay("p1")])
    made = limitflow(
        *("replay", "--rules", str(rules), "--input", str(first), "--output", "v0"),
        *(*store, "--dead-letter", "d0"),
        cwd=tmp_path,
    )
    assert made.returncode == 0, made.stderr.decode()
    with closing(sqlite3.connect(tmp_path / "state.db")) as db:
        db.execute("UPDATE events SET type = 'refund'")  # p1's record: not limitflow's
        db.commit()
    return limitflow(
        *("replay", "--rules", str(rules), "--input", "-", "--output", "v1.jsonl"),
        *(*store, "--dead-letter", dead_letter, "--batch-size", "2"),
        cwd=tmp_path,
        stdin="\n".join(lines).encode() + b"\n",
    )


def test_a_replay_from_a_pipe_that_fails_says_which_lines_it_decided(tmp_path: Path) -> None:
    # "store: …" alone: the lines of a pipe cannot be read again, and which of them the
    # outputs hold was left to be counted there
    lines = [pay("n1"), pay("n2"), "", pay("p1"), pay("n3")]
    result = _replay_meeting_a_damaged_record(tmp_path, lines, "d.jsonl")
    assert result.returncode == 3
    reason = one_line_reason(result)
    assert "a stored record cannot be read" in reason
    assert reason.endswith("; before it, 2 events (input lines 1-2) were decided and written")
    verdicts = [json.loads(x) for x in (tmp_path / "v1.jsonl").read_bytes().splitlines()]
    assert [v["event_id"] for v in verdicts] == ["n1", "n2"]


@pytest.mark.parametrize(
    "url",
    [
        "sqlite:///state.db?event_retention_dayz=1",
        "memory://?bucket_retention=3",
        "dynamodb://x?endpoint_url=127.0.0.1:8000",
        "dynamodb://x?endpoint_url=http://127.0.0.1:99999",
        "mongodb://127.0.0.1:99999/x",
    ],
)
def test_a_store_url_the_store_cannot_use_is_one_line_and_exit_3(tmp_path: Path, url: str) -> None:
    source = write(tmp_path / "events.jsonl", FILE_A)
    rules = write(tmp_path / "rules.yaml", [RULES])
    result = limitflow(
        *("replay", "--rules", str(rules), "--input", str(source), "--output", "v"),
        *("--dead-letter", "d", "--store", url),
        cwd=tmp_path,
    )
    assert result.returncode == 3, result.stderr.decode()
    assert one_line_reason(result).startswith("limitflow: store: ")
    assert not (tmp_path / "state.db").exists()


def test_an_unknown_mongodb_url_option_is_one_line_without_pymongos_pointer(
    tmp_path: Path,
) -> None:
    source = write(tmp_path / "events.jsonl", FILE_A)
    rules = write(tmp_path / "rules.yaml", [RULES])
    result = limitflow(
        *("replay", "--rules", str(rules), "--input", str(source), "--output", "v"),
        *("--dead-letter", "d", "--store", "mongodb://127.0.0.1:1/x?timeoutMz=5"),
        cwd=tmp_path,
    )
    assert result.returncode == 3
    reason = one_line_reason(result)
    # the value of an option not known to hold no secret is masked (a misspelt
    # tlsCertificateKeyFilePassword would be a password)
    assert reason.startswith("limitflow: store: mongodb://127.0.0.1:1/x?timeoutMz=***: ")
    assert "Unknown option" in reason and "docstring" not in reason


def test_an_unknown_dynamodb_url_parameter_is_named_with_the_known_ones(tmp_path: Path) -> None:
    source = write(tmp_path / "events.jsonl", FILE_A)
    rules = write(tmp_path / "rules.yaml", [RULES])
    result = limitflow(
        *("replay", "--rules", str(rules), "--input", str(source), "--output", "v"),
        *("--dead-letter", "d", "--store", "dynamodb://x?endpoint=http://127.0.0.1:8000"),
        cwd=tmp_path,
    )
    assert result.returncode == 3
    assert one_line_reason(result).endswith(
        ": unknown parameters endpoint"
        " (known: bucket_retention_days, endpoint_url, event_retention_days, region)"
    )


def test_a_dynamodb_url_parameter_given_twice_is_refused(tmp_path: Path) -> None:
    # the first was taken: an appended region=eu-west-1 was ignored without a word
    source = write(tmp_path / "events.jsonl", FILE_A)
    rules = write(tmp_path / "rules.yaml", [RULES])
    url = "dynamodb://x?endpoint_url=http://127.0.0.1:8000&region=us-east-1&region=eu-west-1"
    result = limitflow(
        *("replay", "--rules", str(rules), "--input", str(source), "--output", "v"),
        *("--dead-letter", "d", "--store", url),
        cwd=tmp_path,
    )
    assert result.returncode == 3
    assert one_line_reason(result).endswith(": region given 2 times; give it once")


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_replay_waiting_on_its_input_stops_on_a_signal(tmp_path: Path, sig: int) -> None:
    # the event loop's handlers never ran while the read blocked its thread: only kill -9
    # stopped a replay fed by a quiet pipe
    rules = write(tmp_path / "rules.yaml", [RULES])
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "limitflow", "replay", "--rules", str(rules), "--input", "-"),
            *("--output", "v", "--dead-letter", "d", "--store", f"sqlite:///{tmp_path / 's.db'}"),
        ],
        cwd=tmp_path,
        stdin=subprocess.PIPE,  # kept open, and nothing comes
        stderr=subprocess.PIPE,
    )
    assert proc.stdin is not None
    proc.stdin.write((pay("p1") + "\n").encode())
    proc.stdin.flush()
    deadline = time.monotonic() + 30
    while not (tmp_path / "s.db").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(1)
    proc.send_signal(sig)
    try:
        code = proc.wait(15)  # the input pipe still open
    finally:
        proc.kill()
        _, err = proc.communicate()
    assert code == 130, err.decode()
    assert b"Traceback" not in err


@pytest.mark.parametrize("taken", [True, False], ids=["port-in-use", "no-such-address"])
def test_an_ops_endpoint_that_cannot_listen_stops_run_in_one_line(
    tmp_path: Path, rules: Path, taken: bool
) -> None:
    # a port another process holds (a second instance, a restart overlapping the old
    # one) ended `run` with a 30-line traceback and exit 1
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        where = ("--http-port", str(port)) if taken else ("--http-host", "192.0.2.1")
        result = limitflow(
            *("run", "--bootstrap-servers", "127.0.0.1:1", "--group-id", "g"),
            *("--input-topic", "in", "--output-topic", "out", "--dead-letter-topic", "dead"),
            *("--rules", str(rules), "--store", "memory://", "--http-port", str(port), *where),
            cwd=tmp_path,
        )
    assert result.returncode == 2
    reason = one_line_reason(result)
    assert "ops endpoint" in reason
    assert ("in use" if taken else "assign requested address") in reason


def test_run_says_that_a_partition_count_without_create_topics_is_ignored(
    tmp_path: Path, rules: Path
) -> None:
    # `run --partitions 12` took the flag and did nothing with it: the topics are made
    # with them only by --create-topics (or `topics create`), and nothing said so
    with socket.socket() as holder:  # an ops port in use ends the run at once, exit 2
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        base = (
            *("run", "--bootstrap-servers", "127.0.0.1:1", "--group-id", "g"),
            *("--input-topic", "in", "--output-topic", "out", "--dead-letter-topic", "dead"),
            *("--rules", str(rules), "--store", "memory://", "--http-port", str(port)),
            *("--log-format", "text"),
        )
        ignored = limitflow(*base, "--partitions", "12", "--replication-factor", "3", cwd=tmp_path)
        taken = limitflow(*base, "--partitions", "12", "--create-topics", cwd=tmp_path)
    said = ignored.stderr.decode()
    assert "--partitions is for topics created at start: ignored without --create-topics" in said
    assert "--replication-factor is for topics created at start" in said
    assert "is for topics created at start" not in taken.stderr.decode()
    assert ignored.returncode == taken.returncode == 2  # the port, as before


def test_a_key_error_of_a_bug_in_run_is_no_usage_error(
    rules: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # missing topics were a LookupError, caught as such: every KeyError or IndexError of a
    # bug in the consumer (or aiokafka) ended `run` with exit 2, "limitflow: partition",
    # no traceback; an unexpected error is exit 1 with its traceback (README, Exit codes)
    import limitflow.run_cli as run_cli
    from limitflow.cli import main

    async def buggy(*_: object) -> int:
        positions: dict[str, int] = {}
        return positions["partition"]

    monkeypatch.setattr(run_cli, "serve", buggy)
    with pytest.raises(KeyError, match="partition"):
        main(
            [
                *("run", "--bootstrap-servers", "127.0.0.1:1", "--group-id", "g"),
                *("--input-topic", "in", "--output-topic", "out", "--dead-letter-topic", "dead"),
                *("--rules", str(rules), "--store", "memory://", "--log-format", "text"),
            ]
        )


def _closed_port() -> int:
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        return int(closed.getsockname()[1])  # nothing listens there once it is closed


def _start_run(tmp_path: Path, rules: Path) -> tuple[subprocess.Popen[bytes], Path]:
    """``limitflow run`` with its store down: MongoDB is waited for (2 minutes here), so
    the process stays in its start, before the consumer's own signal handlers."""
    err = tmp_path / "stderr"
    port = _closed_port()
    with open(err, "wb") as sink:
        proc = subprocess.Popen(
            [
                *(sys.executable, "-m", "limitflow", "run"),
                *("--bootstrap-servers", "127.0.0.1:1", "--group-id", "g"),
                *("--input-topic", "in", "--output-topic", "out", "--dead-letter-topic", "dead"),
                *("--rules", str(rules), "--log-format", "text"),
                *("--store", f"mongodb://127.0.0.1:{port}/x?serverSelectionTimeoutMS=120000"),
            ],
            cwd=tmp_path,
            stdout=sink,
            stderr=sink,
        )
    return proc, err


def _stopped(proc: subprocess.Popen[bytes], err: Path) -> tuple[int, str]:
    try:
        code = proc.wait(15)  # well before the store's wait ends
    finally:
        proc.kill()
        proc.wait()
    return code, err.read_text(errors="replace")


@needs_proc
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_run_waiting_for_its_store_stops_on_a_signal_with_exit_0(
    tmp_path: Path, rules: Path, sig: int
) -> None:
    # the consumer's handlers came only after the store was open: SIGTERM meanwhile
    # ended `run` with 143 (SIGINT with 130), so an orchestrator that stopped a process
    # that had just started saw a failure
    import pymongo

    if not pymongo.has_c():
        pytest.skip("waits for pymongo's compiled module to show the store is opening")
    proc, err = _start_run(tmp_path, rules)
    deadline = time.monotonic() + 60
    maps = Path(f"/proc/{proc.pid}/maps")
    # the MongoDB store is imported when it is opened
    while b"pymongo" not in maps.read_bytes() and time.monotonic() < deadline:
        assert proc.poll() is None, err.read_text(errors="replace")
        time.sleep(0.01)
    assert b"pymongo" in maps.read_bytes(), "the store was never opened"
    time.sleep(0.5)  # into the wait for the server
    proc.send_signal(sig)
    code, log = _stopped(proc, err)
    assert code == 0, log
    assert f"stopped by {signal.Signals(sig).name} before starting; nothing was consumed" in log
    assert "Traceback" not in log


@needs_proc
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_replay_waiting_for_its_store_stops_on_a_signal_and_writes_nothing(
    tmp_path: Path, rules: Path, sig: int
) -> None:
    # the replay's handlers came only once the store was open: a SIGTERM meanwhile ended
    # it by the default action, 143 and not a word, where a replay stopped says so, 130
    import pymongo

    if not pymongo.has_c():
        pytest.skip("waits for pymongo's compiled module to show the store is opening")
    source = write(tmp_path / "events.jsonl", [pay("e1")])
    err = tmp_path / "stderr"
    with open(err, "wb") as sink:
        proc = subprocess.Popen(
            [
                *(sys.executable, "-m", "limitflow", "replay", "--rules", str(rules)),
                *("--input", str(source), "--output", "v.jsonl", "--dead-letter", "d.jsonl"),
                "--store",
                f"mongodb://127.0.0.1:{_closed_port()}/x?serverSelectionTimeoutMS=120000",
            ],
            cwd=tmp_path,
            stdout=sink,
            stderr=sink,
        )
    deadline = time.monotonic() + 60
    maps = Path(f"/proc/{proc.pid}/maps")
    # the MongoDB store is imported when it is opened
    while b"pymongo" not in maps.read_bytes() and time.monotonic() < deadline:
        assert proc.poll() is None, err.read_text(errors="replace")
        time.sleep(0.01)
    assert b"pymongo" in maps.read_bytes(), "the store was never opened"
    time.sleep(0.5)  # into the wait for the server
    proc.send_signal(sig)
    code, log = _stopped(proc, err)
    assert code == 130, log
    name = signal.Signals(sig).name
    assert f"limitflow: {name}: stopping before the replay starts" in log
    assert "stopped before the replay started: nothing was decided or written" in log
    assert "Traceback" not in log
    assert not (tmp_path / "v.jsonl").exists() and not (tmp_path / "d.jsonl").exists()


@needs_proc
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_replay_reading_its_rules_stops_on_a_signal_at_once(tmp_path: Path, sig: int) -> None:
    # the handlers came only as the store opened, after the rules were read (seconds for
    # a large file): a SIGTERM meanwhile ended the replay with 143 and not a word. Here
    # the rules are a named pipe no one writes to, so the signal finds the read waiting.
    source = write(tmp_path / "events.jsonl", [pay("e1")])
    os.mkfifo(tmp_path / "rules.yaml")
    err = tmp_path / "stderr"
    with open(err, "wb") as sink:
        proc = subprocess.Popen(
            [
                *(sys.executable, "-m", "limitflow", "replay", "--rules", "rules.yaml"),
                *("--input", str(source), "--output", "v.jsonl", "--dead-letter", "d.jsonl"),
                *("--store", "sqlite:///state.db"),
            ],
            cwd=tmp_path,
            stdout=sink,
            stderr=sink,
        )
    deadline = time.monotonic() + 60
    while not catches(proc.pid, signal.SIGTERM) and time.monotonic() < deadline:
        assert proc.poll() is None, err.read_text(errors="replace")
        time.sleep(0.01)
    time.sleep(0.2)  # into the read of the rules
    proc.send_signal(sig)
    code, log = _stopped(proc, err)
    assert code == 130, log
    name = signal.Signals(sig).name
    assert log == (
        f"limitflow: {name}: stopped before the replay started: nothing was decided or written\n"
    )
    made = {p.name for p in tmp_path.iterdir()} - {"events.jsonl", "rules.yaml", "stderr"}
    assert not made


@needs_proc
@pytest.mark.parametrize("delay", [0, 0.01, 0.02, 0.05, 0.1, 0.2, 0.3, None])
def test_run_stops_on_sigterm_from_its_first_moments_with_exit_0(
    tmp_path: Path, rules: Path, delay: float | None
) -> None:
    # SIGTERM at a delay after the start; None: the moment the process catches it. Only
    # a SIGTERM before that, while Python itself starts, may still end it (-15): no
    # handler of the program can run then.
    proc, err = _start_run(tmp_path, rules)
    if delay is None:
        deadline = time.monotonic() + 20
        while not catches(proc.pid, signal.SIGTERM) and time.monotonic() < deadline:
            assert proc.poll() is None, err.read_text(errors="replace")
            time.sleep(0.001)
        caught = catches(proc.pid, signal.SIGTERM)
        assert caught, "SIGTERM was not caught while `run` started"
    else:
        time.sleep(delay)
        caught = catches(proc.pid, signal.SIGTERM)
    proc.send_signal(signal.SIGTERM)
    code, log = _stopped(proc, err)
    if not caught:
        assert code in (0, -signal.SIGTERM), log
        return
    assert code == 0, log
    assert "stopped by SIGTERM before starting; nothing was consumed" in log
    assert "Traceback" not in log


def test_run_stops_on_a_sigterm_that_comes_while_its_sqlite_store_opens(
    tmp_path: Path, rules: Path
) -> None:
    # sqlite's open holds the event loop; a SIGTERM meanwhile reached the loop's handler
    # (StopSignals') only after serve() had replaced it and looked for a signal already
    # received: serve never saw it, and `run` went on to wait for Kafka and consume
    code, log = _run_sigterm_as_sqlite_opens(tmp_path, rules, "sys.exit(main())")
    assert code == 0, log
    assert "received SIGTERM" in log
    assert "nothing was consumed" in log
    assert "cannot reach Kafka" not in log  # stopped before the first try
    assert "Traceback" not in log


def _run_sigterm_as_sqlite_opens(tmp_path: Path, rules: Path, then: str) -> tuple[int, str]:
    """Exit code and log of ``run`` in a process that raises SIGTERM while the sqlite
    store opens (holding the event loop), then runs ``then``, which calls ``main()``."""
    script = textwrap.dedent(
        """
        import signal, sys
        import stores.sqlite
        from limitflow.__main__ import main

        opened = stores.sqlite._open
        def _open(path, **options):
            db = opened(path, **options)
            signal.raise_signal(signal.SIGTERM)  # while the open holds the loop
            return db
        stores.sqlite._open = _open
        """
    ) + textwrap.dedent(then)
    err = tmp_path / "stderr"
    with open(err, "wb") as sink:
        proc = subprocess.Popen(
            [
                *(sys.executable, "-c", script, "run"),
                *("--bootstrap-servers", f"127.0.0.1:{_closed_port()}", "--group-id", "g"),
                *("--input-topic", "in", "--output-topic", "out", "--dead-letter-topic", "dead"),
                *("--rules", str(rules), "--log-format", "text"),
                *("--store", f"sqlite:///{tmp_path / 'state.db'}"),
            ],
            cwd=tmp_path,
            stdout=sink,
            stderr=sink,
        )
    return _stopped(proc, err)


def _topics_create_with_no_broker(
    tmp_path: Path, env: dict[str, str] | None = None
) -> tuple[subprocess.CompletedProcess[bytes], int]:
    """``limitflow topics create`` at a port nothing listens on, and that port."""
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]  # nothing listens there
    result = limitflow(
        *("topics", "create", "--bootstrap-servers", f"127.0.0.1:{port}"),
        *("--input-topic", "in", "--output-topic", "out", "--dead-letter-topic", "dead"),
        cwd=tmp_path,
        env=env,
    )
    return result, port


def test_topics_create_with_no_broker_there_says_so_in_one_line(tmp_path: Path) -> None:
    # aiokafka's raw log line came first, then an object dump with no next step
    result, port = _topics_create_with_no_broker(tmp_path)
    assert result.returncode == 4
    assert one_line_reason(result) == (
        f"limitflow: cannot reach Kafka at 127.0.0.1:{port}: check --bootstrap-servers"
        " (LIMITFLOW_BOOTSTRAP_SERVERS) and that the brokers run"
    )


def test_topics_create_names_a_misspelt_variable_as_run_does(tmp_path: Path) -> None:
    env = {**os.environ, "LIMITFLOW_PARTITION": "12"}
    result, _ = _topics_create_with_no_broker(tmp_path, env)
    assert result.returncode == 4
    assert result.stderr.decode().splitlines()[0] == (
        "limitflow: LIMITFLOW_PARTITION is not a limitflow setting: ignored (misspelt?)"
    )


_EXAMPLE_RULES = Path(__file__).resolve().parents[2] / "examples" / "rules.yaml"


def test_rules_check_into_a_closed_pipe_ends_quietly(tmp_path: Path) -> None:
    # `limitflow rules check … | head -1`: a BrokenPipeError traceback once head left
    read, write = os.pipe()
    os.close(read)  # the reader is gone before anything is written
    try:
        result = subprocess.run(
            [sys.executable, "-m", "limitflow", "rules", "check", str(_EXAMPLE_RULES)],
            stdout=write,
            stderr=subprocess.PIPE,
            timeout=60,
            check=False,
        )
    finally:
        os.close(write)
    assert result.returncode == 141
    assert result.stderr == b""


def test_a_store_not_initialized_says_what_is_missing_and_the_hint_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # the stores wrote the hint into their messages, or not (DynamoDB), and the CLI took
    # it off again by its text to give the whole command
    import asyncio
    import pickle

    import stores
    from limitflow.cli import CommandFailed, open_ready_store
    from limitflow.errors import StoreNotInitialized

    exc = StoreNotInitialized("DynamoDB describe: ResourceNotFoundException: the table is missing")
    assert str(exc) == (
        "DynamoDB describe: ResourceNotFoundException: the table is missing: "
        "run `limitflow store init`"
    )
    assert str(pickle.loads(pickle.dumps(exc))) == str(exc)

    class Uninitialised:
        async def check(self) -> None:
            raise exc

        async def close(self) -> None:
            pass

    monkeypatch.setattr(
        stores, "open_store", lambda url, lock_wait=None, password=None, wal=True: Uninitialised()
    )
    with pytest.raises(CommandFailed) as caught:
        asyncio.run(open_ready_store("dynamodb://t?region=x"))
    assert str(caught.value) == (
        "store: DynamoDB describe: ResourceNotFoundException: the table is missing: "
        "run `limitflow store init --store 'dynamodb://t?region=x'`"
    )
    # the hint is printed and logged (by `run` and the faust worker too): no password
    with pytest.raises(CommandFailed) as caught:
        asyncio.run(open_ready_store("mongodb://app:Sup3rSecret@db:27017/limits?w=majority"))
    assert "Sup3rSecret" not in str(caught.value)
    assert str(caught.value).endswith(
        "run `limitflow store init --store 'mongodb://app:***@db:27017/limits?w=majority'`"
        " (with the password and options masked here)"
    )


def test_a_store_url_that_cannot_be_used_is_told_without_its_password() -> None:
    import stores
    from limitflow.errors import ConfigError

    for url in (
        "mongo://app:Sup3rSecret@db/limits",  # a misspelt scheme
        "mongodb://app:Sup3rSecret@db:99999/limits",  # a port the driver refuses
        "sqlite:///x.db?token=Sup3rSecret",
        "dynamodb://t?region=x&secret=Sup3rSecret",
    ):
        with pytest.raises(ConfigError) as caught:
            stores.open_store(url)
        assert "Sup3rSecret" not in str(caught.value), url


def test_run_ignores_a_sigterm_that_comes_while_python_finishes(
    tmp_path: Path, rules: Path
) -> None:
    # the console script restored the default actions when the run was over: a SIGTERM
    # in the last moments, while Python finished, ended a clean stop with -15 (143)
    then = """
        code = main()  # stopped before consuming: 0
        signal.raise_signal(signal.SIGTERM)  # the run is over; Python is finishing
        signal.raise_signal(signal.SIGINT)
        print("finished", code, file=sys.stderr)
        sys.exit(code)
        """
    code, log = _run_sigterm_as_sqlite_opens(tmp_path, rules, then)
    assert code == 0, log
    assert "nothing was consumed" in log
    assert "finished 0" in log


def test_a_rule_whose_counters_would_change_meaning_is_refused_before_any_event(
    tmp_path: Path, rules: Path
) -> None:
    # the day's counters of acct-day-2 were kept in UTC days; in Asia/Shanghai days the
    # same period names would go on from them, mixing two zones' payments in one count
    store = f"sqlite:///{tmp_path / 'state.db'}"
    source = write(tmp_path / "events.jsonl", [pay("p1"), pay("p2")])
    args = ["replay", "--input", str(source), "--store", store, "--dead-letter", "d.jsonl"]
    first = limitflow(*args, "--rules", str(rules), "--output", "v0.jsonl", cwd=tmp_path)
    assert first.returncode == 0, first.stderr.decode()
    moved = write(
        tmp_path / "moved.yaml",
        [RULES.replace("max_count: 2", "max_count: 2\n    timezone: Asia/Shanghai")],
    )
    refused = limitflow(*args, "--rules", str(moved), "--output", "v1.jsonl", cwd=tmp_path)
    assert refused.returncode == 2
    assert one_line_reason(refused) == (
        "limitflow: rules: rule 'acct-day-2': the store keeps its day counters for timezone"
        " UTC (now Asia/Shanghai). A rule's id names its counters: give a changed rule a new"
        " id, or change it back"
    )
    assert not (tmp_path / "v1.jsonl").exists()  # refused before anything was decided
    # `rules check --store` says so before a deployment, and writes nothing
    checked = limitflow("rules", "check", str(moved), "--store", store, cwd=tmp_path)
    assert checked.returncode == 2
    assert one_line_reason(checked) == one_line_reason(refused)
    # `run` refuses it too, at start, before it waits for any broker
    started = limitflow(
        *("run", "--bootstrap-servers", f"127.0.0.1:{_closed_port()}", "--group-id", "g"),
        *("--input-topic", "in", "--output-topic", "out", "--dead-letter-topic", "dead"),
        *("--rules", str(moved), "--store", store),
        cwd=tmp_path,
    )
    assert started.returncode == 2
    assert "rule 'acct-day-2': the store keeps its day counters for" in started.stderr.decode()
    # under a new id, the rule counts from zero (the old id's day holds two already)
    more = write(tmp_path / "more.jsonl", [pay("p3"), pay("p4")])
    args[args.index(str(source))] = str(more)
    renamed = write(
        tmp_path / "renamed.yaml", [moved.read_text().replace("acct-day-2", "acct-day-sh")]
    )
    checked = limitflow("rules", "check", str(renamed), "--store", store, cwd=tmp_path)
    assert checked.returncode == 0, checked.stderr.decode()
    assert checked.stdout.decode().endswith(
        f"{store}: takes these rules (none kept there yet, 1 new: kept at the first start,"
        " 1 transaction rule (no counters))\n"
    )
    with closing(sqlite3.connect(tmp_path / "state.db")) as db:
        kept = db.execute("SELECT name FROM meta WHERE name LIKE 'rule:%'").fetchall()
    assert kept == [("rule:acct-day-2:day",)]  # the check kept nothing
    again = limitflow(*args, "--rules", str(renamed), "--output", "v2.jsonl", cwd=tmp_path)
    assert again.returncode == 0, again.stderr.decode()
    assert [v["decision"] for v in jsonl((tmp_path / "v2.jsonl").read_bytes())] == ["accept"] * 2
    checked = limitflow("rules", "check", str(renamed), "--store", store, cwd=tmp_path)
    assert checked.stdout.decode().endswith(
        f"{store}: takes these rules (1 rule kept there unchanged, 1 transaction rule"
        " (no counters))\n"
    )
    missing = f"sqlite:///{tmp_path / 'none.db'}"
    checked = limitflow("rules", "check", str(renamed), "--store", missing, cwd=tmp_path)
    assert checked.stdout.decode().endswith(
        f"{missing}: no store there yet: it will keep these rules\n"
    )
    assert not (tmp_path / "none.db").exists()
    # the id's day counters have not expired: forgetting what they hold is refused
    forget = ["store", "forget-rule", "acct-day-2", "--store", store]
    refused = limitflow(*forget, cwd=tmp_path)
    assert refused.returncode == 2
    assert one_line_reason(refused).startswith(
        "limitflow: rule 'acct-day-2' has counters that have not expired: a rule changed under"
    )
    assert one_line_reason(refused).endswith("(or pass --force)")
    forgot = limitflow(*forget, "--force", cwd=tmp_path)
    assert forgot.stdout.decode() == (
        f"{store}: forgot what the counters of rule 'acct-day-2' hold (1 window);"
        " the next start keeps the rules file's\n"
    )
    checked = limitflow("rules", "check", str(moved), "--store", store, cwd=tmp_path)
    assert checked.returncode == 0, checked.stderr.decode()


@pytest.mark.parametrize(
    ("url", "said"),
    [
        ("sqlite:///none.db?bucket_retention_days=0", "must be a finite number of days"),
        ("memory://x?foo=1", "unknown option foo"),
        ("sqlite:///nodir/x.db", "cannot open SQLite database nodir/x.db"),
        # blank: parse_qs dropped them, and the default was kept without a word
        ("sqlite:///none.db?bucket_retention_days=", "'' is not a number of days"),
        ("sqlite:///none.db?bucket_retention_dys=", "unknown option bucket_retention_dys"),
    ],
)
def test_checking_rules_against_a_store_url_that_replay_refuses_is_refused(
    tmp_path: Path, rules: Path, url: str, said: str
) -> None:
    # a store with nothing in it yet was said to take the rules, the URL not looked at
    for command in (["rules", "check", str(rules)], ["store", "forget-rule", "r"]):
        checked = limitflow(*command, "--store", url, cwd=tmp_path)
        assert checked.returncode == 3, checked.stdout.decode()
        assert said in one_line_reason(checked)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rules.yaml"]  # nothing made


def test_checking_rules_against_an_empty_sqlite_file_leaves_it_empty(
    tmp_path: Path, rules: Path
) -> None:
    (tmp_path / "made.db").touch()  # made by a provisioning step, as replay would take it
    store = f"sqlite:///{tmp_path / 'made.db'}"
    checked = limitflow("rules", "check", str(rules), "--store", store, cwd=tmp_path)
    assert checked.returncode == 0, checked.stderr.decode()
    assert checked.stdout.decode().endswith(
        f"{store}: no store there yet: it will keep these rules\n"
    )
    assert (tmp_path / "made.db").stat().st_size == 0


def test_the_sample_producer_with_no_broker_there_says_so_in_one_line(tmp_path: Path) -> None:
    # a new user's likeliest slip, no --bootstrap-servers: 120 s of "waiting for
    # 127.0.0.1:9094…" (the Docker Compose demo's), then a traceback
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]  # bound, not listening: connections are refused
        done = subprocess.run(
            [
                *(sys.executable, "examples/produce.py"),
                *("--bootstrap-servers", f"127.0.0.1:{port}", "--wait", "0"),
            ],
            cwd=Path(__file__).resolve().parents[2],
            capture_output=True,
            timeout=60,
        )
    assert done.returncode == 1
    assert b"Traceback" not in done.stderr
    assert done.stderr.decode().splitlines()[-1] == (
        f"produce.py: cannot reach Kafka at 127.0.0.1:{port}: --bootstrap-servers HOST:PORT"
        " names another"
    )


def test_the_sample_producer_keys_a_line_it_cannot_key_by_nothing() -> None:
    # an account_id of half a surrogate pair stopped it half way through a file, with a
    # traceback, where limitflow dead-letters the line
    path = Path(__file__).resolve().parents[2] / "examples" / "produce.py"
    spec = importlib.util.spec_from_file_location("sample_producer", path)
    assert spec is not None and spec.loader is not None
    produce = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(produce)
    assert produce.account_key(b'{"account_id": "\\ud800"}') is None
    assert produce.account_key(b'{"account_id": "acct-\\u00e9"}') == "acct-\u00e9".encode()
    assert produce.account_key(b"this is not json") is None


def test_the_sample_producer_sends_every_line_replay_would_decide(tmp_path: Path) -> None:
    # it left out lines of form feeds, which replay dead-letters, and split a line at a
    # lone carriage return: bad input the demo then dropped without a word
    path = Path(__file__).resolve().parents[2] / "examples" / "produce.py"
    spec = importlib.util.spec_from_file_location("sample_producer", path)
    assert spec is not None and spec.loader is not None
    produce = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(produce)
    events = tmp_path / "events.jsonl"
    events.write_bytes(b'\xef\xbb\xbf{"a": 1}\r\n \t\r\n\x0c\n{"b":\r2}\n\n\x0b\r\n')
    assert produce.lines(events, 0, 0) == [b'{"a": 1}', b"\x0c", b'{"b":\r2}', b"\x0b"]


@pytest.mark.parametrize(
    ("args", "usage"),
    [
        (
            [
                "replay",
                "--rules",
                "r",
                "--input",
                "i",
                "--output",
                "o",
                "--dead-letter",
                "d",
                "--dryrun",
            ],
            "usage: limitflow replay ",
        ),
        (["run", "--bootstrap-severs", "h:1"], "usage: limitflow run "),
        (
            ["rules", "check", "r.yaml", "--stor", "memory://", "--verbose"],
            "usage: limitflow rules check ",
        ),
        (["topics", "create", "--partition", "3", "--bogus"], "usage: limitflow topics create "),
    ],
)
def test_an_unknown_option_is_refused_with_its_command_s_usage(
    tmp_path: Path, args: list[str], usage: str
) -> None:
    # the top level's usage was shown ("limitflow [-h] {replay,rules,…}"), which says
    # nothing of the options of the command mistyped
    result = limitflow(*args, cwd=tmp_path)
    assert result.returncode == 2
    err = result.stderr.decode()
    assert err.startswith(usage), err
    assert "error: unrecognized arguments: " in err.splitlines()[-1]
