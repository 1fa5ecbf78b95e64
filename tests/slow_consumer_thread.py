"""``python -m tests.slow_consumer_thread faust -A streams.faust_app worker …``: the faust
worker, its consumer thread slow to start its service (``THREAD_START_DELAY`` seconds,
default 1), and a line on stderr, ``consumer thread starting``, as that delay begins.

A SIGTERM that reached a worker while its consumer thread was starting (a few
milliseconds, found by a chaos soak and once by CI) left the thread running for ever:
mode's stop of a thread service does nothing before the thread has started the service,
and the worker never exited. The delay makes that window wide enough to send a SIGTERM
into it every time; everything else is faust's, mode's and limitflow's own code.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

from mode.threads import ServiceThread

_start_thread = ServiceThread._start_thread
_DELAY = float(os.environ.get("THREAD_START_DELAY", "1"))


def _slow_start_thread(self: Any) -> None:
    if type(self).__name__ == "_ConsumerThread":
        print("consumer thread starting", file=sys.stderr, flush=True)
        time.sleep(_DELAY)  # in the thread itself, before it starts its service
    _start_thread(self)


ServiceThread._start_thread = _slow_start_thread  # type: ignore[method-assign]

if __name__ == "__main__":
    sys.argv.pop(1)  # "faust"
    from faust.cli.faust import cli

    sys.exit(cli())
