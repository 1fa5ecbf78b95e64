"""MongoDB state store: three collections of records, one multi-document transaction per commit.

Documents are keyed by ``_id`` in ``buckets``, ``accounts`` and ``events`` (and ``rules``:
what each rule's counters hold, see ``Store.keep_rules``). A commit runs
one ``bulk_write`` per collection inside a transaction: a record with new version 1 is
an insert (a duplicate key means another writer created it first), any later version a
``ReplaceOne`` filtered on ``{_id, version: v - 1, expires_at: <as read>}`` (just the
version for accounts) whose matched count must equal the number of operations. Any miss
aborts the whole transaction, so a batch is stored all together or not at all, and a
writer that decided on stale state never overwrites newer state. The filter on the
expiry keeps a record that the TTL monitor deleted and a writer created again (its
versions restart at 1) from passing for the one read before the deletion. Unlike a
per-counter ``find_one_and_update``, no limit is checked or applied on its own: every
bucket, the account sequence and the idempotency record move together.

``expires_at`` is a BSON date so that a TTL index (``expireAfterSeconds=0``) deletes
expired records; it is absent for records that never expire. The TTL monitor runs late
(about once a minute), so ``Store.load`` also treats expired records as empty.
"""

from __future__ import annotations

import contextlib
import re
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Final
from urllib.parse import quote, unquote, urlsplit, urlunsplit

from bson import Binary
from pymongo import AsyncMongoClient, InsertOne, ReplaceOne
from pymongo.asynchronous.client_session import AsyncClientSession
from pymongo.asynchronous.collection import AsyncCollection
from pymongo.asynchronous.database import AsyncDatabase
from pymongo.errors import (
    BulkWriteError,
    ConfigurationError,
    ConnectionFailure,
    DuplicateKeyError,
    ExecutionTimeout,
    InvalidOperation,
    OperationFailure,
    PyMongoError,
    WTimeoutError,
)
from pymongo.read_concern import ReadConcern
from pymongo.read_preferences import ReadPreference
from pymongo.write_concern import WriteConcern

from handlers.state import Account, Bucket, EventRecord, Keys, Snapshot, Writes
from limitflow.errors import (
    ConfigError,
    ConflictError,
    StoreError,
    StoreNotInitialized,
    StoreRejected,
    StoreUnavailable,
)
from schemas.events import EventType
from stores.base import (
    RETENTION_PARAMS,
    DamagedRecord,
    Expected,
    Retention,
    Store,
    after_prefix,
    key_hint,
    redacted,
)
from stores.verdict_codec import pack_verdict, unpack_verdict

Document = dict[str, Any]

DEFAULT_DATABASE = "limitflow"
BUCKETS, ACCOUNTS, EVENTS = "buckets", "accounts", "events"
RULES = "rules"
"""What each rule's counters hold (``Store.keep_rules``): ``{_id: <rule id>:<window>, meaning}``.
Made by ``store init``, or by the first insert into a database initialised before it."""
EXPIRING = (BUCKETS, EVENTS)
"""Collections with a TTL index on ``expires_at`` (account sequences never expire)."""
TTL_INDEX = "expires_at_ttl"

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
READ_CHUNK = 1_000
"""Ids per ``find``: keeps each query far below the 16 MiB command limit."""
COMMIT_ATTEMPTS = 3
"""Tries of ``commitTransaction`` whose outcome is unknown (it is safe to repeat)."""

