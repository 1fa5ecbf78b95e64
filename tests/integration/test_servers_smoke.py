"""Proves each test server works with the client libraries limitflow uses.

Needs scripts/install-test-servers.sh to have run; without it every test here
fails with a ServerNotInstalled error saying so (deselect with
``-m "not integration"``). Async tests rely on ``asyncio_mode = "auto"``.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator

import pytest

from tests.servers import (
    DynamoDBLocal,
    KafkaBroker,
    MongoServer,
    dynamodb_local,
    kafka_broker,
    mongo_server,
)

pytestmark = pytest.mark.integration

# tansu needs a short session timeout: a (re)joining member waits for it.
GROUP_TIMEOUTS = {"session_timeout_ms": 6000, "heartbeat_interval_ms": 1000}


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


# --------------------------------------------------------------------------
# Kafka (aiokafka) on tansu and noida
# --------------------------------------------------------------------------


@pytest.fixture(scope="module", params=["tansu", "noida"])
def kafka(request: pytest.FixtureRequest) -> Iterator[KafkaBroker]:
    with kafka_broker(request.param) as broker:
        yield broker


@pytest.fixture(scope="module")
def noida() -> Iterator[KafkaBroker]:
    with kafka_broker("noida") as broker:
        yield broker


async def _create_topic(bootstrap: str, topic: str, partitions: int = 1) -> None:
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic  # type: ignore[import-untyped]

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, partitions, 1)])
    finally:
        await admin.close()


async def _produce(bootstrap: str, topic: str, values: list[bytes]) -> None:
    from aiokafka import AIOKafkaProducer  # type: ignore[import-untyped]

    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        for i, value in enumerate(values):
            await producer.send_and_wait(topic, value, key=f"k{i % 3}".encode())
    finally:
        await producer.stop()


async def _drain(consumer: object, expected: int, timeout: float = 20.0) -> list[bytes]:
    values: list[bytes] = []
    deadline = time.monotonic() + timeout
    while len(values) < expected and time.monotonic() < deadline:
        batches = await consumer.getmany(timeout_ms=500)  # type: ignore[attr-defined]
        for records in batches.values():
            values.extend(r.value for r in records)
    return values


async def test_kafka_produce_consume_group_commit(kafka: KafkaBroker) -> None:
    from aiokafka import AIOKafkaConsumer

    bootstrap = kafka.bootstrap_servers
    topic, group = _name("payments"), _name("limitflow")
    await _create_topic(bootstrap, topic, partitions=2)
    sent = [f"v{i}".encode() for i in range(10)]
    await _produce(bootstrap, topic, sent)

    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id=group,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        **GROUP_TIMEOUTS,
    )
    await consumer.start()
    try:
        got = await _drain(consumer, len(sent))
        assert sorted(got) == sorted(sent)
        await consumer.commit()
        positions = {tp: await consumer.committed(tp) for tp in consumer.assignment()}
    finally:
        await consumer.stop()
    assert sum(o or 0 for o in positions.values()) == len(sent)

    # The group's offsets survive the member: a fresh client reads them back.
    checker = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group, **GROUP_TIMEOUTS)
    await checker.start()
    try:
        for tp, offset in positions.items():
            assert await checker.committed(tp) == offset
    finally:
        await checker.stop()


async def test_noida_transactions_with_offsets(noida: KafkaBroker) -> None:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

    bootstrap = noida.bootstrap_servers
    source, verdicts, group = _name("in"), _name("verdicts"), _name("limitflow")
    await _create_topic(bootstrap, source)
    await _create_topic(bootstrap, verdicts)
    await _produce(bootstrap, source, [b"p0", b"p1"])

    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, transactional_id=_name("tx"))
    await producer.start()
    try:
        for commit, offset in ((False, 1), (True, 2)):
            await producer.begin_transaction()
            await producer.send_and_wait(verdicts, b"committed" if commit else b"aborted")
            await producer.send_offsets_to_transaction({TopicPartition(source, 0): offset}, group)
            if commit:
                await producer.commit_transaction()
            else:
                await producer.abort_transaction()
    finally:
        await producer.stop()

    reader = AIOKafkaConsumer(
        verdicts,
        bootstrap_servers=bootstrap,
        isolation_level="read_committed",
        auto_offset_reset="earliest",
    )
    await reader.start()
    try:
        assert await _drain(reader, 1) == [b"committed"]
        await asyncio.sleep(1)  # an aborted record would have arrived by now
        assert await _drain(reader, 1, timeout=1) == []
    finally:
        await reader.stop()

    checker = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group, **GROUP_TIMEOUTS)
    await checker.start()
    try:
        assert await checker.committed(TopicPartition(source, 0)) == 2
    finally:
        await checker.stop()


async def test_tansu_has_no_producer_ids() -> None:
    """Known tansu limit: InitProducerId fails, so no idempotent/transactional producer.

    If this starts failing, tansu gained support: update tests/servers.py docs.
    """
    from aiokafka import AIOKafkaProducer
    from aiokafka.errors import KafkaError  # type: ignore[import-untyped]

    with kafka_broker("tansu") as broker:
        producer = AIOKafkaProducer(
            bootstrap_servers=broker.bootstrap_servers, transactional_id=_name("tx")
        )
        with pytest.raises(KafkaError):
            await producer.start()
        await producer.stop()


async def test_kafka_broker_restart_keeps_port(kafka: KafkaBroker) -> None:
    from aiokafka import AIOKafkaConsumer

    topic = _name("restart")
    await _create_topic(kafka.bootstrap_servers, topic)
    await _produce(kafka.bootstrap_servers, topic, [b"before"])
    old_pid = kafka.pid
    kafka.stop()
    assert kafka.pid is None
    kafka.start()
    assert kafka.pid not in (None, old_pid)

    if kafka.kind == "tansu":  # memory storage: the topic is gone
        await _create_topic(kafka.bootstrap_servers, topic)
    await _produce(kafka.bootstrap_servers, topic, [b"after"])
    consumer = AIOKafkaConsumer(
        topic, bootstrap_servers=kafka.bootstrap_servers, auto_offset_reset="earliest"
    )
    await consumer.start()
    try:
        expected = [b"after"] if kafka.kind == "tansu" else [b"before", b"after"]
        assert await _drain(consumer, len(expected)) == expected
    finally:
        await consumer.stop()


# --------------------------------------------------------------------------
# MongoDB wire protocol (pymongo.AsyncMongoClient) on mongoeco
# --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def mongo() -> Iterator[MongoServer]:
    with mongo_server() as server:
        yield server


async def test_mongo_crud_transactions_and_unique_index(mongo: MongoServer) -> None:
    from pymongo import AsyncMongoClient, ReturnDocument
    from pymongo.errors import DuplicateKeyError

    client: AsyncMongoClient[dict[str, object]] = AsyncMongoClient(
        mongo.uri, serverSelectionTimeoutMS=5000
    )
    try:
        db = client[_name("limitflow")]
        counters = db.counters
        await counters.insert_one({"_id": "card-1", "count": 1})

        upserted = await counters.find_one_and_update(
            {"_id": "card-2"},
            {"$inc": {"count": 5}, "$setOnInsert": {"window": "1d"}},
            upsert=True,
            return_document=ReturnDocument.AFTER,
        )
        assert upserted == {"_id": "card-2", "count": 5, "window": "1d"}

        # Committed transaction: both writes land.
        async with client.start_session() as session, await session.start_transaction():
            await counters.update_one({"_id": "card-1"}, {"$inc": {"count": 1}}, session=session)
            await db.ledger.insert_one({"_id": "tx-1"}, session=session)
        assert (await counters.find_one({"_id": "card-1"}))["count"] == 2  # type: ignore[index]
        assert await db.ledger.find_one({"_id": "tx-1"}) == {"_id": "tx-1"}

        # An exception inside the block aborts: neither write lands.
        with pytest.raises(RuntimeError):
            async with client.start_session() as session, await session.start_transaction():
                await counters.update_one(
                    {"_id": "card-1"}, {"$inc": {"count": 100}}, session=session
                )
                await db.ledger.insert_one({"_id": "tx-2"}, session=session)
                raise RuntimeError("abort")
        assert (await counters.find_one({"_id": "card-1"}))["count"] == 2  # type: ignore[index]
        assert await db.ledger.find_one({"_id": "tx-2"}) is None

        await db.idempotency.create_index("event_id", unique=True)
        await db.idempotency.insert_one({"event_id": "e-1"})
        with pytest.raises(DuplicateKeyError) as err:
            await db.idempotency.insert_one({"event_id": "e-1"})
        assert err.value.code == 11000
    finally:
        await client.close()


async def test_mongo_restart_keeps_uri(mongo: MongoServer) -> None:
    from pymongo import AsyncMongoClient

    mongo.restart()  # in-memory engine: data is gone, the URI stays valid
    client: AsyncMongoClient[dict[str, object]] = AsyncMongoClient(
        mongo.uri, serverSelectionTimeoutMS=5000
    )
    try:
        assert (await client.admin.command("ping"))["ok"] == 1
    finally:
        await client.close()


# --------------------------------------------------------------------------
# DynamoDB Local (aioboto3)
# --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def dynamodb() -> Iterator[DynamoDBLocal]:
    with dynamodb_local() as server:
        yield server


async def test_dynamodb_transact_write_cancellation_and_batch_get(dynamodb: DynamoDBLocal) -> None:
    import aioboto3  # type: ignore[import-untyped]
    from botocore.config import Config  # type: ignore[import-untyped]

    session = aioboto3.Session()
    config = Config(retries={"max_attempts": 1})
    async with session.client("dynamodb", config=config, **dynamodb.client_kwargs()) as ddb:
        table = _name("limits")
        await ddb.create_table(
            TableName=table,
            KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
            AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
            BillingMode="PAY_PER_REQUEST",
        )
        await ddb.put_item(TableName=table, Item={"pk": {"S": "card-1"}, "count": {"N": "3"}})

        with pytest.raises(ddb.exceptions.TransactionCanceledException) as err:
            await ddb.transact_write_items(
                TransactItems=[
                    {
                        "Update": {
                            "TableName": table,
                            "Key": {"pk": {"S": "card-1"}},
                            "UpdateExpression": "ADD #c :one",
                            "ConditionExpression": "#c < :limit",
                            "ExpressionAttributeNames": {"#c": "count"},
                            "ExpressionAttributeValues": {":one": {"N": "1"}, ":limit": {"N": "3"}},
                            "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
                        }
                    },
                    {"Put": {"TableName": table, "Item": {"pk": {"S": "ledger-1"}}}},
                ]
            )
        reasons = err.value.response["CancellationReasons"]
        assert [r["Code"] for r in reasons] == ["ConditionalCheckFailed", "None"]
        assert reasons[0]["Item"]["count"] == {"N": "3"}

        got = await ddb.batch_get_item(
            RequestItems={
                table: {"Keys": [{"pk": {"S": "card-1"}}, {"pk": {"S": "ledger-1"}}]},
            }
        )
        items = got["Responses"][table]
        assert items == [{"pk": {"S": "card-1"}, "count": {"N": "3"}}]  # ledger-1 rolled back
        assert not got["UnprocessedKeys"]


async def test_dynamodb_restart_keeps_endpoint(dynamodb: DynamoDBLocal) -> None:
    import aioboto3

    dynamodb.restart()  # -inMemory: tables are gone, the endpoint stays valid
    async with aioboto3.Session().client("dynamodb", **dynamodb.client_kwargs()) as ddb:
        assert (await ddb.list_tables())["TableNames"] == []
