"""Creating the input, output and dead-letter topics, so nobody has to by hand."""

from __future__ import annotations

import logging
from typing import Final

from aiokafka.admin import AIOKafkaAdminClient, NewTopic  # type: ignore[import-untyped]
from aiokafka.errors import KafkaError  # type: ignore[import-untyped]

from limitflow.errors import ConfigError, LimitflowError
from limitflow.settings import TopicSettings

log = logging.getLogger("limitflow.topics")

_ALREADY_EXISTS: Final = 36


class TopicError(LimitflowError):
    """A topic could not be created (the broker said why)."""


async def create_topics(admin: AIOKafkaAdminClient, settings: TopicSettings) -> dict[str, str]:
    """Create the three topics that are missing; ``{topic: "created" | "exists" | …}``.

    Existing topics are left as they are (their partition count is not changed); one
    with another partition count than asked is said so, and logged: an input topic with
    fewer partitions than planned caps how many members share the work, silently.
    """
    kafka = settings.kafka
    names = [kafka.input_topic, kafka.output_topic, kafka.dead_letter_topic]
    try:
        response = await admin.create_topics(
            [NewTopic(name, settings.partitions, settings.replication_factor) for name in names]
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
