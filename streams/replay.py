"""``limitflow replay``: a file of events in, verdicts and dead letters out, in order."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import BinaryIO, Final

from handlers.decide import OutcomeKind
from limitflow.console import say
from schemas.events import JSON_BLANK_BYTES
from schemas.verdicts import dead_letter, verdict_encoder
from streams.engine import Engine, Record, Result


@dataclass(slots=True)
class ReplaySummary:
    """Counts of one replay, printed at the end."""

    lines: int = 0
    verdicts: int = 0
    duplicates: int = 0
    dead_letters: int = 0
    accepted: int = 0
    rejected: int = 0
    seconds: float = 0.0
    interrupted: bool = False
    """Stopped by a signal: every line read before it is decided, written and stored."""
    last_line: int = 0
    """The line number of the last event decided (0 for none)."""


_BOM: Final = b"\xef\xbb\xbf"


def read_lines(source: BinaryIO, batch_size: int, pending: list[Record]) -> Iterator[bool]:
    """Read non-blank lines into ``pending`` as records with their 1-based line numbers;
    yield each time it holds ``batch_size`` (the caller takes them out), and end at the
    end of ``source`` with the rest there.

    The lines read stay in ``pending``, the caller's, until the caller takes them: a
    read cut short by a signal (``Interrupted``, which may be raised anywhere in here)
    loses none of them.
    A UTF-8 byte order mark starting the file is not part of its first line (editors on
    Windows write one; RFC 8259 lets a reader ignore it)."""
    add = pending.append
    for number, line in enumerate(source, start=1):
        raw = line.rstrip(b"\r\n")
        if number == 1 and raw.startswith(_BOM):
            raw = raw[len(_BOM) :]
        if not raw.strip(JSON_BLANK_BYTES):
            continue
        add(Record(raw, {"line": number}))
        if len(pending) >= batch_size:
            yield True


class _Progress:
    """A one-line progress display on stderr, only when stderr is a terminal."""

    def __init__(self, total_bytes: int | None) -> None:
        self.enabled = sys.stderr is not None and sys.stderr.isatty()
        self.total = total_bytes
        self.last = 0.0

    def update(self, summary: ReplaySummary, position: int | None, force: bool = False) -> None:
        now = time.monotonic()
        if not self.enabled or (now - self.last < 0.2 and not force):
            return
        self.last = now
        rate = summary.lines / summary.seconds if summary.seconds else 0.0
        share = ""
        if self.total and position is not None:
            done = min(position / self.total, 1.0)
            bar = "#" * int(done * 30)
            share = f"[{bar:<30}] {done:4.0%} "
        # a stderr that cannot be written (the terminal went away) ends the display, not
        # the replay
        self.enabled = say(
            f"\r{share}{summary.lines:,} events  {summary.accepted:,} accepted  "
            f"{summary.rejected:,} rejected  {summary.dead_letters:,} dead  {rate:,.0f}/s ",
            end="\n" if force else "",
        )


async def replay(
    engine: Engine,
    source: BinaryIO,
    verdicts: BinaryIO,
    dead_letters: BinaryIO,
    *,
    batch_size: int = 2_000,
    total_bytes: int | None = None,
    stop: Interruption | None = None,
    summary: ReplaySummary | None = None,
) -> ReplaySummary:
    """Decide every event of ``source``; each non-blank line goes to exactly one output.

    When both outputs are one stream (``--output - --dead-letter -``), it gets verdicts
    and dead letters together in input order. ``stop`` is told while a batch is being
    decided and written, and asked after each: once ``stop.requested``, the replay ends
    there (``summary.interrupted``), with every line before it decided and written.
    ``summary``: counted into as the replay goes (a new one by default), so that a
    caller whose replay failed knows which lines were decided and written before.
    """
    summary = summary or ReplaySummary()
    progress = _Progress(total_bytes)
    stop = stop or Interruption()
    started = time.perf_counter()
    pending: list[Record] = []
    lines = read_lines(source, batch_size, pending)
    more: bool | None = True
    while more:
        stop.reading = True
        if stop.requested:
            break
        try:
            more = next(lines, None)  # may wait on a pipe: a signal ends the wait
            stop.reading = False
        except Interrupted:
            stop.reading = False
            more = None  # the lines read before are decided: a pipe's cannot be read again
        batch = pending[:]  # taken out here, not in ``read_lines``, where a signal may
        pending.clear()  # cut in between the two
        if batch:
            await _decide(engine, batch, verdicts, dead_letters, summary, stop)
            summary.seconds = time.perf_counter() - started
            position = source.tell() if total_bytes else None
            progress.update(summary, position)
    summary.interrupted = stop.requested
    _write(verdicts, b"", "output")
    _write(dead_letters, b"", "dead-letter")
    summary.seconds = time.perf_counter() - started
    progress.update(summary, total_bytes, force=True)
    return summary


async def _decide(
    engine: Engine,
    batch: list[Record],
    verdicts: BinaryIO,
    dead_letters: BinaryIO,
    summary: ReplaySummary,
    stop: Interruption,
) -> None:
    """Decide one batch and write its lines, counted into ``summary``."""
    stop.deciding = True
    results = await engine.process(batch)
    if verdicts is dead_letters:
        _write(verdicts, _lines(results, summary, verdicts=True, dead=True), "output")
    else:
        _write(verdicts, _lines(results, summary, verdicts=True), "output")
        _write(dead_letters, _lines(results, summary, dead=True), "dead-letter")
    summary.lines += len(batch)
    line = batch[-1].source["line"]
    summary.last_line = line if isinstance(line, int) else 0
    stop.deciding = False


class Interruption:
    """A stop asked of a replay (by a signal handler): ``requested`` once asked;
    ``deciding`` while a batch is being decided and written, which a stop lets finish;
    ``reading`` while the next batch is read, which a stop may cut short by raising
    ``Interrupted`` (a read from a pipe can wait for ever)."""

    __slots__ = ("deciding", "reading", "requested")

    def __init__(self) -> None:
        self.deciding = False
        self.reading = False
        self.requested = False


class Interrupted(Exception):
    """Raised by a signal handler into a replay's read of its input."""