# Server error codes that mean "another transaction got there first": retry from a
# fresh read. WriteConflict, LockTimeout, NoSuchTransaction (aborted under us),
# TransactionCoordinatorSteppingDown / ...ReachedAbortDecision, TransactionTooOld.
_CONFLICT_CODES = frozenset({112, 24, 251, 244, 282, 225})
_AUTHENTICATION_FAILED: Final = 18
_ILLEGAL_OPERATION: Final = 20
_DUPLICATE_KEY = 11000
_NOT_INITIALIZED_CODES = frozenset({26})  # NamespaceNotFound
_UNAVAILABLE_CODES = frozenset(
    {6, 7, 64, 89, 91, 134, 189, 262, 9001, 10107, 11600, 11601, 11602, 13435, 13436, 50, 202}
    | {43, 133, 175, 237}
)
"""HostUnreachable, HostNotFound, WriteConcernFailed, NetworkTimeout, ShutdownInProgress,
ReadConcernMajorityNotAvailableYet (a member just started or elected: every read is at
majority), PrimarySteppedDown, ExceededTimeLimit, SocketException, NotWritablePrimary,
InterruptedAtShutdown, Interrupted, InterruptedDueToReplStateChange,
NotPrimaryNoSecondaryOk, NotPrimaryOrSecondary, MaxTimeMSExpired,
NetworkInterfaceExceededTimeLimit. (A commit retried after one of them is safe: it is
conditional, so if the first did land, the retry conflicts and the batch is re-read.)
Then a read that the server gave up, which the same read sent again answers:
CursorNotFound and CursorKilled (a ``find`` over 16 MiB of event records continues by
``getMore``, whose cursor a failover or restart forgets), QueryPlanKilled, and
FailedToSatisfyReadPreference (mongos while a shard elects its primary). Taken for
refusals, each stopped ``run`` for good."""


