"""``python -m tests.expired_producer_id limitflow run …``: ``limitflow run`` whose
transactional producers are answered, once, ``INVALID_PRODUCER_ID_MAPPING`` (49) to an
``AddPartitionsToTxn`` (the ``EXPIRE_AT``-th one the process sends, default 3), as a broker
answers a producer whose transactional id it no longer knows.

Apache Kafka forgets a transactional id its coordinator heard nothing of for
``transactional.id.expiration.ms`` (7 days by default): an input partition that stayed
quiet that long while ``run`` ran has a producer whose id the coordinator has dropped,
and its next transaction is refused so. The brokers the tests run never expire one, so
this script rewrites one answer, exactly as such a broker sends it, and runs the real
command line against the real broker: everything after that response is limitflow's and
aiokafka's own code.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from aiokafka.errors import InvalidProducerIdMapping  # type: ignore[import-untyped]
from aiokafka.producer import sender  # type: ignore[import-untyped]

_handle = sender.AddPartitionsToTxnHandler.handle_response
_EXPIRE_AT = int(os.environ.get("EXPIRE_AT", "3"))
_answers: list[bool] = []


def _one_expired(self: Any, resp: Any) -> Any:
    _answers.append(True)
    if len(_answers) == _EXPIRE_AT:
        print("answering INVALID_PRODUCER_ID_MAPPING", file=sys.stderr, flush=True)
        resp.errors = [
            (topic, [(partition, InvalidProducerIdMapping.errno) for partition, _ in errors])
            for topic, errors in resp.errors
        ]
    return _handle(self, resp)


sender.AddPartitionsToTxnHandler.handle_response = _one_expired

if __name__ == "__main__":
    sys.argv.pop(1)  # "limitflow"
    from limitflow.__main__ import main

    sys.exit(main())
