"""Creating the input, output and dead-letter topics, so nobody has to by hand."""

from __future__ import annotations

import logging
from typing import Final

from aiokafka.admin import AIOKafkaAdminClient, NewTopic  # type: ignore[import-untyped]
from aiokafka.admin.config_resource import (  # type: ignore[import-untyped]
    ConfigResource,
    ConfigResourceType,
)
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


def needed_message_bytes(max_message_bytes: int) -> int:
    """The ``max.message.bytes`` a topic needs to take what ``run`` publishes with
    ``--max-message-bytes``: Kafka's default at limitflow's, the same headroom above."""
    return max_message_bytes + KAFKA_MESSAGE_MAX_BYTES - MAX_MESSAGE_BYTES


def topic_configs(max_message_bytes: int) -> dict[str, str]:
    """The configs of the topics created for records of up to ``max_message_bytes``: a
    ``max.message.bytes`` with the headroom Kafka's default has over limitflow's when
    that is larger than the default, else none (the brokers' own). Topics made without
    it refused what ``run --max-message-bytes`` (over 1 MB) publishes, a dead letter on
    every retry, and took no input record as large as ``run`` decides."""
    if max_message_bytes <= MAX_MESSAGE_BYTES:
        return {}
    return {"max.message.bytes": str(needed_message_bytes(max_message_bytes))}


async def create_topics(admin: AIOKafkaAdminClient, settings: TopicSettings) -> dict[str, str]:
    """Create the three topics that are missing; ``{topic: "created" | "exists" | …}``.

    Existing topics are left as they are (their partition count is not changed); one
    with another partition count than asked is said so, and logged: an input topic with
    fewer partitions than planned caps how many members share the work, silently. So
    is an output or dead-letter topic whose ``max.message.bytes`` is below what
    ``--max-message-bytes`` needs: the first record ``run`` publishes over it is refused
    on every retry, and ``run`` stops (exit 4).
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
    published = [kafka.output_topic, kafka.dead_letter_topic]
    kept = [name for name in published if outcome.get(name, "").startswith("exists")]
    needed = needed_message_bytes(kafka.max_message_bytes)
    for name, has in (await message_bytes(admin, kept)).items():
        if has < needed:
            outcome[name] += f", max.message.bytes {has} (run publishes up to {needed})"
            log.warning(
                "topic %s exists with max.message.bytes %d: run, with --max-message-bytes"
                " %d, publishes records of up to %d, and stops at the first it refuses",
                name,
                has,
                kafka.max_message_bytes,
                needed,
                extra={"topic": name, "max_message_bytes": has, "needed": needed},
            )
    return outcome


async def message_bytes(admin: AIOKafkaAdminClient, topics: list[str]) -> dict[str, int]:
    """The ``max.message.bytes`` each of ``topics`` is set to, where the brokers say it
    (tansu gives none it was not created with: the brokers' own then, unknown here)."""
    if not topics:
        return {}
    try:
        responses = await admin.describe_configs(
            [ConfigResource(ConfigResourceType.TOPIC, name) for name in topics]
        )
    except KafkaError as exc:  # only a warning is at stake: the topics exist
        log.warning("cannot read the topics' configs: %s", exc)
        return {}
    found: dict[str, int] = {}
    for response in responses:
        for error, _message, _kind, name, entries in response.resources:
            for entry in entries if error == 0 else ():
                if entry[0] == "max.message.bytes" and str(entry[1]).isdigit():
                    found[name] = int(entry[1])
    return found


async def partition_count(admin: AIOKafkaAdminClient, topic: str) -> int:
    """How many partitions ``topic`` has; ``ConfigError`` when it does not exist."""
    described = await admin.describe_topics([topic])
    for entry in described:
        if entry.get("topic") == topic and entry.get("error_code", 0) == 0:
            return len(entry.get("partitions", []))
    raise ConfigError(f"topic {topic} does not exist (run: limitflow topics create …)")