class MongoStore(Store):
    """State in a MongoDB database (a replica set or sharded cluster: transactions)."""

    max_records_per_commit: int | None = 2_000
    """A smaller transaction holds its write locks for less time and loses less work
    to a conflict on a shared bucket; the engine splits larger batches into units."""

    def __init__(
        self,
        client: AsyncMongoClient[Document],
        database: str = DEFAULT_DATABASE,
        retention: Retention | None = None,
        *,
        clock: Callable[[], float] = time.time,
        owns_client: bool = False,
    ) -> None:
        super().__init__(retention, clock=clock)
        self.client = client
        self.database_name = database
        # w=majority always (split_url refuses another w); the URL's wtimeoutMS and
        # journal=true are kept, not dropped without a word: a commit that no majority
        # acknowledges then ends, unknown, where it would have waited for ever
        given = client.write_concern.document
        self._write_concern = WriteConcern(
            "majority", wtimeout=given.get("wtimeout"), j=True if given.get("j") else None
        )
        # reads see only what a majority holds: a local read may see a transaction
        # that a failover then rolls back, and answer a resend with its verdict, which
        # the retried batch may then decide otherwise
        self._db: AsyncDatabase[Document] = client.get_database(
            database,
            read_preference=ReadPreference.PRIMARY,
            read_concern=ReadConcern("majority"),
            write_concern=self._write_concern,
        )
        self._owns_client = owns_client

    @classmethod
    def from_url(
        cls,
        url: str,
        retention: Retention | None = None,
        clock: Callable[[], float] = time.time,
        *,
        password: str | None = None,
    ) -> MongoStore:
        """A store for ``mongodb://HOST[:PORT][,…]/[DBNAME][?options]`` (or ``mongodb+srv``);
        ``password``, when given, the password of the user the URL names.

        The database is the URL's path (default ``limitflow``); limitflow's own query
        parameters are removed before the rest of the URL goes to the driver. No server
        is contacted here.
        """
        driver_url, database = split_url(url)
        secret: dict[str, str] = {}
        given = urlsplit(url)
        if password is not None:
            if not given.username:
                raise ConfigError(
                    f"{redacted(url)}: LIMITFLOW_STORE_PASSWORD is set, and the URL names no"
                    " user whose it is (mongodb://USER@HOST/…)"
                )
            if given.password is not None:
                raise ConfigError(
                    f"{redacted(url)}: a password in the URL and in LIMITFLOW_STORE_PASSWORD:"
                    " give one"
                )
            secret["password"] = password
        try:
            # PyMongo only warns about an unknown or invalid URI option, then ignores
            # it: a misspelt ``w=majorty`` must not silently weaken durability.
            with warnings.catch_warnings():
                warnings.simplefilter("error", UserWarning)
                client: AsyncMongoClient[Document] = AsyncMongoClient(
                    driver_url,
                    tz_aware=True,
                    tzinfo=UTC,
                    appname="limitflow",
                    connect=False,
                    **secret,  # type: ignore[arg-type]
                )
        except (ConfigurationError, UserWarning) as exc:
            # PyMongo ends an unknown option's message pointing at its docstring: not ours
            said = str(exc).removesuffix(" Refer to docstring.")
            if password is None and given.username and "password is required" in said:
                said += f" for user {given.username!r}: set LIMITFLOW_STORE_PASSWORD"
            raise ConfigError(f"{redacted(url)}: {said}") from exc
        except PyMongoError as exc:
            raise _translate(exc) from exc
        return cls(client, database, retention, clock=clock, owns_client=True)

    def _collection(self, name: str) -> AsyncCollection[Document]:
        return self._db[name]

    # -- reads -------------------------------------------------------------------------

    async def _read(self, keys: Keys) -> Snapshot:
        snapshot = Snapshot()
        try:
            for doc in await self._find(BUCKETS, keys.buckets):
                snapshot.buckets[doc["_id"]] = _bucket(doc)
            for doc in await self._find(ACCOUNTS, keys.accounts):
                snapshot.accounts[doc["_id"]] = Account(
                    seq=_counted(doc["seq"], "seq"), version=_counted(doc["version"], "version")
                )
            for doc in await self._find(EVENTS, keys.events):
                snapshot.events[doc["_id"]] = _event(doc)
        except PyMongoError as exc:
            raise _translate(exc) from exc
        except (KeyError, TypeError, ValueError) as exc:
            raise StoreRejected(f"MongoDB: malformed limitflow document: {exc!r}") from exc
        return snapshot

    async def _find(self, name: str, ids: Iterable[str]) -> list[Document]:
        """Documents with ``_id`` in ``ids``: one request per chunk (and a ``getMore`` for
        the rest of one whose documents exceed a reply's 16 MiB, on a real server)."""
        found: list[Document] = []
        collection = self._collection(name)
        for chunk in _chunks(sorted(ids)):
            self.round_trips += 1
            cursor = collection.find({"_id": {"$in": chunk}}, batch_size=len(chunk))
            found.extend(await cursor.to_list())
        return found

    async def _read_meanings(self, keys: list[str]) -> dict[str, str]:
        try:
            found = await self._find(RULES, keys)
        except PyMongoError as exc:
            raise _translate(exc) from exc
        kept: dict[str, str] = {}
        for doc in found:
            meaning = doc.get("meaning")
            if not isinstance(meaning, str):
                raise DamagedRecord(f"{RULES} document {doc['_id']!r} holds no text meaning")
            kept[doc["_id"]] = meaning
        return kept

    async def _add_meanings(self, meanings: dict[str, str]) -> None:
        docs = [{"_id": key, "meaning": m} for key, m in meanings.items()]
        try:
            async with self.client.start_session(causal_consistency=False) as session:
                await session.start_transaction(write_concern=self._write_concern)
                # a duplicate key (another member's, if it got there first, stays) aborts
                # the transaction: none of these is kept
                try:
                    self.round_trips += 1
                    await self._collection(RULES).insert_many(docs, session=session)
                    await self._commit(session)
                except PyMongoError:
                    _discard_server_session(session)
                    raise
        except PyMongoError as exc:
            raise _translate(exc) from exc

    async def _forget_meanings(self, keys: list[str]) -> int:
        self.round_trips += 1
        try:
            done = await self._collection(RULES).delete_many({"_id": {"$in": keys}})
        except PyMongoError as exc:
            raise _translate(exc) from exc
        return done.deleted_count

    async def _has_live_counters(self, prefix: str, now: int) -> bool:
        query = {
            "_id": {"$gte": prefix, "$lt": after_prefix(prefix)},  # a range of the _id index
            "$or": [{"expires_at": {"$exists": False}}, {"expires_at": {"$gt": _date(now)}}],
        }
        self.round_trips += 1
        try:
            return await self._collection(BUCKETS).find_one(query, {"_id": 1}) is not None
        except PyMongoError as exc:
            raise _translate(exc) from exc

    # -- writes ------------------------------------------------------------------------

    async def _write(self, writes: Writes, expected: Expected) -> None:
        plan = (
            (
                BUCKETS,
                [
                    _ops(key, _bucket_doc(b), b.version, _expiry(expected.buckets[key]))
                    for key, b in writes.buckets.items()
                ],
            ),
            (
                ACCOUNTS,
                [_ops(key, _account_doc(a), a.version) for key, a in writes.accounts.items()],
            ),
            (
                EVENTS,
                [
                    _ops(key, _event_doc(r), r.version, _expiry(expected.events[key]))
                    for key, r in writes.events.items()
                ],
            ),
        )
        try:
            async with self.client.start_session(causal_consistency=False) as session:
                await session.start_transaction(
                    read_concern=ReadConcern("snapshot"),
                    write_concern=self._write_concern,
                )
                # leaving the session's block aborts an uncommitted transaction
                try:
                    for name, ops in plan:
                        if ops:
                            await self._apply(name, ops, session)
                    await self._commit(session)
                except PyMongoError:
                    _discard_server_session(session)
                    raise
        except StoreError:
            raise
        except PyMongoError as exc:
            raise _translate(exc) from exc

    async def _apply(
        self,
        name: str,
        ops: Sequence[InsertOne[Document] | ReplaceOne[Document]],
        session: AsyncClientSession,
    ) -> None:
        self.round_trips += 1
        result = await self._collection(name).bulk_write(list(ops), ordered=True, session=session)
        inserts = sum(isinstance(op, InsertOne) for op in ops)
        if result.inserted_count != inserts or result.matched_count != len(ops) - inserts:
            raise ConflictError(f"a record in {name} changed since it was read")

    async def _commit(self, session: AsyncClientSession) -> None:
        """Commit; an unknown outcome is retried (commitTransaction is idempotent)."""
        for attempt in range(COMMIT_ATTEMPTS):
            self.round_trips += 1
            try:
                await session.commit_transaction()
                return
            except PyMongoError as exc:
                if (
                    exc.has_error_label("UnknownTransactionCommitResult")
                    and attempt < COMMIT_ATTEMPTS - 1
                ):
                    continue
                raise

    # -- schema ------------------------------------------------------------------------

    async def _create(self) -> None:
        try:
            existing = set(await self._db.list_collection_names())
            for name in (BUCKETS, ACCOUNTS, EVENTS, RULES):
                if name not in existing:
                    try:
                        await self._db.create_collection(name)
                    except OperationFailure as exc:
                        if exc.code != 48:  # NamespaceExists: another init won the race
                            raise
            for name in EXPIRING:
                collection = self._collection(name)
                found = (await collection.index_information()).get(TTL_INDEX)
                if found is not None and (wrong := _ttl_trouble(found)):
                    # MongoDB would refuse the index below as conflicting with it, by name
                    raise StoreRejected(
                        f"MongoDB collection {self.database_name}.{name}: {wrong}; drop it"
                        f" (db.{name}.dropIndex({TTL_INDEX!r})) and run `limitflow store"
                        " init` again"
                    )
                await collection.create_index("expires_at", name=TTL_INDEX, expireAfterSeconds=0)
        except PyMongoError as exc:
            raise _translate(exc) from exc

    async def _verify(self) -> None:
        try:
            names = set(await self._db.list_collection_names())
            missing = sorted({BUCKETS, ACCOUNTS, EVENTS} - names)
            if missing:
                raise StoreNotInitialized(
                    f"MongoDB database {self.database_name!r} has no collection "
                    f"{', '.join(missing)}"
                )
            for name in EXPIRING:
                indexes = await self._collection(name).index_information()
                ttl = indexes.get(TTL_INDEX)
                if ttl is None:
                    raise StoreNotInitialized(
                        f"MongoDB collection {self.database_name}.{name} has no TTL index "
                        "on expires_at"
                    )
                if wrong := _ttl_trouble(ttl):
                    raise StoreNotInitialized(
                        f"MongoDB collection {self.database_name}.{name}: {wrong}; drop it"
                        f" (db.{name}.dropIndex({TTL_INDEX!r})), then"
                    )
        except PyMongoError as exc:
            raise _translate(exc) from exc

    async def close(self) -> None:
        if self._owns_client:
            await self.client.close()


