"""DynamoDB state store: one table, versioned all-or-nothing commits in ``TransactWriteItems``.

Every record is one item of the table ``{PREFIX}-state`` keyed by ``pk``: ``b#<bucket key>``,
``a#<account id>`` or ``e#<event id>`` (and ``r#<rule id>:<window>``: what a rule's counters hold,
see ``Store.keep_rules``), so one ``BatchGetItem`` reads buckets and accounts together, and
event records after them (see docs/dynamodb.md for why one table rather than three). Each
item holds its ``version``; a commit puts every record with ``version = v`` under the
condition that the stored version is ``v - 1`` and, for buckets and event records, the
stored ``expires_at`` the one read (``attribute_not_exists(pk)`` for ``v = 1``), all in one
transaction of at most 100 items, so a batch is all-or-nothing and a stale (zombie) writer
can never overwrite newer state, not even an item that TTL deleted and a writer created
again (its versions restart at 1).
Reads are strongly consistent, or the version checks would be meaningless.

Numbers are stored as DynamoDB ``N`` from Python ints (exact, minor units), verdicts as
``B``, compressed (``stores.verdict_codec``: a record then takes one write unit, not two);
``expires_at`` (epoch s) is the table's TTL attribute. DynamoDB deletes expired
items late (up to days), so ``Store.load`` still treats them as absent itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import re
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any
from urllib.parse import parse_qs, urlsplit

import aioboto3  # type: ignore[import-untyped]
from botocore.config import Config  # type: ignore[import-untyped]
from botocore.exceptions import (  # type: ignore[import-untyped]
    BotoCoreError,
    ClientError,
    CredentialRetrievalError,
    HTTPClientError,
    NoCredentialsError,
    NoRegionError,
    PartialCredentialsError,
)
from botocore.exceptions import ConnectionError as EndpointError
from botocore.utils import (  # type: ignore[import-untyped]
    is_valid_endpoint_url,
    is_valid_ipv6_endpoint_url,
)

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
    MAX_TRANSACT_ITEMS,
    RETENTION_PARAMS,
    DamagedRecord,
    Expected,
    Retention,
    Store,
    key_hint,
    redacted,
)
from stores.verdict_codec import pack_verdict, unpack_verdict

log = logging.getLogger("limitflow.stores.dynamo")

Item = dict[str, dict[str, Any]]
"""An item in DynamoDB's wire format: ``{"name": {"S": "…"}}``."""

MAX_BATCH_GET_KEYS = 100
"""DynamoDB's limit of keys in one ``BatchGetItem``."""
_UNPROCESSED_RETRIES = 8
_PREFIX = re.compile(r"[A-Za-z0-9_.-]{1,200}")
_URL_PARAMS = {"endpoint_url", "region"}

_THROTTLED = {
    "ProvisionedThroughputExceededException",
    "ThrottlingException",
    "RequestLimitExceeded",
    "LimitExceededException",
    "InternalServerError",
    "ServiceUnavailable",
    "TransactionInProgressException",
}
_CANCEL_CONFLICT = {"ConditionalCheckFailed", "TransactionConflict"}
_CANCEL_THROTTLED = {"ThrottlingError", "ProvisionedThroughputExceeded", "RequestLimitExceeded"}

_TTL_ATTRIBUTE = "expires_at"
_TTL_ON = ("ENABLED", "ENABLING")

BUCKET, ACCOUNT, EVENT = "b#", "a#", "e#"
RULE = "r#"
"""What a rule's counters hold (``Store.keep_rules``): ``r#<rule id>:<window>`` with
``meaning``, put once, never expiring, deleted by ``store forget-rule``; only
``_read_meanings`` reads these items."""


def _n(value: int) -> dict[str, str]:
    return {"N": str(value)}


def _bucket_item(key: str, bucket: Bucket) -> Item:
    item: Item = {
        "pk": {"S": BUCKET + key},
        "version": _n(bucket.version),
        "count": _n(bucket.count),
        "amount": _n(bucket.amount),
        "born": _n(bucket.born),
    }
    if bucket.period_end is not None:
        item["period_end"] = _n(bucket.period_end)
    if bucket.expires_at is not None:
        item["expires_at"] = _n(bucket.expires_at)
    return item


