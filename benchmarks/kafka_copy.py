"""The least any consumer on the benchmark's broker does: read, forward, commit.

    python -m benchmarks.kafka_copy BOOTSTRAP INPUT OUTPUT GROUP

The ``copy`` runtime of ``benchmarks/kafka_pipeline.py``: a consumer group member that
takes batches as ``limitflow run`` does (``getmany``, 2,000 records, the same fetch wait),
publishes each record's value unchanged to the output topic with its ``event_id`` in a
header (read from the JSON, as any consumer must parse its input), waits for the broker's
acknowledgements, then commits the offsets. No decision and no store: its events/s is the
ceiling the broker, aiokafka and the machine put on any runtime, limitflow's included.
Not part of the product. Stops on SIGTERM.
"""

from __future__ import annotations

import asyncio
import signal
import sys

import msgspec
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer  # type: ignore[import-untyped]


async def copy(bootstrap: str, source: str, target: str, group: str) -> None:
    consumer = AIOKafkaConsumer(
        source,
        bootstrap_servers=bootstrap,
        group_id=group,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        max_poll_records=2_000,
        fetch_max_wait_ms=50,
        session_timeout_ms=6_000,
    )
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=2)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    await consumer.start()
    await producer.start()
    decode = msgspec.json.decode
    try:
        while not stop.is_set():
            batches = await consumer.getmany(timeout_ms=500)
            acks = []
            for records in batches.values():
                for record in records:
                    event_id = decode(record.value).get("event_id", "")
                    acks.append(
                        await producer.send(
                            target,
                            record.value,
                            key=record.key,
                            headers=[("event_id", str(event_id).encode())],
                        )
                    )
            if acks:
                await asyncio.gather(*acks)
                await consumer.commit()
    finally:
        await producer.stop()
        await consumer.stop()


if __name__ == "__main__":
    asyncio.run(copy(*sys.argv[1:5]))