def _ttl_trouble(index: Mapping[str, Any]) -> str | None:
    """What keeps the index named ``TTL_INDEX`` from deleting limitflow's records as they
    expire, as ``store init`` makes it (``expires_at``, ``expireAfterSeconds: 0``); None
    if nothing does. One on another field deletes none of them, a later
    ``expireAfterSeconds`` keeps them past the retention the URL sets."""
    fields = [field for field, _ in index.get("key", ())]
    after = index.get("expireAfterSeconds")
    if fields == ["expires_at"] and after == 0 and type(after) is not bool:
        return None
    return (
        f"its index {TTL_INDEX} is on {', '.join(fields) or 'nothing'}"
        + ("" if after is None else f" with expireAfterSeconds {after}")
        + ", not on expires_at with expireAfterSeconds 0: expired records would not be"
        " deleted as they expire"
    )


def _discard_server_session(session: AsyncClientSession) -> None:
    """Never reuse the server session (lsid) of a transaction that failed.

    After a failed ``commitTransaction`` the driver may not send ``abortTransaction``,
    so the server alone decides what becomes of that transaction. mongoeco keeps it
    open: later commands on the same lsid, even plain reads, then see its uncommitted
    writes, and its later transactions reuse a stale snapshot. PyMongo discards a
    session the same way after a network error; a fresh lsid costs nothing.
    """
    with contextlib.suppress(InvalidOperation):
        session._server_session.mark_dirty()