def _account_item(key: str, account: Account) -> Item:
    return {"pk": {"S": ACCOUNT + key}, "version": _n(account.version), "seq": _n(account.seq)}


def _event_item(key: str, record: EventRecord) -> Item:
    item: Item = {
        "pk": {"S": EVENT + key},
        "version": _n(record.version),
        "fingerprint": {"S": record.fingerprint},
        "account_id": {"S": record.account_id},
        "type": {"S": record.type.value},
        "accepted": {"BOOL": record.accepted},
        "seq": _n(record.seq),
        "verdict": {"B": pack_verdict(record.verdict)},
        "amount": _n(record.amount),
        "reversed": _n(record.reversed),
        "buckets": {"L": [{"S": b} for b in record.buckets]},
        "occurred": _n(record.occurred),
        "born": {"L": [_n(b) for b in record.born or ()]},
    }
    if record.currency is not None:
        item["currency"] = {"S": record.currency}
    if record.expires_at is not None:
        item["expires_at"] = _n(record.expires_at)
    return item


def _opt_int(item: Mapping[str, Mapping[str, Any]], name: str) -> int | None:
    value = item.get(name)
    return None if value is None else int(value["N"])


def _add_item(snapshot: Snapshot, item: Mapping[str, Mapping[str, Any]]) -> None:
    """Put a stored item into ``snapshot`` as a fresh record."""
    pk: str = item["pk"]["S"]
    kind, key = pk[:2], pk[2:]
    version = int(item["version"]["N"])
    if kind == BUCKET:
        count, amount = int(item["count"]["N"]), int(item["amount"]["N"])
        if count < 0 or amount < 0:  # an item edited by hand: more room than the limit
            raise DamagedRecord(f"{key_hint(pk)}: a negative count or amount")
        snapshot.buckets[key] = Bucket(
            count=count,
            amount=amount,
            version=version,
            period_end=_opt_int(item, "period_end"),
            expires_at=_opt_int(item, "expires_at"),
            born=_opt_int(item, "born") or 0,
        )
    elif kind == ACCOUNT:
        snapshot.accounts[key] = Account(seq=int(item["seq"]["N"]), version=version)
    elif kind == EVENT:
        currency = item.get("currency")
        snapshot.events[key] = EventRecord(
            fingerprint=item["fingerprint"]["S"],
            account_id=item["account_id"]["S"],
            type=EventType(item["type"]["S"]),
            accepted=bool(item["accepted"]["BOOL"]),
            seq=int(item["seq"]["N"]),
            verdict=unpack_verdict(item["verdict"]["B"]),
            amount=int(item["amount"]["N"]),
            currency=None if currency is None else currency["S"],
            reversed=int(item["reversed"]["N"]),
            buckets=tuple(b["S"] for b in item["buckets"]["L"]),
            occurred=int(item["occurred"]["N"]),
            version=version,
            expires_at=_opt_int(item, "expires_at"),
            born=tuple(int(b["N"]) for b in item.get("born", {}).get("L", ())),
        )
    else:
        raise StoreRejected(f"unexpected item ({key_hint(pk)}) in the limitflow table")


def _puts(writes: Writes, expected: Expected) -> Iterator[tuple[Item, bool, int | None]]:
    """Each item to put, whether its stored expiry is checked, and the expiry read."""
    for key, bucket in writes.buckets.items():
        yield _bucket_item(key, bucket), True, expected.buckets[key]
    for key, account in writes.accounts.items():
        yield _account_item(key, account), False, None
    for key, record in writes.events.items():
        yield _event_item(key, record), True, expected.events[key]


def _put(table: str, item: Item, check_expiry: bool, expires_at: int | None) -> dict[str, Any]:
    """The ``Put`` action of ``item``, conditioned on the stored item being the one read."""
    put: dict[str, Any] = {
        "TableName": table,
        "Item": item,
        "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
    }
    version = int(item["version"]["N"])
    if version == 1:
        put["ConditionExpression"] = "attribute_not_exists(pk)"
        return put
    condition = "#v = :v"
    names = {"#v": "version"}
    values = {":v": _n(version - 1)}
    if check_expiry:
        names["#e"] = "expires_at"
        if expires_at is None:
            condition += " AND attribute_not_exists(#e)"
        else:
            condition += " AND #e = :e"
            values[":e"] = _n(expires_at)
    put["ConditionExpression"] = condition
    put["ExpressionAttributeNames"] = names
    put["ExpressionAttributeValues"] = values
    return put


