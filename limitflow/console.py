"""What the one-shot commands tell the person at the terminal: messages and a progress
line on stderr, a command's answer on stdout.

A stderr that cannot be written (the terminal went away under a replay that ignores
SIGHUP, a full disk, a reader that left) must not change what a command does or its exit
code: its messages are dropped from then on, and stderr is pointed at /dev/null, so
that Python's flush at exit does not fail again on what is still buffered. A stdout
that cannot be written is the command's own failure: ``StdoutFailed``, which the
command line says on stderr in one line.

This module imports nothing heavy: ``limitflow.cli`` uses it before the rest loads.
"""

from __future__ import annotations

import io
import os
import select
import sys
from typing import Any


class StdoutFailed(Exception):
    """Standard output could not be written (not a reader that left: that is
    ``BrokenPipeError``, which the command line reports as a shell would)."""

    def __init__(self, exc: OSError) -> None:
        super().__init__(f"cannot write standard output: {exc.strerror or exc}")


def to_devnull(stream: int) -> None:
    """Point ``stream`` at /dev/null: what is buffered for it then flushes there."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, stream)
        finally:
            os.close(devnull)
    except OSError:
        pass  # nothing better to do: the stream was closed or never existed


def say(text: str, *, end: str = "\n") -> bool:
    """Write ``text`` on stderr, when there is one and it can still be written; False
    when it cannot (it is not tried again). A line after one left open (a progress
    display's, written with ``end=""``) starts on a line of its own."""
    stderr = sys.stderr
    if stderr is None or _stderr.lost:
        return False
    if _stderr.open_line and not text.startswith("\r"):
        text = "\n" + text
    try:
        stderr.write(text + end)
        stderr.flush()
        _stderr.open_line = not end
    except OSError:  # BrokenPipeError included: nobody reads it any more
        _stderr.lost = True
        try:
            fileno = stderr.fileno()
        except (OSError, ValueError):
            return False
        to_devnull(fileno)
        return False
    return True


def out(line: str) -> None:
    """Print ``line`` on stdout, flushed: ``StdoutFailed`` when it cannot be written,
    ``BrokenPipeError`` when its reader left.

    A stdout left non-blocking by whoever started the command (a pipe whose O_NONBLOCK
    the parent set) is waited on when full, as a blocking one is: Python's ``print``
    there dropped what did not fit without a word, and `rules check` of a few
    thousand rules ended with exit 0, its listing cut short."""
    try:
        fd = non_blocking_fd(sys.stdout)
        if fd is None:
            print(line, flush=True)
        else:
            sys.stdout.flush()
            data = (line + "\n").encode(sys.stdout.encoding, sys.stdout.errors or "strict")
            waiting = Waiting(fd)
            while data:
                data = data[waiting.write(data) :]
    except BrokenPipeError:
        raise
    except OSError as exc:
        to_devnull(sys.stdout.fileno())
        raise StdoutFailed(exc) from None


def non_blocking_fd(stream: object) -> int | None:
    """The descriptor of ``stream`` when it is non-blocking; None otherwise, or when it
    has none (a stream in memory)."""
    try:
        fd = stream.fileno()  # type: ignore[attr-defined]
        return None if os.get_blocking(fd) else int(fd)
    except (AttributeError, OSError, ValueError):
        return None


class Waiting(io.RawIOBase):
    """Standard input or output left non-blocking by whoever started the command (a pipe
    whose O_NONBLOCK the parent set): a read finding nothing there yet waits for it, a
    write finding the pipe full waits for room, as on a blocking one (replay's input and
    outputs, and every command's answer through ``out``). A read of it
    returned nothing, taken for the end of the input: the replay decided the lines there
    were so far, the last one cut short as a dead letter, and ended with exit 0, the rest
    unread; a write wrote part of the verdicts, dropped the rest without a word, and the
    replay ended with exit 0. Its flags are left as they are: the open file is the
    starter's too."""

    def __init__(self, fd: int) -> None:
        self._fd = fd

    def readable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self._fd

    def readinto(self, buffer: Any) -> int:
        while True:
            try:
                return os.readv(self._fd, [buffer])
            except BlockingIOError:
                select.select([self._fd], [], [])  # a signal's handler may end the wait

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        while True:
            try:
                return os.write(self._fd, data)
            except BlockingIOError:
                select.select([], [self._fd], [])


class _Stderr:
    """Whether stderr failed once (then nothing more is written there), and whether its
    last line was left open."""

    lost = False
    open_line = False


_stderr = _Stderr()