# -- URLs ------------------------------------------------------------------------------


def split_url(url: str) -> tuple[str, str]:
    """The driver's URL (limitflow's parameters removed) and the database name."""
    parts = urlsplit(url)
    if parts.scheme not in ("mongodb", "mongodb+srv") or not parts.netloc:
        raise ConfigError(f"{redacted(url)}: expected mongodb://HOST[:PORT]/[DBNAME][?options]")
    query_head = re.split(r"[=&;]", parts.query, maxsplit=1)[0]
    if "@" not in parts.netloc and "@" in parts.path + parts.fragment + query_head:
        # a password with an unescaped / ? or #, which ends the host part there: its rest
        # was read as the database name, the options or a host, and said so, shown
        raise ConfigError(
            f"{redacted(url)}: a user name or password with / ? # @ or : in it must be"
            " percent-encoded (%2F %3F %23 %40 %3A)"
        )
    named = unquote(parts.path.lstrip("/"))
    database = named or DEFAULT_DATABASE
    if "/" in database or any(c in database for c in ' ."$\\\0'):
        raise ConfigError(f"{redacted(url)}: {database!r} is not a MongoDB database name")
    if len(database.encode()) > 63:  # MongoDB's own limit, which store init met only
        raise ConfigError(
            f"{redacted(url)}: {database!r}: a MongoDB database name has at most 63 bytes"
        )
    for option in re.split(r"[&;]", parts.query):
        name, _, value = option.partition("=")
        if unquote(name).lower() == "w" and unquote(value) != "majority":
            # every read and write goes through a handle with w=majority, which a
            # transaction's commit needs: any other w in the URL would be overridden
            # without a word, a misspelt w=majorty included
            raise ConfigError(
                f"{redacted(url)}: w={unquote(value)}: limitflow always writes with"
                " w=majority (its transactions need it); remove the option"
            )
        if unquote(name).lower() == "journal" and unquote(value).lower() != "true":
            # j=false would let a commit be acknowledged before a majority journaled it
            raise ConfigError(
                f"{redacted(url)}: journal={unquote(value)}: limitflow's commits wait for"
                " the journal; remove the option"
            )
        if unquote(name).lower() == "readconcernlevel" and unquote(value) != "majority":
            # likewise overridden: reads see only what a failover cannot roll back
            raise ConfigError(
                f"{redacted(url)}: readConcernLevel={unquote(value)}: limitflow always"
                " reads with readConcernLevel=majority (what a failover cannot roll"
                " back); remove the option"
            )
    # the options as written, limitflow's taken out: encoding them again would turn
    # readPreferenceTags=dc:ny into dc%3Any, which the driver refuses
    query = "&".join(
        option
        for option in re.split(r"[&;]", parts.query)
        if option and unquote(option.partition("=")[0]) not in RETENTION_PARAMS
    )
    # the driver logs in to the URL's database (unless authSource says another): none
    # given, it logs in to admin, as every MongoDB client does, not to the default.
    # Encoded again, or the driver read a name's ? as the options, and its + as a space
    driver_url = urlunsplit((parts.scheme, parts.netloc, f"/{quote(named, safe='')}", query, ""))
    return driver_url, database


