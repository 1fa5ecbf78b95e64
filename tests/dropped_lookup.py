"""``python -m tests.dropped_lookup limitflow run …``: ``limitflow run`` whose
``LOOKUP_DROPPED``-th (default 2) transaction coordinator lookup (FindCoordinator, as a
transactional producer sends it) fails with ``KafkaConnectionError``, as it does when
the broker's connection closes while the request is in flight (a broker restarting).

aiokafka's producer retries a lookup the broker answers "not available" to, or does not
answer, but raises any other error as a bare ``KafkaError`` from it, which stops its
sender (or its start). The window is a broker going away during one round trip: too
narrow to hit on demand, so this script fails one lookup exactly as the closed
connection fails it, and runs the real command line against the real broker.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from aiokafka.client import AIOKafkaClient, CoordinationType  # type: ignore[import-untyped]
from aiokafka.errors import KafkaConnectionError  # type: ignore[import-untyped]

_lookup = AIOKafkaClient.coordinator_lookup
_DROPPED = int(os.environ.get("LOOKUP_DROPPED", "2"))
_lookups: list[bool] = []


async def _one_dropped(self: Any, coordinator_type: Any, coordinator_key: Any) -> Any:
    if coordinator_type == CoordinationType.TRANSACTION:
        _lookups.append(True)
        if len(_lookups) == _DROPPED:
            print("dropping a transaction coordinator lookup", file=sys.stderr, flush=True)
            raise KafkaConnectionError("Connection at the broker closed")
    return await _lookup(self, coordinator_type, coordinator_key)


AIOKafkaClient.coordinator_lookup = _one_dropped

if __name__ == "__main__":
    sys.argv.pop(1)  # "limitflow"
    from limitflow.__main__ import main

    sys.exit(main())
