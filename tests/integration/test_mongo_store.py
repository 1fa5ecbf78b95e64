"""MongoStore against a real MongoDB wire-protocol server.

The server comes from ``tests.servers.mongo_server`` (mongoeco natively, MongoDB in
Docker), or from ``LIMITFLOW_MONGO_URI`` when one is already running. Each test works
in a database of its own. Data is kept small: mongoeco is slow on large collections.
"""

from __future__ import annotations

import asyncio
import json
import random
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest
from pymongo import AsyncMongoClient, monitoring
from pymongo.errors import OperationFailure

from handlers.state import Account, Bucket, EventRecord, Keys, Writes
from limitflow.errors import (
    ConfigError,
    ConflictError,
    StoreNotInitialized,
    StoreRejected,
)
from schemas.events import EventType
from stores import open_store
from stores.base import DAY, Retention
from stores.mongo import TTL_INDEX, MongoStore, _translate, split_url
from tests.servers import mongo_server_with_users

REPO = Path(__file__).resolve().parents[2]
LIMITFLOW = [sys.executable, "-m", "limitflow"]


# -- servers and stores ------------------------------------------------------------------


def database_url(server_uri: str, database: str, **params: str) -> str:
    """``server_uri`` pointed at ``database``, with extra query parameters."""
    parts = urlsplit(server_uri)
    query = "&".join(p for p in [parts.query, *(f"{k}={v}" for k, v in params.items())] if p)
    return urlunsplit((parts.scheme, parts.netloc, f"/{database}", query, ""))


def fresh_database() -> str:
    return f"lf_test_{uuid.uuid4().hex[:12]}"


@pytest.fixture
async def store_url(mongo_uri: str) -> AsyncIterator[str]:
    """URL of a database of its own, dropped afterwards."""
    database = fresh_database()
    yield database_url(mongo_uri, database, serverSelectionTimeoutMS="5000")
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(mongo_uri)
    try:
        await client.drop_database(database)
    finally:
        await client.close()


@pytest.fixture
async def store(store_url: str) -> AsyncIterator[MongoStore]:
    opened = open_store(store_url)
    assert isinstance(opened, MongoStore)
    await opened.init()
    try:
        yield opened
    finally:
        await opened.close()


def record(event_id: str, version: int = 1, **changes: Any) -> EventRecord:
    fields: dict[str, Any] = {
        "fingerprint": f"fp-{event_id}",
        "account_id": "acct-1",
        "type": EventType.PAYMENT,
        "accepted": True,
        "seq": 1,
        "verdict": b'{"decision":"accept","b":"\x00\xff"}',
        "amount": 12_345,
        "currency": "CNY",
        "buckets": ("b-day", "b-life"),
        "occurred": 1_773_450_000,
        "version": version,
    }
    fields.update(changes)
    return EventRecord(**fields)


# -- URLs (no server needed) -----------------------------------------------------------


def test_url_database_defaults_to_limitflow() -> None:
    assert split_url("mongodb://127.0.0.1:27017") == ("mongodb://127.0.0.1:27017/", "limitflow")
    assert split_url("mongodb://h:1/")[1] == "limitflow"
    assert split_url("mongodb://h:1/risk")[1] == "risk"


def test_url_limitflow_parameters_never_reach_the_driver() -> None:
    url, database = split_url(
        "mongodb://u:p%40ss@h1:1,h2:2/risk?replicaSet=rs0&bucket_retention_days=40"
        "&event_retention_days=2&w=majority"
    )
    assert database == "risk"
    assert url == "mongodb://u:p%40ss@h1:1,h2:2/risk?replicaSet=rs0&w=majority"


def test_url_options_reach_the_driver_as_written() -> None:
    # re-encoded, readPreferenceTags=dc:ny became dc%3Any and the driver refused the URL
    written = (
        "readPreference=nearest&readPreferenceTags=dc:ny,rack:r1&readPreferenceTags="
        "&authMechanismProperties=SERVICE_NAME:mongodb&appname=lim%20flow"
    )
    url, _ = split_url(f"mongodb://h:1/risk?bucket_retention_days=4&{written}")
    assert url == f"mongodb://h:1/risk?{written}"
    MongoStore.from_url(f"mongodb://h:1/risk?{written}")  # the driver takes them