# -- documents <-> records --------------------------------------------------------------


def _ops(
    key: str, doc: Document, version: int, expiry: Document | None = None
) -> InsertOne[Document] | ReplaceOne[Document]:
    """The write of ``doc`` as ``version``, conditioned on the stored record as read:
    none for version 1, else ``version - 1`` and ``expiry`` (a filter on expires_at)."""
    if version < 1:
        raise StoreRejected(f"{key_hint(key)}: version {version} cannot be written")
    doc["_id"] = key
    doc["version"] = version
    if version == 1:
        return InsertOne(doc)
    return ReplaceOne({"_id": key, "version": version - 1, **(expiry or {})}, doc)


def _expiry(expires_at: int | None) -> Document:
    """The filter matching a stored ``expires_at`` equal to the one read.

    A record without expiry has no field at all; ``None`` would also match a null.
    """
    if expires_at is None:
        return {"expires_at": {"$exists": False}}
    # the second read: a date stored with milliseconds (set by hand, or by another
    # program) reads as its whole second, and must still match, or no write ever would
    return {"expires_at": {"$gte": _date(expires_at), "$lt": _date(expires_at + 1)}}


def _int64(value: int, what: str) -> int:
    if not INT64_MIN <= value <= INT64_MAX:
        raise StoreRejected(f"{what} {value} does not fit MongoDB's 64-bit integers")
    return value


def _date(epoch_seconds: int) -> datetime:
    return datetime.fromtimestamp(epoch_seconds, UTC)


def _epoch(value: datetime) -> int:
    if value.tzinfo is None:  # a client built without tz_aware=True: BSON dates are UTC
        value = value.replace(tzinfo=UTC)
    return int(value.timestamp())


def _bucket_doc(bucket: Bucket) -> Document:
    doc: Document = {
        "count": _int64(bucket.count, "bucket count"),
        "amount": _int64(bucket.amount, "bucket amount"),
        "born": bucket.born,
    }
    if bucket.period_end is not None:
        doc["period_end"] = bucket.period_end
    if bucket.expires_at is not None:
        doc["expires_at"] = _date(bucket.expires_at)
    return doc


def _bucket(doc: Mapping[str, Any]) -> Bucket:
    period_end = doc.get("period_end")
    expires_at = _stored_expiry(doc)
    return Bucket(
        count=_counted(doc["count"], "count"),
        amount=_counted(doc["amount"], "amount"),
        version=_counted(doc["version"], "version"),
        period_end=None if period_end is None else _counted(period_end, "period_end", -(2**63)),
        expires_at=None if expires_at is None else _epoch(expires_at),
        born=_counted(doc.get("born", 0), "born"),
    )