class WriteFailed(Exception):
    """An output could not be written (``output``: ``"output"`` or ``"dead-letter"``)."""

    def __init__(self, output: str, exc: OSError) -> None:
        super().__init__(exc.strerror or str(exc))
        self.output = output


def _write(stream: BinaryIO, data: bytes, output: str) -> None:
    """Write ``data`` (and flush, when it is empty), as ``WriteFailed`` when that fails:
    not to be taken for a failure to read the input."""
    try:
        if data:
            stream.write(data)
        else:
            stream.flush()
    except OSError as exc:
        raise WriteFailed(output, exc) from exc


# Python 3.11's EnumType has a __getattr__, so ``OutcomeKind.DUPLICATE`` costs a slow
# attribute lookup (~0.1 us) wherever it is written: once per result here, before these.
_DEAD_LETTER: Final = OutcomeKind.DEAD_LETTER
_DUPLICATE: Final = OutcomeKind.DUPLICATE


def _lines(
    results: list[Result], summary: ReplaySummary, *, verdicts: bool = False, dead: bool = False
) -> bytes:
    """The lines of ``results`` that are verdicts and/or dead letters, each ended by a
    newline, in input order, counted into ``summary``; b"" for none. Joined once, not
    copied once more per line to end it."""
    lines: list[bytes] = []
    add = lines.append
    accepted = rejected = duplicates = dead_letters = 0
    for result in results:
        kind = result.kind
        if kind is _DEAD_LETTER:
            if dead:
                dead_letters += 1
                assert result.error is not None and result.detail is not None
                record = result.record
                letter = dead_letter(
                    result.error, result.detail, record.raw, record.source, result.event_id
                )
                add(verdict_encoder.encode(letter))
        elif verdicts:
            if kind is _DUPLICATE:
                duplicates += 1
            elif result.decision == "accept":
                accepted += 1
            else:
                rejected += 1
            assert result.verdict is not None
            add(result.verdict)
    summary.verdicts += accepted + rejected + duplicates
    summary.duplicates += duplicates
    summary.accepted += accepted
    summary.rejected += rejected
    summary.dead_letters += dead_letters
    if not lines:
        return b""
    add(b"")  # for the last line's newline
    return b"\n".join(lines)