def test_a_server_without_transactions_is_refused_with_what_to_do() -> None:
    # a standalone mongod answers the first transaction with code 20 (not testable here:
    # mongoeco, the only server on these machines, runs transactions on one node)
    refused = _translate(
        OperationFailure(
            "Transaction numbers are only allowed on a replica set member or mongos", code=20
        )
    )
    assert isinstance(refused, StoreRejected)
    assert "replica set" in str(refused) and "rs.initiate()" in str(refused)


def test_transient_server_errors_are_retriable_however_they_arrive() -> None:
    # mongoeco cannot be made to send these: checked on the driver's own error types
    from pymongo.errors import BulkWriteError

    for code in (91, 11601, 11602):
        assert _translate(OperationFailure("transient", code=code)).retriable, code
        bulk = BulkWriteError({"writeErrors": [{"index": 0, "code": code, "errmsg": "x"}]})
        assert _translate(bulk).retriable, code
    labelled = OperationFailure("x", code=1, details={"errorLabels": ["RetryableWriteError"]})
    assert _translate(labelled).retriable
    assert not _translate(OperationFailure("bad value", code=2)).retriable


def test_url_errors_are_config_errors_without_the_password() -> None:
    with pytest.raises(ConfigError) as caught:
        split_url("mongodb://user:secret@h:1/a.b")
    assert "secret" not in str(caught.value)
    for bad in ("notAnOption=1", "connectTimeoutMS=-5", "journal=maybe"):
        with pytest.raises(ConfigError):
            MongoStore.from_url(f"mongodb://h:1/x?{bad}")


def test_retention_after_a_semicolon_is_read_too() -> None:
    # MongoDB URIs may separate options with ";": the retention was silently ignored
    opened = open_store("mongodb://127.0.0.1:9/x?replicaSet=rs0;bucket_retention_days=2")
    assert isinstance(opened, MongoStore)
    assert opened.retention.bucket_seconds == 2 * DAY


def test_open_store_passes_retention_and_strips_it() -> None:
    opened = open_store("mongodb://127.0.0.1:9/x?bucket_retention_days=2&event_retention_days=3")
    assert isinstance(opened, MongoStore)
    assert opened.retention == Retention(bucket_seconds=2 * DAY, event_seconds=3 * DAY)
    assert opened.database_name == "x"


# -- schema ----------------------------------------------------------------------------


@pytest.mark.integration
async def test_check_before_init_says_not_initialized(store_url: str) -> None:
    store = MongoStore.from_url(store_url)
    try:
        with pytest.raises(StoreNotInitialized) as caught:
            await store.check()
        assert not caught.value.retriable
        await store.init()
        await store.init()  # idempotent
        await store.check()
        for name in ("buckets", "events"):
            index = (await store._db[name].index_information())[TTL_INDEX]
            assert index["key"] == [("expires_at", 1)]
            assert index["expireAfterSeconds"] == 0
    finally:
        await store.close()


@pytest.mark.integration
async def test_check_notices_a_dropped_ttl_index(store: MongoStore) -> None:
    await store._db["events"].drop_index(TTL_INDEX)
    with pytest.raises(StoreNotInitialized):
        await store.check()


@pytest.mark.integration
@pytest.mark.parametrize(
    ("field", "after"), [("expired", 0), ("expires_at", 400 * DAY)], ids=["field", "after"]
)
async def test_a_ttl_index_that_would_not_delete_as_records_expire_is_not_initialised(
    store_url: str, field: str, after: int
) -> None:
    # check looked only for an index of that name with some expireAfterSeconds: one on
    # another field (nothing ever deleted) or 400 days late passed, and init then failed
    # with the server's "Conflicting index definition"
    store = MongoStore.from_url(store_url)
    try:
        for name in ("buckets", "accounts", "events"):
            await store._db.create_collection(name)
        for name in ("buckets", "events"):
            await store._db[name].create_index(field, name=TTL_INDEX, expireAfterSeconds=after)
        with pytest.raises(StoreNotInitialized, match="not on expires_at with expireAfter"):
            await store.check()
        with pytest.raises(StoreRejected, match=r"dropIndex\('expires_at_ttl'\)"):
            await store.init()
        for name in ("buckets", "events"):
            await store._db[name].drop_index(TTL_INDEX)
        await store.init()
        await store.check()
    finally:
        await store.close()


# -- reads and writes --------------------------------------------------------------------