def _stored_expiry(doc: Mapping[str, Any]) -> datetime | None:
    """A record's ``expires_at``: None when it has none. A null (a document edited by
    hand) read as none too, but a write is conditioned on the field being absent
    (``_expiry``), so every commit touching the record conflicted, and was retried
    for ever."""
    if "expires_at" in doc and doc["expires_at"] is None:
        raise DamagedRecord("a stored expires_at of type NoneType")
    expires_at: datetime | None = doc.get("expires_at")
    return expires_at


def _counted(value: object, name: str, least: int = 0) -> int:
    """A record's number as stored: ``int()`` took a double of 1.5 (a document edited by
    hand) for 1, and a negative count would let more payments through. (A period may
    end, an event happen, before 1970: ``least``.)"""
    # (an int64 reads as bson's Int64, an int)
    if not isinstance(value, int) or isinstance(value, bool) or value < least:
        raise DamagedRecord(f"a stored {name} of type {type(value).__name__}, or below {least}")
    return int(value)


def _flag(value: object) -> bool:
    """A stored bool (``bool()`` took "no" for True)."""
    if type(value) is not bool:
        raise DamagedRecord(f"a stored flag of type {type(value).__name__}")
    return value


def _account_doc(account: Account) -> Document:
    return {"seq": _int64(account.seq, "account sequence")}


def _event_doc(record: EventRecord) -> Document:
    doc: Document = {
        "fingerprint": record.fingerprint,
        "account_id": record.account_id,
        "type": record.type.value,
        "accepted": record.accepted,
        "seq": _int64(record.seq, "event sequence"),
        "verdict": Binary(pack_verdict(record.verdict)),
        "amount": _int64(record.amount, "event amount"),
        "currency": record.currency,
        "reversed": _int64(record.reversed, "reversed amount"),
        "buckets": list(record.buckets),
        "occurred": _int64(record.occurred, "event time"),
        "born": list(record.born or ()),
    }
    if record.expires_at is not None:
        doc["expires_at"] = _date(record.expires_at)
    return doc


def _event(doc: Mapping[str, Any]) -> EventRecord:
    expires_at = _stored_expiry(doc)
    return EventRecord(
        fingerprint=doc["fingerprint"],
        account_id=doc["account_id"],
        type=EventType(doc["type"]),
        accepted=_flag(doc["accepted"]),
        seq=_counted(doc["seq"], "seq"),
        verdict=unpack_verdict(doc["verdict"]),
        amount=_counted(doc["amount"], "amount"),
        currency=doc.get("currency"),
        reversed=_counted(doc["reversed"], "reversed"),
        buckets=tuple(doc["buckets"]),
        occurred=_counted(doc["occurred"], "occurred", -(2**63)),
        version=_counted(doc["version"], "version"),
        expires_at=None if expires_at is None else _epoch(expires_at),
        born=tuple(int(b) for b in doc.get("born", ())),
    )


def _chunks(ids: Sequence[str]) -> Iterator[list[str]]:
    for start in range(0, len(ids), READ_CHUNK):
        yield list(ids[start : start + READ_CHUNK])


# -- errors ----------------------------------------------------------------------------


def _first_reason(exc: PyMongoError) -> str:
    """A driver error's own reason, without the topology description and timeouts that
    server selection appends (~700 characters for one unreachable server)."""
    text = str(exc)
    for tail in (" (configured timeouts", ", Timeout: "):
        text = text.split(tail, 1)[0]
    return text


