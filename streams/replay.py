"""``limitflow replay``: a file of events in, verdicts and dead letters out, in order."""

from __future__ import annotations

import hashlib
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import BinaryIO, Final

import msgspec

from handlers.decide import OutcomeKind
from limitflow.console import say
from limitflow.settings import MAX_MESSAGE_BYTES
from schemas.events import JSON_BLANK_BYTES
from schemas.verdicts import dead_letter, verdict_encoder
from streams.engine import Engine, Oversized, Record, Result, process_within


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
    decided: int = 0
    """Lines of the batches decided (and stored, unless a dry run), their output lines
    handed to the outputs or not: ``lines`` but a batch whose writing failed."""
    decided_last_line: int = 0
    """The line number of the last of ``decided`` (0 for none)."""


_BOM: Final = b"\xef\xbb\xbf"
MAX_LINE_BYTES: Final = MAX_MESSAGE_BYTES
"""Most bytes of one input line a replay reads (``--max-line-bytes``), as ``run`` takes
records of at most ``--max-message-bytes``: a file with no line ends (a JSON array of
gigabytes, a binary file) was read whole into memory, three times over."""
_CHUNK: Final = 1 << 16
BATCH_BYTES: Final = 16 * 1024 * 1024
"""Most bytes of input lines one batch of a replay holds (at least one line): a batch
ends at its ``batch_size`` lines or once they hold this many bytes, whichever comes
first. Lines are held, and decoded, a whole batch at a time: 2,000 lines of up to
``--max-line-bytes`` each held 2 GB, and decoded (an event of 1 MB of numbers in an
extra field decodes to ~14 MB of objects) ~28 GB. Events of up to 8 KB keep whole
batches of 2,000; ``run``'s batches are bounded likewise by its fetches."""


class LongLine(Oversized, frozen=True, gc=False):
    """A line over the most a replay reads, in its place: not read, so not decided, and
    dead-lettered by size and SHA-256 (``raw`` is empty; ``limit``: the most a line may
    hold, which this one is over)."""

    def refusal(self) -> str:
        return (
            f"a line of {self.size:,} bytes, over the {self.limit:,} a replay takes"
            " (--max-line-bytes): not decided; its size and SHA-256 name it"
        )


def read_lines(
    source: BinaryIO,
    batch_size: int,
    pending: list[Record],
    max_line_bytes: int = MAX_LINE_BYTES,
    batch_bytes: int = BATCH_BYTES,
) -> Iterator[bool]:
    """Read non-blank lines into ``pending`` as records with their 1-based line numbers;
    yield each time it holds ``batch_size``, or lines of ``batch_bytes`` bytes or more
    (the caller takes them out), and end at the
    end of ``source`` with the rest there. A line of more than ``max_line_bytes`` (its
    line end aside) is read past, not kept: a ``LongLine`` is there in its place.

    The lines read stay in ``pending``, the caller's, until the caller takes them: a
    read cut short by a signal (``Interrupted``, which may be raised anywhere in here)
    loses none of them.
    A UTF-8 byte order mark starting the file is not part of its first line (editors on
    Windows write one; RFC 8259 lets a reader ignore it)."""
    add = pending.append
    readline = source.readline
    most = max_line_bytes + len(_BOM) + 2  # a line end of \r\n, a byte order mark
    number = 0
    held = 0  # bytes of the lines read since the last yield
    while line := readline(most):
        number += 1
        if len(line) == most and not line.endswith(b"\n"):  # and more of it to come
            record: Record | None = _long_line(line, readline, number, max_line_bytes)
        else:
            raw = line.rstrip(b"\r\n")
            if number == 1 and raw.startswith(_BOM):
                raw = raw[len(_BOM) :]
            if not raw.strip(JSON_BLANK_BYTES):
                continue
            if len(raw) <= max_line_bytes:  # its line end aside
                record = Record(raw, {"line": number})
            else:
                digest = hashlib.sha256(raw).hexdigest()
                record = LongLine(
                    b"", {"line": number}, size=len(raw), sha256=digest, limit=max_line_bytes
                )
        if record is None:  # a long line of blanks
            continue
        add(record)
        held += len(record.raw)
        if len(pending) >= batch_size or held >= batch_bytes:
            yield True
            held = 0


def _long_line(
    start: bytes, readline: Callable[[int], bytes], number: int, limit: int
) -> Record | None:
    """The ``LongLine`` of line ``number``, which begins with ``start`` and goes on in
    ``readline`` to its end; None when it is blank, its ``Record`` when it is not over
    ``limit`` after all (a line end of many \r). Its size and SHA-256 are those of its
    bytes as a replay reads them: without its line end, or a byte order mark starting
    the file."""
    digest = hashlib.sha256()
    head = bytearray()  # its bytes while they are not over the limit
    size = 0
    blank = True
    chunk = start
    held = 0  # the \r that end the chunks so far, which may be the start of its line's end:
    # counted, not kept (a run of gigabytes of them was held, and copied at every chunk)
    first = number == 1  # a byte order mark yet to take off
    while True:
        last = not chunk or chunk.endswith(b"\n")  # not chunk: the end of the file
        data = chunk.rstrip(b"\r\n") if last else chunk.rstrip(b"\r")
        if data and held:  # more of the line after them: the \r held are of its bytes
            for done in range(0, held, _CHUNK):
                crs = b"\r" * min(_CHUNK, held - done)
                digest.update(crs)
                size += len(crs)
                if size <= limit:
                    head += crs
            held = 0
        if not last:
            held += len(chunk) - len(data)
        if first and data.startswith(_BOM):
            data = data[len(_BOM) :]
        first = False
        digest.update(data)
        size += len(data)
        if size <= limit:
            head += data
        blank = blank and not data.strip(JSON_BLANK_BYTES)
        if last:
            break
        chunk = readline(_CHUNK)
    if blank:
        return None
    if size <= limit:
        return Record(bytes(head), {"line": number})
    return LongLine(b"", {"line": number}, size=size, sha256=digest.hexdigest(), limit=limit)


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
    max_line_bytes: int = MAX_LINE_BYTES,
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
    lines = read_lines(source, batch_size, pending, max_line_bytes)
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
    # where it stopped: a replay stopped by a signal is not all done (it said 100%)
    position = source.tell() if total_bytes and summary.interrupted else total_bytes
    progress.update(summary, position, force=True)
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
    if any(type(record) is LongLine for record in batch):
        results = await process_within(engine, batch)
    else:
        results = await engine.process(batch)
    line = batch[-1].source["line"]
    last_line = line if isinstance(line, int) else 0
    summary.decided += len(batch)
    summary.decided_last_line = last_line
    if verdicts is dead_letters:
        _write(verdicts, _lines(results, summary, verdicts=True, dead=True), "output")
    else:
        _write(verdicts, _lines(results, summary, verdicts=True), "output")
        _write(dead_letters, _lines(results, summary, dead=True), "dead-letter")
    summary.lines += len(batch)
    summary.last_line = last_line
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
                if isinstance(record, LongLine):  # by size and hash: its bytes were not kept
                    letter = msgspec.structs.replace(
                        letter, raw=None, raw_size=record.size, raw_sha256=record.sha256
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