def _unusable_endpoint(endpoint: str) -> str | None:
    """Why botocore cannot use ``endpoint``, or None. botocore itself tells it only when
    the client is made, at first use, with a bare ``ValueError`` (or never: an ``ftp://``
    one fails each request as an outage)."""
    parts = urlsplit(endpoint)
    try:
        parts.port  # noqa: B018 - parsed here: "Port out of range 0-65535"
    except ValueError as exc:
        return f"{endpoint!r}: {exc}"
    if parts.scheme not in ("http", "https"):
        return f"{endpoint!r}: use http://HOST:PORT or https://HOST"
    if not (is_valid_endpoint_url(endpoint) or is_valid_ipv6_endpoint_url(endpoint)):
        return f"{endpoint!r}: not a host name or address botocore takes"
    return None


def _error_code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def translate(exc: Exception, what: str) -> StoreError:
    """The limitflow error for a botocore error raised while doing ``what``."""
    if isinstance(exc, ClientError):
        code = _error_code(exc)
        message = exc.response.get("Error", {}).get("Message", "")
        text = f"DynamoDB {what}: {code}: {message}"
        if code == "ResourceNotFoundException":
            return StoreNotInitialized(f"{text}: the table is missing")
        if code in ("ConditionalCheckFailedException", "TransactionConflictException"):
            return ConflictError(text)
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
        if code in _THROTTLED or (isinstance(status, int) and status >= 500):
            return StoreUnavailable(text)
        return StoreRejected(text)
    if isinstance(exc, NoCredentialsError | PartialCredentialsError):
        return StoreRejected(f"DynamoDB {what}: no usable AWS credentials: {exc}")
    if isinstance(exc, CredentialRetrievalError):
        # the container's or instance's credential endpoint did not answer (temporary
        # credentials are fetched again every hour or so): an outage, not a refusal,
        # which had ended `run` on the first blip
        return StoreUnavailable(f"DynamoDB {what}: AWS credentials could not be fetched: {exc}")
    if isinstance(exc, EndpointError | HTTPClientError | TimeoutError | OSError):
        return StoreUnavailable(f"DynamoDB {what}: {exc}")
    if isinstance(exc, BotoCoreError):
        # parameter validation and the like: the request itself is wrong
        return StoreRejected(f"DynamoDB {what}: {exc}")
    return StoreUnavailable(f"DynamoDB {what}: {exc!r}")


_DRIVER_ERRORS = (BotoCoreError, ClientError, TimeoutError, OSError)


def _cancellation(exc: ClientError) -> StoreError:
    """The error for a cancelled transaction, from its per-item ``CancellationReasons``."""
    reasons: list[dict[str, Any]] = exc.response.get("CancellationReasons", [])
    codes = {reason.get("Code", "None") for reason in reasons}
    for reason in reasons:
        if reason.get("Code") == "ConditionalCheckFailed":
            old = reason.get("Item") or {}
            pk = old.get("pk", {}).get("S", "?")
            stored = old.get("version", {}).get("N", "absent")
            expiry = old.get("expires_at", {}).get("N", "none")
            log.info(
                "conflict on %s: stored version %s (expires_at %s) is not the one read",
                key_hint(pk),
                stored,
                expiry,
            )
            break
    if codes & _CANCEL_CONFLICT:
        return ConflictError(f"a record changed since it was read ({', '.join(sorted(codes))})")
    if codes & _CANCEL_THROTTLED:
        return StoreUnavailable(f"DynamoDB throttled the commit ({', '.join(sorted(codes))})")
    return StoreRejected(f"DynamoDB cancelled the commit: {reasons}")