def _translate(exc: PyMongoError) -> StoreError:
    """The limitflow error for a driver error; the caller raises it ``from exc``."""
    if isinstance(exc, ConnectionFailure | ExecutionTimeout | WTimeoutError):
        # ServerSelectionTimeoutError, AutoReconnect, NetworkTimeout, NotPrimaryError
        return StoreUnavailable(f"MongoDB unavailable: {_first_reason(exc)}")
    if isinstance(exc, DuplicateKeyError):
        return ConflictError("a record was created since it was read")
    if isinstance(exc, BulkWriteError):
        errors = exc.details.get("writeErrors", [])
        codes = {error.get("code") for error in errors}
        if codes and codes <= {_DUPLICATE_KEY}:
            return ConflictError("a record was created since it was read")
        if codes & _CONFLICT_CODES or exc.has_error_label("TransientTransactionError"):
            return ConflictError(f"MongoDB write conflict: {_bulk_reason(exc)}")
        if (
            exc.details.get("writeConcernErrors")
            or codes & _UNAVAILABLE_CODES
            or exc.has_error_label("RetryableWriteError")
        ):
            return StoreUnavailable(f"MongoDB unavailable: {_bulk_reason(exc)}")
        return StoreRejected(f"MongoDB refused the write: {_bulk_reason(exc)}")
    if exc.has_error_label("TransientTransactionError"):
        return ConflictError(f"MongoDB transaction aborted, retry: {exc}")
    if exc.has_error_label("RetryableWriteError"):  # the server's own word
        return StoreUnavailable(f"MongoDB unavailable: {exc}")
    if isinstance(exc, OperationFailure):
        if exc.code in _CONFLICT_CODES or (exc.code is None and _is_conflict_text(exc)):
            return ConflictError(f"MongoDB write conflict: {exc}")
        if exc.code in _NOT_INITIALIZED_CODES:
            return StoreNotInitialized(f"MongoDB: {exc}")
        if exc.code in _UNAVAILABLE_CODES or exc.has_error_label("UnknownTransactionCommitResult"):
            return StoreUnavailable(f"MongoDB unavailable: {exc}")
        if _is_login_refused(exc):
            return StoreRejected(
                f"MongoDB refused the login: {(exc.details or {}).get('errmsg') or exc} (check the"
                " user the URL names, and its password: LIMITFLOW_STORE_PASSWORD, or the URL)"
            )
        if exc.code == _ILLEGAL_OPERATION:  # what a standalone mongod says to a transaction
            return StoreRejected(
                f"MongoDB refused the request: {exc} (limitflow commits in transactions, which"
                " need a replica set or mongos; one server can run as a one-member replica"
                " set: mongod --replSet rs0, then rs.initiate())"
            )
        return StoreRejected(f"MongoDB refused the request: {exc}")
    if exc.has_error_label("UnknownTransactionCommitResult"):
        return StoreUnavailable(f"MongoDB commit outcome unknown: {exc}")
    return StoreRejected(f"MongoDB: {exc}")


def _is_login_refused(exc: OperationFailure) -> bool:
    """Whether the server refused the driver's login: AuthenticationFailed (18), or
    a server that gives no code (mongoeco) saying so."""
    if exc.code == _AUTHENTICATION_FAILED:
        return True
    said = (exc.details or {}).get("errmsg")
    return exc.code is None and isinstance(said, str) and said.startswith("Authentication failed")


def _bulk_reason(exc: BulkWriteError) -> str:
    """A bulk write's failure by its errors' codes and names, not its text: that quotes
    each document that failed (``op``), and a duplicate key's message the key, whose
    scope values may hold a card number (which PCI DSS keeps out of logs)."""
    details = exc.details
    said = [
        f"{where}error {error.get('code')} {error.get('codeName', '')}".rstrip()
        for where, errors in (("", "writeErrors"), ("write concern ", "writeConcernErrors"))
        for error in details.get(errors, [])[:3]
    ]
    return ", ".join(said) or "no error named"


def _is_conflict_text(exc: OperationFailure) -> bool:
    # Servers that speak the wire protocol without error codes (mongoeco) report a
    # commit-time conflict only as text; real MongoDB sends code 112 and a label.
    return "write conflict" in str(exc).lower()