@pytest.mark.integration
async def test_records_round_trip(store: MongoStore) -> None:
    writes = Writes(
        buckets={
            "b-day": Bucket(count=2, amount=2**62, version=1, period_end=4_000_000_000),
            "b-life": Bucket(count=1, amount=5, version=1, period_end=None),
        },
        accounts={"acct-1": Account(seq=7, version=1)},
        events={
            "e1": record("e1"),
            "e2": record("e2", currency=None, accepted=False, buckets=(), amount=0),
        },
    )
    await store.commit(writes)
    snapshot = await store.load(
        Keys(buckets={"b-day", "b-life", "nope"}, accounts={"acct-1"}, events={"e1", "e2", "x"})
    )
    assert snapshot.buckets == writes.buckets
    assert snapshot.buckets["b-life"].expires_at is None  # lifetime buckets never expire
    assert snapshot.buckets["b-day"].expires_at == 4_000_000_000 + store.retention.bucket_seconds
    assert snapshot.accounts == writes.accounts
    assert snapshot.events == writes.events
    assert snapshot.events["e1"].verdict == b'{"decision":"accept","b":"\x00\xff"}'
    # fresh objects: changing what was read changes nothing stored
    snapshot.buckets["b-day"].count = 99
    again = await store.load(Keys(buckets={"b-day"}))
    assert again.buckets["b-day"].count == 2


class _Commands(monitoring.CommandListener):
    """The commands a client sends, as the server receives them."""

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        self.sent.append(dict(event.command))

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        pass

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        pass


@pytest.mark.integration
async def test_reads_see_only_what_a_majority_of_the_replica_set_holds(mongo_uri: str) -> None:
    # a read at the default read concern (local) may see a batch's transaction that a
    # failover then rolls back: a resend answered with its verdict, which the retried
    # batch may decide otherwise (found in review)
    commands = _Commands()
    database = fresh_database()
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(
        mongo_uri, event_listeners=[commands]
    )
    store = MongoStore(client, database)
    try:
        await store.init()
        await store.commit(Writes(events={"e1": record("e1")}))
        commands.sent.clear()
        snapshot = await store.load(Keys(buckets={"b"}, accounts={"a"}, events={"e1"}))
        assert set(snapshot.events) == {"e1"}
        finds = [c for c in commands.sent if "find" in c]
        assert finds, commands.sent
        assert all(c.get("readConcern") == {"level": "majority"} for c in finds), finds
    finally:
        await client.drop_database(database)
        await client.close()


@pytest.mark.integration
async def test_the_urls_wtimeout_reaches_every_commit(mongo_uri: str) -> None:
    # the store's w=majority replaced the URL's write concern whole: wtimeoutMS was
    # dropped without a word, and a commit no majority acknowledged waited for ever
    commands = _Commands()
    database = fresh_database()
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(
        database_url(mongo_uri, database, wtimeoutMS="5000", journal="true"),
        event_listeners=[commands],
    )
    store = MongoStore(client, database)
    try:
        await store.init()
        commands.sent.clear()
        await store.commit(Writes(events={"e1": record("e1")}))
        (commit,) = [c for c in commands.sent if "commitTransaction" in c]
        assert commit["writeConcern"] == {"w": "majority", "wtimeout": 5000, "j": True}
    finally:
        await client.drop_database(database)
        await client.close()
    with pytest.raises(ConfigError, match="journal=false: limitflow's commits wait"):
        MongoStore.from_url(database_url(mongo_uri, database, journal="false"))


@pytest.mark.integration
async def test_a_bucket_whose_expiry_has_milliseconds_can_still_be_written(
    store: MongoStore, store_url: str
) -> None:
    # an operator extends a bucket's life from mongosh (new Date(...) keeps ms): the read
    # gave the whole second, the commit filtered on it, and every later commit conflicted
    from datetime import UTC, datetime

    await store.commit(Writes(buckets={"b": Bucket(count=1, version=1, period_end=4_000_000_000)}))
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(store_url)
    try:
        stamp = datetime(2099, 1, 1, 0, 0, 0, 250_000, tzinfo=UTC)
        await client.get_default_database().buckets.update_one(
            {"_id": "b"}, {"$set": {"expires_at": stamp}}
        )
    finally:
        await client.close()
    read = (await store.load(Keys(buckets={"b"}))).buckets["b"]
    read.count, read.version = 2, read.version + 1
    await store.commit(Writes(buckets={"b": read}))
    assert (await store.load(Keys(buckets={"b"}))).buckets["b"].count == 2


