"""``python -m tests.slow_leave limitflow run …``: ``limitflow run`` whose consumer,
closing, takes ``LEAVE_DELAY`` seconds (default 3) before it sends its LeaveGroup, with a
line on stderr, ``leaving the group``, as that delay begins.

A second SIGINT while the Kafka clients close must not cut the close short (the handlers
were once removed first: KeyboardInterrupt, exit 130, and the member never left its
group). The close of a healthy consumer takes milliseconds, and a frozen broker kept it
going only mostly: aiokafka skips the leave when it has given up the coordinator, and
the close then ended before the second signal (CI, 3 tries of 3). The delay makes the
window wide enough to signal into it every time; the LeaveGroup itself, and everything
else, is aiokafka's and limitflow's own code against the real broker.
"""

from __future__ import annotations

import asyncio
import os
import sys
from typing import Any

from aiokafka.consumer import group_coordinator  # type: ignore[import-untyped]

_leave = group_coordinator.GroupCoordinator._maybe_leave_group
_DELAY = float(os.environ.get("LEAVE_DELAY", "3"))


async def _slow_leave(self: Any) -> None:
    print("leaving the group", file=sys.stderr, flush=True)
    await asyncio.sleep(_DELAY)
    await _leave(self)


group_coordinator.GroupCoordinator._maybe_leave_group = _slow_leave

if __name__ == "__main__":
    sys.argv.pop(1)  # "limitflow"
    from limitflow.__main__ import main

    sys.exit(main())
