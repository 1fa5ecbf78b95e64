"""Creating the input, output and dead-letter topics, so nobody has to by hand."""

from __future__ import annotations

import logging
from typing import Final

from aiokafka.admin import AIOKafkaAdminClient, NewTopic  # type: ignore[import-untyped]
from aiokafka.errors import KafkaError  # type: ignore[import-untyped]

from limitflow.errors import ConfigError, LimitflowError
from limitflow.settings import MAX_MESSAGE_BYTES, TopicSettings

log = logging.getLogger("limitflow.topics")

_ALREADY_EXISTS: Final = 36


class TopicError(LimitflowError):
    """A topic could not be created (the broker said why)."""


KAFKA_MESSAGE_MAX_BYTES: Final = 1_048_588
"""Apache Kafka's default ``message.max.bytes``: the largest record batch a topic takes
unless its ``max.message.bytes`` says otherwise."""


def topic_configs(max_message_bytes: int) -> dict[str, str]:
    """The configs of the topics created for records of up to ``max_message_bytes``: a
    ``max.message.bytes`` with the headroom Kafka's default has over limitflow's when
    that is larger than the default, else none (the brokers' own). Topics made without
    it refused what ``run --max-message-bytes`` (over 1 MB) publishes, a dead letter on
    every retry, and took no input record as large as ``run`` decides."""
    if max_message_bytes <= MAX_MESSAGE_BYTES:
        return {}
    headroom = KAFKA_MESSAGE_MAX_BYTES - MAX_MESSAGE_BYTES
    return {"max.message.bytes": str(max_message_bytes + headroom)}


async def create_topics(admin: AIOKafkaAdminClient, settings: TopicSettings) -> dict[str, str]:
    """Create the three topics that are missing; ``{topic: "created" | "exists" | …}``.

    Existing topics are left as they are (their partition count is not changed); one
    with another partition count than asked is said so, and logged: an input topic with
    fewer partitions than planned caps how many members share the work, silently.
    """
    kafka = settings.kafka
    names = [kafka.input_topic, kafka.output_topic, kafka.dead_letter_topic]
    configs = topic_configs(kafka.max_message_bytes)
    try:
        response = await admin.create_topics(
            [
                NewTopic(
                    name, settings.partitions, settings.replication_factor, topic_configs=configs
                )
                for name in names
            ]
        )
    except KafkaError as exc:
        raise TopicError(f"cannot create topics on {kafka.bootstrap_servers}: {exc}") from exc
    outcome: dict[str, str] = {}
    failures: list[str] = []
    for entry in response.topic_errors:
        name, code, message = entry[0], entry[1], entry[2] if len(entry) > 2 else None
        if code == 0:
            outcome[name] = "created"
            log.info("topic created", extra={"topic": name, "partitions": settings.partitions})
        elif code == _ALREADY_EXISTS:
            outcome[name] = "exists"
            has = await partition_count(admin, name)
            if has != settings.partitions:
                outcome[name] = f"exists, kept with {has} partitions (not {settings.partitions})"
                log.warning(
                    "topic %s exists with %d partitions, not %d: kept",
                    name,
                    has,
                    settings.partitions,
                    extra={"topic": name, "partitions": has, "asked": settings.partitions},
                )
        else:
            failures.append(f"{name}: error {code} {message or ''}".strip())
    if failures:
        raise TopicError("cannot create topics: " + "; ".join(failures))
    return outcome


async def partition_count(admin: AIOKafkaAdminClient, topic: str) -> int:
    """How many partitions ``topic`` has; ``ConfigError`` when it does not exist."""
    described = await admin.describe_topics([topic])
    for entry in described:
        if entry.get("topic") == topic and entry.get("error_code", 0) == 0:
            return len(entry.get("partitions", []))
    raise ConfigError(f"topic {topic} does not exist (run: limitflow topics create …)")