@pytest.mark.integration
@pytest.mark.parametrize(
    ("collection", "edit"),
    [
        ("buckets", {"count": 1.5}),
        ("buckets", {"amount": -300}),
        ("buckets", {"count": "abc"}),
        ("buckets", {"version": 2.0}),
        ("events", {"seq": 1.5}),
        ("events", {"amount": -5}),
        ("events", {"accepted": "no"}),
        ("accounts", {"seq": 2.5}),
        # read as no expiry, but a write is conditioned on the field being absent: every
        # commit of the record conflicted, and `run` retried it for ever
        ("buckets", {"expires_at": None}),
        ("events", {"expires_at": None}),
    ],
)
async def test_a_record_edited_by_hand_into_what_limitflow_never_writes_is_refused(
    store: MongoStore, store_url: str, collection: str, edit: dict[str, Any]
) -> None:
    # int() read a double of 1.5 as 1, bool() read "no" as True, and a negative amount
    # left more room than the limit
    await store.commit(
        Writes(
            buckets={"b": Bucket(count=1, amount=100, version=1)},
            accounts={"acct-1": Account(seq=1, version=1)},
            events={"e": record("e")},
        )
    )
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(store_url)
    try:
        ids = {"buckets": "b", "events": "e", "accounts": "acct-1"}
        await client.get_default_database()[collection].update_one(
            {"_id": ids[collection]}, {"$set": edit}
        )
    finally:
        await client.close()
    with pytest.raises(StoreRejected, match="a stored"):
        await store.load(Keys(buckets={"b"}, accounts={"acct-1"}, events={"e"}))


@pytest.mark.integration
async def test_expires_at_is_a_bson_date_and_absent_when_never(store: MongoStore) -> None:
    await store.commit(
        Writes(
            buckets={
                "day": Bucket(count=1, version=1, period_end=4_000_000_000),
                "life": Bucket(count=1, version=1),
            }
        )
    )
    day = await store._db["buckets"].find_one({"_id": "day"})
    life = await store._db["buckets"].find_one({"_id": "life"})
    assert day is not None and life is not None
    assert isinstance(day["expires_at"], datetime)
    assert "expires_at" not in life


