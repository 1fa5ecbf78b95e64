"""What a test process can see of another's signal handling, from ``/proc``.

A test that signals a process at a fixed delay raced its start: on a slow machine the
signal came before the handlers, and a process started with SIGINT ignored (a shell's
``cmd &`` without job control, as CI may start the tests, passes that on) lost it."""

from __future__ import annotations

from pathlib import Path

import pytest

needs_proc = pytest.mark.skipif(
    not Path("/proc/self/status").exists(), reason="reads /proc/PID of the process"
)


def catches(pid: int, sig: int) -> bool:
    """Whether process ``pid`` has a handler for ``sig`` (``SigCgt``, ``man 5 proc``)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) & (1 << (sig - 1)))
    raise AssertionError(f"no SigCgt for process {pid}")
