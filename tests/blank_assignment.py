"""``python -m tests.blank_assignment limitflow run …`` (or ``… faust -A
streams.faust_app worker …``): ``limitflow run`` (or the faust worker) whose first group
assignment (``BLANK_JOIN=N`` in the environment: its N-th; ``every``: each) arrives empty
(zero bytes), as a Kafka-protocol broker may send it.

Apache Kafka's classic group coordinator gives a member empty bytes when the leader's
SyncGroup left it out (it fills in "empty assignments for members" it was not told
about), and noida-db did so once in a chaos test: aiokafka then failed to decode them and
``limitflow run`` exited 1. The brokers the tests run do not do it on demand, so this
script makes one of the coordinator's completed joins return empty bytes, exactly what
such a SyncGroup response carries, and runs the real command line against the real
broker: everything after the SyncGroup response is limitflow's, faust's and aiokafka's
own code.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from aiokafka.consumer import group_coordinator  # type: ignore[import-untyped]

_join = group_coordinator.CoordinatorGroupRebalance.perform_group_join
_BLANK_JOIN = os.environ.get("BLANK_JOIN", "1")
"""Which completed join is blanked: ``1``, the first (the default), ``2``…, or ``every``."""
_joins: list[bool] = []


async def _one_join_blank(self: Any) -> Any:
    result = await _join(self)
    if result is not None:
        _joins.append(True)
        if _BLANK_JOIN in ("every", str(len(_joins))):
            protocol, _ = result
            print(f"blanking the assignment of join {len(_joins)}", file=sys.stderr, flush=True)
            return protocol, b""
    return result


group_coordinator.CoordinatorGroupRebalance.perform_group_join = _one_join_blank

if __name__ == "__main__":
    program = sys.argv.pop(1)
    if program == "faust":
        from faust.cli.faust import cli

        sys.exit(cli())
    from limitflow.__main__ import main

    sys.exit(main())