@pytest.mark.integration
async def test_reads_many_keys_in_chunks(
    store: MongoStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("stores.mongo.READ_CHUNK", 10)  # mongoeco is slow on big data
    keys = {f"k{n}" for n in range(230)}
    await store.commit(Writes(accounts={key: Account(seq=1, version=1) for key in keys}))
    before = store.round_trips
    snapshot = await store.load(Keys(accounts=keys))
    assert set(snapshot.accounts) == keys
    assert store.round_trips - before == 23  # one find per chunk, no getMore


@pytest.mark.integration
async def test_update_needs_the_previous_version(store: MongoStore) -> None:
    await store.commit(Writes(buckets={"b": Bucket(count=1, amount=10, version=1)}))
    await store.commit(Writes(buckets={"b": Bucket(count=2, amount=20, version=2)}))
    with pytest.raises(ConflictError) as caught:
        await store.commit(Writes(buckets={"b": Bucket(count=9, amount=90, version=2)}))
    assert caught.value.retriable
    with pytest.raises(ConflictError):
        await store.commit(Writes(buckets={"b": Bucket(count=9, amount=90, version=1)}))
    snapshot = await store.load(Keys(buckets={"b"}))
    assert (snapshot.buckets["b"].count, snapshot.buckets["b"].version) == (2, 2)


@pytest.mark.integration
async def test_a_conflict_anywhere_stores_nothing(store: MongoStore) -> None:
    await store.commit(Writes(events={"old": record("old")}))
    with pytest.raises(ConflictError):
        await store.commit(
            Writes(
                buckets={"new-bucket": Bucket(count=1, amount=1, version=1)},
                accounts={"new-account": Account(seq=1, version=1)},
                events={"new": record("new"), "old": record("old")},  # old exists: conflict
            )
        )
    with pytest.raises(ConflictError):
        await store.commit(
            Writes(
                buckets={"new-bucket": Bucket(count=1, amount=1, version=1)},
                events={"old": record("old", version=3)},  # stored is 1, not 2
            )
        )
    snapshot = await store.load(
        Keys(buckets={"new-bucket"}, accounts={"new-account"}, events={"new", "old"})
    )
    assert not snapshot.buckets and not snapshot.accounts
    assert set(snapshot.events) == {"old"}


@pytest.mark.integration
async def test_zombie_writer_cannot_overwrite_newer_state(store_url: str) -> None:
    """Two processes read the same bucket; the one that commits second must lose."""
    first, zombie = MongoStore.from_url(store_url), MongoStore.from_url(store_url)
    try:
        await first.init()
        await first.commit(Writes(buckets={"m": Bucket(count=1, amount=100, version=1)}))
        keys = Keys(buckets={"m"}, accounts={"a"})
        seen_by_first = await first.load(keys)
        seen_by_zombie = await zombie.load(keys)
        for snapshot, amount in ((seen_by_first, 50), (seen_by_zombie, 70)):
            bucket = snapshot.buckets["m"]
            bucket.count, bucket.amount, bucket.version = (
                bucket.count + 1,
                bucket.amount + amount,
                2,
            )
        await first.commit(
            Writes(buckets={"m": seen_by_first.buckets["m"]}, accounts={"a": Account(1, 1)})
        )
        with pytest.raises(ConflictError):
            await zombie.commit(
                Writes(buckets={"m": seen_by_zombie.buckets["m"]}, accounts={"a": Account(1, 1)})
            )
        stored = (await zombie.load(Keys(buckets={"m"}))).buckets["m"]
        assert (stored.count, stored.amount, stored.version) == (2, 150, 2)
    finally:
        await first.close()
        await zombie.close()


@pytest.mark.integration
async def test_amounts_beyond_int64_are_refused_not_corrupted(store: MongoStore) -> None:
    with pytest.raises(StoreRejected) as caught:
        await store.commit(
            Writes(
                accounts={"a": Account(seq=1, version=1)},
                buckets={"b": Bucket(count=1, amount=2**63, version=1)},
            )
        )
    assert not caught.value.retriable
    assert not (await store.load(Keys(accounts={"a"}, buckets={"b"}))).accounts


@pytest.mark.integration
async def test_expired_records_read_as_empty_and_keep_their_versions(store: MongoStore) -> None:
    # near the real time: the server's TTL monitor deletes by its own clock
    now = float(int(time.time()))
    early = MongoStore(
        store.client, store.database_name, Retention(DAY, 2 * DAY), clock=lambda: now
    )
    await early.commit(
        Writes(
            buckets={"b": Bucket(count=3, amount=300, version=1, period_end=int(now) + 60)},
            events={"e": record("e", occurred=int(now))},
        )
    )
    keys = Keys(buckets={"b"}, events={"e"})
    assert (await early.load(keys)).buckets["b"].count == 3
    late = MongoStore(
        store.client, store.database_name, Retention(DAY, 2 * DAY), clock=lambda: now + 3 * DAY
    )
    snapshot = await late.load(keys)
    assert snapshot.buckets["b"] == Bucket(version=1, expires_at=int(now) + 60 + DAY)
    assert snapshot.events == {}
    expired = snapshot.expired_events["e"]
    assert (expired.version, expired.expires_at) == (1, int(now) + 2 * DAY)
    # a new record replaces the expired one on condition it is still stored as read
    bucket = Bucket(1, 5, 2, int(now + 3 * DAY), expires_at=int(now) + 60 + DAY)
    event = record("e", version=2, occurred=int(now + 3 * DAY), expires_at=expired.expires_at)
    await late.commit(Writes(buckets={"b": bucket}, events={"e": event}))
    fresh = await late.load(keys)
    assert (fresh.buckets["b"].count, fresh.buckets["b"].version) == (1, 2)
    assert fresh.events["e"].version == 2


@pytest.mark.integration
async def test_ttl_deletion_does_not_let_a_stale_writer_overwrite_the_new_record(
    store: MongoStore,
) -> None:
    """The server's own TTL deletion, not a simulated one: B reads a bucket and an event
    record just before they expire, the server deletes them, A creates them again at
    version 1, and B's write (conditioned on version 1) must not replace A's records."""
    # 10 s: with 2, the seconds truncated from ``now`` and a slow commit on a busy
    # machine could reach the expiry before B's read
    seconds = Retention(bucket_seconds=10, event_seconds=10)
    handle = MongoStore(store.client, store.database_name, seconds)  # the real clock
    now = int(time.time())
    await handle.commit(
        Writes(
            buckets={"b": Bucket(count=1, amount=10, version=1, period_end=now)},
            events={"e": record("e", occurred=now, verdict=b'{"old":1}')},
        )
    )
    keys = Keys(buckets={"b"}, events={"e"})
    seen_by_b = await handle.load(keys)
    assert seen_by_b.buckets["b"].version == 1 and seen_by_b.events["e"].version == 1

    db = store.client[store.database_name]
    deadline = time.monotonic() + 150  # MongoDB's TTL monitor runs once a minute
    while await db["buckets"].find_one({"_id": "b"}) or await db["events"].find_one({"_id": "e"}):
        assert time.monotonic() < deadline, "the server never deleted the expired records"
        await asyncio.sleep(0.5)

    seen_by_a = await handle.load(keys)
    assert not seen_by_a.buckets and not seen_by_a.events
    later = int(time.time())
    await handle.commit(
        Writes(
            buckets={"b": Bucket(count=1, amount=20, version=1, period_end=later + DAY)},
            events={"e": record("e", occurred=later + DAY, verdict=b'{"A":1}')},
        )
    )
    bucket, event = seen_by_b.buckets["b"], seen_by_b.events["e"]
    bucket.count, bucket.amount, bucket.version = 2, 30, 2
    event.reversed, event.version = 5, 2
    with pytest.raises(ConflictError):
        await handle.commit(Writes(buckets={"b": bucket}, events={"e": event}))
    stored = await handle.load(keys)
    assert (stored.buckets["b"].count, stored.buckets["b"].amount) == (1, 20)
    assert stored.events["e"].verdict == b'{"A":1}' and stored.events["e"].reversed == 0


UNREACHABLE = """
import asyncio, socket, sys
from handlers.state import Bucket, Keys, Writes
from limitflow.errors import StoreUnavailable
from stores.mongo import MongoStore

async def main() -> None:
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    store = MongoStore.from_url(
        f"mongodb://127.0.0.1:{port}/x?serverSelectionTimeoutMS=300&connectTimeoutMS=300"
    )
    attempts = {
        "check": store.check,
        "load": lambda: store.load(Keys(buckets={"b"})),
        "commit": lambda: store.commit(Writes(buckets={"b": Bucket(count=1, version=1)})),
    }
    for name, attempt in attempts.items():
        try:
            await attempt()
        except StoreUnavailable as exc:
            print(name, exc.retriable, type(exc.__cause__).__name__)
    await store.close()

asyncio.run(main())
"""


@pytest.mark.integration
def test_unreachable_server_is_retriable() -> None:
    # In a child process: PyMongo 4.20's async client leaks the socket of a refused
    # connect, and its ResourceWarning would fail whichever test the collector hits.
    done = subprocess.run(
        [sys.executable, "-c", UNREACHABLE],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:3] == [
        "check True ServerSelectionTimeoutError",
        "load True ServerSelectionTimeoutError",
        "commit True ServerSelectionTimeoutError",
    ]


# -- the whole CLI against memory:// -------------------------------------------------------


def generated_events(count: int, seed: int) -> list[str]:
    """Payments over few accounts/merchants, with reversals, resends and bad lines."""
    rng = random.Random(seed)
    moment = datetime(2026, 3, 14, 1, tzinfo=UTC)
    lines: list[str] = []
    payments: list[tuple[str, str]] = []
    for n in range(count):
        moment += timedelta(seconds=rng.randint(1, 900))
        account = f"acct-{rng.randrange(6)}"
        roll = rng.random()
        if roll < 0.08 and payments:
            original, owner = rng.choice(payments)
            doc: dict[str, Any] = {
                "event_id": f"g-{n}",
                "type": "reversal",
                "account_id": owner,
                "original_event_id": original,
                "occurred_at": moment.isoformat(),
            }
        elif roll < 0.14 and lines:
            lines.append(rng.choice(lines))  # a resend: same event_id, same body
            continue
        elif roll < 0.16:
            lines.append('{"event_id": "broken", "amount": ')
            continue
        else:
            currency = "JPY" if roll > 0.95 else "CNY"
            doc = {
                "event_id": f"g-{n}",
                "account_id": account,
                "card_id": f"card-{account}",
                "merchant_id": f"m-{rng.randrange(3)}",
                "amount": str(rng.randint(100, 9_000))
                if currency == "JPY"
                else f"{rng.randint(100, 250_000) / 100:.2f}",
                "currency": currency,
                "occurred_at": moment.isoformat(),
                "channel": "atm" if rng.random() < 0.2 else "pos",
            }
            payments.append((f"g-{n}", account))
        lines.append(json.dumps(doc))
    return lines


def limitflow(*argv: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """The command line ``limitflow ARGV…``, run to its end, its output captured."""
    return subprocess.run(
        [*LIMITFLOW, *argv], cwd=REPO, capture_output=True, text=True, timeout=timeout, check=False
    )


def run_replay(
    store: str, events: Path, out: Path, rules: Path, batch_size: int | None = None
) -> subprocess.CompletedProcess[str]:
    argv = ["replay", "--rules", str(rules), "--input", str(events)]
    argv += ["--output", str(out / "verdicts.jsonl"), "--dead-letter", str(out / "dead.jsonl")]
    argv += ["--store", store]
    if batch_size is not None:
        argv += ["--batch-size", str(batch_size)]
    return limitflow(*argv, timeout=300)


def init_store(url: str) -> None:
    done = limitflow("store", "init", "--store", url)
    assert done.returncode == 0, done.stderr


@pytest.mark.integration
def test_a_replay_before_store_init_says_the_command_once(store_url: str, tmp_path: Path) -> None:
    # was: "…: run `limitflow store init` (run: limitflow store init --store '…')"
    events = tmp_path / "events.jsonl"
    events.write_text((REPO / "examples" / "events.jsonl").read_text())
    done = run_replay(store_url, events, tmp_path, REPO / "examples" / "rules.yaml")
    assert done.returncode == 3
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("limitflow: store: MongoDB database ")
    assert line.endswith(f": run `limitflow store init --store '{store_url}'`")
    assert line.count("store init") == 1


@pytest.mark.integration
@pytest.mark.parametrize("batch_size", [None, 7])
def test_replay_matches_memory_byte_for_byte(
    store_url: str, tmp_path: Path, batch_size: int | None
) -> None:
    events = tmp_path / "events.jsonl"
    sample = (REPO / "examples" / "events.jsonl").read_text()
    events.write_text(sample + "\n".join(generated_events(250, seed=11)) + "\n" + sample)
    rules = REPO / "examples" / "rules.yaml"
    init_store(store_url)
    outputs = {}
    for name, url in (("memory", "memory://"), ("mongo", store_url)):
        out = tmp_path / name
        out.mkdir()
        done = run_replay(url, events, out, rules, batch_size)
        assert done.returncode == 0, done.stderr
        outputs[name] = (
            (out / "verdicts.jsonl").read_bytes(),
            (out / "dead.jsonl").read_bytes(),
            done.stderr.rsplit(" in ", 1)[0],  # summary line without the timing
        )
    assert outputs["mongo"] == outputs["memory"]
    verdicts = outputs["mongo"][0].decode().splitlines()
    assert any('"decision":"reject"' in line for line in verdicts)
    assert any('"type":"reversal"' in line for line in verdicts)


@pytest.mark.integration
def test_a_user_logs_in_with_the_password_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server that answers only clients logged in: the URL names the user alone, every
    command reads the password from LIMITFLOW_STORE_PASSWORD, and a wrong or missing one
    is refused in one line that shows no password. (mongoeco announces no mechanisms, so
    the driver would log in with SCRAM-SHA-1, which mongoeco gets wrong: the URL asks for
    SCRAM-SHA-256, which the driver picks by itself on MongoDB 4.0 and later.)"""
    password = "pa ss:w@rd/?#"  # what a URL would have to escape
    events = tmp_path / "events.jsonl"
    events.write_text((REPO / "examples" / "events.jsonl").read_text())
    rules = REPO / "examples" / "rules.yaml"
    with mongo_server_with_users({"app": password}) as server:
        url = (
            f"mongodb://app@{urlsplit(server.uri).netloc}/{fresh_database()}"
            "?authMechanism=SCRAM-SHA-256&serverSelectionTimeoutMS=5000"
        )
        monkeypatch.setenv("LIMITFLOW_STORE_PASSWORD", password)
        init_store(url)
        outputs = {}
        for name, store in (("memory", "memory://"), ("mongo", url)):
            (tmp_path / name).mkdir()
            done = run_replay(store, events, tmp_path / name, rules)
            assert done.returncode == 0, done.stderr
            outputs[name] = (tmp_path / name / "verdicts.jsonl").read_bytes()
        assert outputs["mongo"] == outputs["memory"]
        checked = limitflow("rules", "check", str(rules), "--store", url)
        assert checked.returncode == 0, checked.stderr
        for given in ("not the password", None):
            if given is None:
                monkeypatch.delenv("LIMITFLOW_STORE_PASSWORD")
            else:
                monkeypatch.setenv("LIMITFLOW_STORE_PASSWORD", given)
            (tmp_path / "refused").mkdir(exist_ok=True)
            refused = run_replay(url, events, tmp_path / "refused", rules)
            assert refused.returncode == 3, refused.stderr
            (line,) = refused.stderr.strip().splitlines()
            if given is None:
                assert line == (
                    f"limitflow: store: {url}: A password is required for user 'app': set"
                    " LIMITFLOW_STORE_PASSWORD"
                )
            else:
                assert line == (
                    "limitflow: store: MongoDB refused the login: Authentication failed (check"
                    " the user the URL names, and its password: LIMITFLOW_STORE_PASSWORD, or"
                    " the URL)"
                )
            assert password not in line and "not the password" not in line


# -- several processes on one merchant bucket ------------------------------------------------

MERCHANT_RULES = """\
rules:
  - id: merchant-day
    scope: merchant_id
    window: day
    timezone: UTC
    currency: CNY
    max_amount: "6000.00"
"""


@pytest.mark.integration
def test_concurrent_processes_never_exceed_a_shared_limit(store_url: str, tmp_path: Path) -> None:
    """Four ``limitflow replay`` processes, disjoint events, one merchant's daily limit."""
    rules = tmp_path / "rules.yaml"
    rules.write_text(MERCHANT_RULES)
    rng = random.Random(5)
    processes, per_process = 4, 30
    files = []
    for worker in range(processes):
        lines = [
            json.dumps(
                {
                    "event_id": f"w{worker}-{n}",
                    "account_id": f"acct-{worker}-{n % 3}",
                    "merchant_id": "m-shared",
                    "amount": f"{rng.randint(50, 150)}.{rng.randint(0, 99):02d}",
                    "currency": "CNY",
                    "occurred_at": f"2026-03-14T10:{n:02d}:{worker:02d}Z",
                }
            )
            for n in range(per_process)
        ]
        path = tmp_path / f"events-{worker}.jsonl"
        path.write_text("\n".join(lines) + "\n")
        files.append(path)
    assert sum(  # the offered total is well past the limit
        Decimal(json.loads(line)["amount"]) for f in files for line in f.read_text().splitlines()
    ) > Decimal("9000")
    init_store(store_url)
    running = []
    for worker, path in enumerate(files):
        out = tmp_path / f"out-{worker}"
        out.mkdir()
        argv = [*LIMITFLOW, "replay", "--rules", str(rules), "--input", str(path)]
        argv += ["--output", str(out / "v.jsonl"), "--dead-letter", str(out / "d.jsonl")]
        argv += ["--store", store_url, "--batch-size", "3"]
        running.append((out, subprocess.Popen(argv, cwd=REPO, stderr=subprocess.PIPE, text=True)))
    accepted_minor = accepted_count = verdict_count = 0
    try:
        for _, proc in running:
            _, stderr = proc.communicate(timeout=600)
            assert proc.returncode == 0, stderr
    finally:  # the others too, when one failed
        for _, proc in running:
            proc.kill()
            proc.communicate()
    for out, _ in running:
        for line in (out / "v.jsonl").read_text().splitlines():
            verdict = json.loads(line)
            verdict_count += 1
            if verdict["decision"] == "accept":
                accepted_count += 1
                accepted_minor += int(Decimal(verdict["amount"]) * 100)
    assert verdict_count == processes * per_process
    assert 0 < accepted_minor <= 600_000
    assert accepted_count < verdict_count  # the limit was reached

    async def stored_bucket() -> list[dict[str, Any]]:
        store = MongoStore.from_url(store_url)
        try:
            return await store._db["buckets"].find({}).to_list()
        finally:
            await store.close()

    buckets = asyncio.run(stored_bucket())
    assert len(buckets) == 1
    assert buckets[0]["amount"] == accepted_minor
    assert buckets[0]["count"] == accepted_count