class DynamoStore(Store):
    """State in the DynamoDB table ``{prefix}-state``, through one reused aioboto3 client."""

    max_records_per_commit = MAX_TRANSACT_ITEMS

    def __init__(
        self,
        prefix: str = "limitflow",
        retention: Retention | None = None,
        *,
        endpoint_url: str | None = None,
        region: str | None = None,
        session: Any = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(retention, **kwargs)
        if not _PREFIX.fullmatch(prefix):
            raise ConfigError(
                f"DynamoDB table prefix {prefix!r}: use 1 to 200 letters, digits, _ . -"
            )
        self.table = f"{prefix}-state"
        self.endpoint_url = endpoint_url
        self.region = region
        try:
            self._session: Any = session if session is not None else aioboto3.Session()
        except BotoCoreError as exc:  # AWS_PROFILE naming none, a config file unreadable
            raise ConfigError(f"DynamoDB: {exc}") from None
        self._client: Any = None
        self._exit = contextlib.AsyncExitStack()
        self._opening = asyncio.Lock()

    @classmethod
    def from_url(
        cls,
        url: str,
        retention: Retention | None = None,
        clock: Callable[[], float] = time.time,
    ) -> DynamoStore:
        """``dynamodb://PREFIX?endpoint_url=…&region=…``; credentials from the AWS chain."""
        parts = urlsplit(url)
        if "@" in url.partition("?")[0]:  # not echoed: the prefix would show them
            raise ConfigError(
                f"{redacted(url)}: a DynamoDB store URL holds no credentials: they come from"
                " AWS's own chain (AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, a profile,"
                " a role)"
            )
        if parts.path.strip("/") or parts.fragment:  # the default table was used instead
            raise ConfigError(
                f"{redacted(url)}: the table prefix is the host part of the URL"
                " (dynamodb://PREFIX?…); it takes no path or #fragment"
            )
        # read as ``stores.embedded`` reads the retention, ";" separating too: else an
        # endpoint_url or region after one was a part of the parameter before it
        query = parse_qs(parts.query.replace(";", "&"), keep_blank_values=True)
        unknown = set(query) - _URL_PARAMS - RETENTION_PARAMS
        if unknown:
            known = sorted(_URL_PARAMS | RETENTION_PARAMS)
            raise ConfigError(
                f"{redacted(url)}: unknown parameters {', '.join(sorted(unknown))}"
                f" (known: {', '.join(known)})"
            )
        for name, values in query.items():
            if len(values) > 1:  # the first one was taken, and an appended override ignored
                raise ConfigError(
                    f"{redacted(url)}: {name} given {len(values)} times; give it once"
                )
            if name in _URL_PARAMS and not values[0]:  # AWS itself, or the chain's region
                raise ConfigError(f"{redacted(url)}: {name} is blank; give it a value")
        endpoint = query.get("endpoint_url", [None])[0]
        region = query.get("region", [None])[0]
        if endpoint is not None and (why := _unusable_endpoint(endpoint)):
            raise ConfigError(f"{redacted(url)}: endpoint_url {why}")
        return cls(
            parts.netloc or "limitflow",
            retention,
            endpoint_url=endpoint,
            region=region,
            clock=clock,
        )

    async def _dynamodb(self) -> Any:
        """The client, created on first use and reused until ``close``."""
        if self._client is not None:
            return self._client
        async with self._opening:
            if self._client is None:
                config = Config(
                    retries={"mode": "standard", "max_attempts": 4},
                    connect_timeout=5,
                    read_timeout=10,
                    max_pool_connections=64,
                )
                try:
                    self._client = await self._exit.enter_async_context(
                        self._session.client(
                            "dynamodb",
                            endpoint_url=self.endpoint_url,
                            region_name=self.region,
                            config=config,
                        )
                    )
                except NoRegionError as exc:
                    raise ConfigError(
                        "DynamoDB: no AWS region; add ?region=… to the store URL or set AWS_REGION"
                    ) from exc
                except _DRIVER_ERRORS as exc:
                    raise translate(exc, "connect") from exc
        return self._client

    async def close(self) -> None:
        self._client = None
        await self._exit.aclose()

    # -- schema -------------------------------------------------------------------------

    async def _create(self) -> None:
        client = await self._dynamodb()
        try:
            await client.create_table(
                TableName=self.table,
                AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
                KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
                BillingMode="PAY_PER_REQUEST",
            )
        except ClientError as exc:
            if _error_code(exc) != "ResourceInUseException":  # exists already: fine
                raise translate(exc, "CreateTable") from exc
        except _DRIVER_ERRORS as exc:
            raise translate(exc, "CreateTable") from exc
        try:
            waiter = client.get_waiter("table_exists")
            await waiter.wait(TableName=self.table, WaiterConfig={"Delay": 1, "MaxAttempts": 120})
            status, attribute = await self._ttl(client)
            if status in _TTL_ON and attribute != _TTL_ATTRIBUTE:
                # a table has one TTL attribute: limitflow's records would never be deleted
                raise StoreRejected(
                    f"DynamoDB table {self.table} has TTL on {attribute!r}, not"
                    f" {_TTL_ATTRIBUTE}: none of limitflow's records would be deleted; turn"
                    " it off (UpdateTimeToLive) and run `limitflow store init` again"
                )
            if status not in _TTL_ON:
                try:
                    await client.update_time_to_live(
                        TableName=self.table,
                        TimeToLiveSpecification={"Enabled": True, "AttributeName": _TTL_ATTRIBUTE},
                    )
                except ClientError:
                    # another `store init` enabled it meanwhile (a ValidationException):
                    # what counts is that it is on now
                    status, attribute = await self._ttl(client)
                    if status not in _TTL_ON or attribute != _TTL_ATTRIBUTE:
                        raise
        except _DRIVER_ERRORS as exc:
            raise translate(exc, "enabling TTL") from exc

    async def _ttl(self, client: Any) -> tuple[str | None, str | None]:
        """The table's TTL status and attribute."""
        ttl = (await client.describe_time_to_live(TableName=self.table))["TimeToLiveDescription"]
        return ttl.get("TimeToLiveStatus"), ttl.get("AttributeName")

    async def _verify(self) -> None:
        client = await self._dynamodb()
        try:
            table = await client.describe_table(TableName=self.table)
        except _DRIVER_ERRORS as exc:
            raise translate(exc, f"DescribeTable {self.table}") from exc
        if table["Table"].get("TableStatus") not in ("ACTIVE", "UPDATING"):
            raise StoreUnavailable(
                f"DynamoDB table {self.table} is {table['Table']['TableStatus']}"
            )
        # a `store init` stopped after CreateTable left TTL off: nothing would be deleted
        try:
            status, attribute = await self._ttl(client)
        except _DRIVER_ERRORS as exc:
            raise translate(exc, f"DescribeTimeToLive {self.table}") from exc
        if status not in _TTL_ON or attribute != _TTL_ATTRIBUTE:
            raise StoreNotInitialized(
                f"DynamoDB table {self.table} has no TTL on {_TTL_ATTRIBUTE}"
                f" ({status or 'DISABLED'}{'' if attribute is None else f' on {attribute}'})"
            )

    # -- records ------------------------------------------------------------------------

    async def _read(self, keys: Keys) -> Snapshot:
        snapshot = Snapshot()
        # the event records once the buckets and accounts are read, not in the same
        # concurrent requests (``Store._read``): a reversal's original answered before
        # another process committed it, and its account after, left the reversal
        # decided "original not found" after the payment in the account's sequence
        for pks in (
            [*(BUCKET + k for k in keys.buckets), *(ACCOUNT + k for k in keys.accounts)],
            [EVENT + k for k in keys.events],
        ):
            if pks:
                for item in await self._get_all(await self._dynamodb(), pks):
                    _add_item(snapshot, item)
        return snapshot

    async def _get_all(self, client: Any, pks: list[str]) -> list[Item]:
        """The stored items of ``pks``: ``BatchGetItem``s of at most 100 keys, at once."""
        chunks = [
            pks[start : start + MAX_BATCH_GET_KEYS]
            for start in range(0, len(pks), MAX_BATCH_GET_KEYS)
        ]
        tasks = [asyncio.ensure_future(self._batch_get(client, c)) for c in chunks]
        try:
            found = await asyncio.gather(*tasks)
        except BaseException:
            # one failed (throttled, say), so the read fails and the batch is retried
            # whole: the others are of no use. Left running, each with its own retries,
            # every retry of the batch sent a full set more at a throttled table
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise
        return [item for items in found for item in items]

    async def _batch_get(self, client: Any, pks: list[str]) -> list[Item]:
        """The stored items of ``pks`` (≤ 100), retrying ``UnprocessedKeys`` with backoff."""
        request: dict[str, Any] = {
            self.table: {"Keys": [{"pk": {"S": pk}} for pk in pks], "ConsistentRead": True}
        }
        found: list[Item] = []
        for attempt in range(_UNPROCESSED_RETRIES + 1):
            self.round_trips += 1
            try:
                response = await client.batch_get_item(RequestItems=request)
            except _DRIVER_ERRORS as exc:
                raise translate(exc, "BatchGetItem") from exc
            found.extend(response.get("Responses", {}).get(self.table, []))
            request = response.get("UnprocessedKeys") or {}
            if not request:
                return found
            if attempt < _UNPROCESSED_RETRIES:
                await asyncio.sleep(random.uniform(0, min(2.0, 0.025 * 2**attempt)))  # noqa: S311
        raise StoreUnavailable(
            f"DynamoDB left keys unprocessed after {_UNPROCESSED_RETRIES} retries (throttled)"
        )

    async def _read_meanings(self, keys: list[str]) -> dict[str, str]:
        kept: dict[str, str] = {}
        for item in await self._get_all(await self._dynamodb(), [RULE + key for key in keys]):
            meaning = item.get("meaning", {}).get("S")
            if not isinstance(meaning, str):
                raise DamagedRecord(f"item {item['pk']['S']!r} holds no text meaning")
            kept[item["pk"]["S"].removeprefix(RULE)] = meaning
        return kept

    async def _add_meanings(self, meanings: dict[str, str]) -> None:
        # one transaction per MAX_TRANSACT_ITEMS (a file of more new counting rules is
        # kept in parts): a key kept already fails its condition, and another member's
        # meaning stays
        items = list(meanings.items())
        for start in range(0, len(items), MAX_TRANSACT_ITEMS):
            puts = [
                {
                    "Put": {
                        "TableName": self.table,
                        "Item": {"pk": {"S": RULE + key}, "meaning": {"S": meaning}},
                        "ConditionExpression": "attribute_not_exists(pk)",
                    }
                }
                for key, meaning in items[start : start + MAX_TRANSACT_ITEMS]
            ]
            await self._transact(puts)

    async def _forget_meanings(self, keys: list[str]) -> int:
        client = await self._dynamodb()
        forgotten = 0
        for key in keys:
            self.round_trips += 1
            try:
                done = await client.delete_item(
                    TableName=self.table, Key={"pk": {"S": RULE + key}}, ReturnValues="ALL_OLD"
                )
            except _DRIVER_ERRORS as exc:
                raise translate(exc, "DeleteItem") from exc
            forgotten += "Attributes" in done
        return forgotten

    async def _has_live_counters(self, prefix: str, now: int) -> bool:
        """A scan of the whole table (items are spread by a hash of their key): fine for
        ``store forget-rule``, run by hand, and for nothing on the hot path."""
        client = await self._dynamodb()
        request: dict[str, Any] = {
            "TableName": self.table,
            "ConsistentRead": True,
            "FilterExpression": "begins_with(pk, :p)"
            " AND (attribute_not_exists(expires_at) OR expires_at > :now)",
            "ExpressionAttributeValues": {":p": {"S": BUCKET + prefix}, ":now": _n(now)},
            "ProjectionExpression": "pk",
        }
        while True:
            self.round_trips += 1
            try:
                page = await client.scan(**request)
            except _DRIVER_ERRORS as exc:
                raise translate(exc, "Scan") from exc
            if page.get("Items"):
                return True
            if "LastEvaluatedKey" not in page:
                return False
            request["ExclusiveStartKey"] = page["LastEvaluatedKey"]

    async def _write(self, writes: Writes, expected: Expected) -> None:
        if len(writes) > MAX_TRANSACT_ITEMS:
            raise StoreRejected(
                f"{len(writes)} records in one commit; DynamoDB allows {MAX_TRANSACT_ITEMS}"
            )
        await self._transact([{"Put": _put(self.table, *put)} for put in _puts(writes, expected)])

    async def _transact(self, actions: list[dict[str, Any]]) -> None:
        """One ``TransactWriteItems``, all or nothing: a cancelled one raises what its
        reasons say (``_cancellation``: a failed condition is a ``ConflictError``)."""
        client = await self._dynamodb()
        self.round_trips += 1
        try:
            await client.transact_write_items(TransactItems=actions)
        except ClientError as exc:
            if _error_code(exc) == "TransactionCanceledException":
                raise _cancellation(exc) from exc
            raise translate(exc, "TransactWriteItems") from exc
        except _DRIVER_ERRORS as exc:
            raise translate(exc, "TransactWriteItems") from exc
