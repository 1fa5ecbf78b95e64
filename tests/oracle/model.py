"""The reference model: decides event lines one by one as the contract says.

Plain dicts and ``Decimal``; amounts are held as integers in the currency's minor units
(the contract's fraction-digit rule makes them exact). ``Model(rules).process(line)``
gives one outcome per input line, in input order, as ``limitflow replay`` writes them.
Zones are read from the ``tzdata`` package alone (limitflow's choice, stated in its
README), loaded here by file so that nothing process-wide (``zoneinfo``'s search path)
changes for the other tests.

Retention (README, *State stores*) is modelled when asked for, ``Model(rules,
retention=(bucket_seconds, event_seconds))``: the caller then frames each batch a store
commits at once, ``at(now)`` before its first line and ``commit()`` after its last, on
the store's clock. Buckets expire ``bucket_seconds`` after the later of their period's
end (its local end read as UTC, + 24 h) and the writer's clock; idempotency records
``event_seconds`` after the later of their event time and the writer's clock, but never
before ``bucket_seconds`` past a bucket the same commit wrote that they counted in (or
released from); a record stored never to expire stays so, and one stored never expires
earlier than it was stored to. Each life of a bucket is
stamped with the clock that began it; a reversal releases its payment only from the life
it was added to.
"""

from __future__ import annotations

import calendar
import functools
import json
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal
from importlib import resources
from typing import Any, Final
from zoneinfo import ZoneInfo

MINOR: Final = {"CNY": 2, "USD": 2, "EUR": 2, "GBP": 2, "JPY": 0, "KWD": 3}
"""ISO 4217 minor units of the currencies the contract names (the generator uses no other)."""

REVERSAL_DIGITS: Final = 4  # a reversal's amount without a currency: the most any has (README)
TEXT_DIGITS: Final = 4_300  # README: a number is written out up to 4,300 digits
MAX_KEY_BYTES: Final = 1_024  # README: a bucket key (rule id, period, scope values), UTF-8
KNOWN_FIELDS: Final = frozenset(
    ("event_id", "type", "account_id", "amount", "currency", "occurred_at", "original_event_id")
)
RFC3339: Final = re.compile(  # a space for the T, as RFC 3339 (5.6) and the event schema allow
    r"([0-9]{4})-([0-9]{2})-([0-9]{2})[Tt ]([0-9]{2}):([0-9]{2}):([0-9]{2})(\.[0-9]+)?"
    r"([Zz]|[+-][0-9]{2}:[0-9]{2})"
)
DECIMAL_TEXT: Final = re.compile(r"[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+)?")
EARLIEST: Final = datetime(1, 1, 2, tzinfo=UTC)  # the README's range of instants
LATEST: Final = datetime(9999, 12, 31, tzinfo=UTC)
LATEST_EXPIRY: Final = 253_402_214_400  # 9999-12-31T00:00:00Z: no record expires later
EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
END_SLACK: Final = 86_400  # README: a period's local end read as UTC, + 24 h
DAY: Final = 86_400

NOT_ITS_CURRENCY: Final = "reversal: currency not its original's"
FINER_THAN_ITS_ORIGINAL: Final = "reversal: amount finer than its original's currency"

EXPIRIES: Final = frozenset((
    "bucket expired",
    "record kept for its bucket",  # expiring later than its own retention
    "reversal found its bucket expired",
    "reversal found its bucket in a new life",
    "an event decided again, its record expired",
    "a reversal of an expired record",
))  # fmt: skip
"""What retention may do in a case (``Model.reached``), for choosing seeds that do it all."""

Canon = tuple[str, str]
BucketKey = tuple[str, tuple[Canon, ...], str]


class Invalid(Exception):
    """The line is JSON but not a valid event: an ``invalid_event``."""


@functools.cache
def zone(name: str) -> ZoneInfo:
    """The zone ``name`` from the ``tzdata`` package, whatever the host holds."""
    path = resources.files("tzdata.zoneinfo")
    for part in name.split("/"):
        path = path.joinpath(part)
    with path.open("rb") as data:
        return ZoneInfo.from_file(data, key=name)


@dataclass(frozen=True)
class Rule:
    id: str
    window: str
    zone: str
    scope: tuple[str, ...]
    currency: str | None
    max_count: int | None
    max_units: int | None  # max_amount in the currency's minor units
    match: dict[str, frozenset[Canon]]

    @classmethod
    def from_doc(cls, doc: dict[str, Any]) -> Rule:
        scope = doc.get("scope", "account_id")
        currency = doc.get("currency")
        max_amount = doc.get("max_amount")
        return cls(
            id=doc["id"],
            window=doc["window"],
            zone=doc.get("timezone", "UTC"),
            scope=(scope,) if isinstance(scope, str) else tuple(scope),
            currency=currency,
            max_count=doc.get("max_count"),
            max_units=None if max_amount is None else units_of(Decimal(str(max_amount)), currency),
            match={
                k: frozenset(canon(by_value(v) if k == "amount" else v) for v in vs)
                for k, vs in (doc.get("match") or {}).items()
            },
        )

    def period(self, instant: datetime) -> str:
        """The calendar period of ``instant`` in this rule's zone."""
        if self.window in ("lifetime", "transaction"):
            return self.window
        local = instant.astimezone(zone(self.zone))
        if self.window == "week":
            year, week, _ = local.isocalendar()
            return f"{year:04d}-W{week:02d}"
        if self.window == "month":
            return f"{local.year:04d}-{local.month:02d}"
        if self.window == "year":
            return f"{local.year:04d}"
        # not strftime: glibc's %Y writes the year 999 as "999", the contract "0999"
        day = f"{local.year:04d}-{local.month:02d}-{local.day:02d}"
        if self.window == "day":
            return day
        if self.window == "hour":
            return f"{day}T{local.hour:02d}"
        return f"{day}T{local.hour:02d}:{local.minute:02d}"


def period_end(window: str, period: str) -> int | None:
    """When ``period`` ends for expiry, in epoch s: its local end (the next period's
    start) read as UTC, + 24 h; None for a lifetime bucket, which never expires."""
    if window == "lifetime":
        return None
    # the local wall time of the period's start, read as UTC, and its length: the next
    # period's start itself is past Python's calendar for the last ones of 9999
    if window == "week":
        year, week = period.split("-W")
        monday = datetime.fromisocalendar(int(year), int(week), 1)
        start, length = datetime(monday.year, monday.month, monday.day, tzinfo=UTC), 7 * DAY
    elif window == "month":
        y, m = map(int, period.split("-"))
        start, length = datetime(y, m, 1, tzinfo=UTC), calendar.monthrange(y, m)[1] * DAY
    elif window == "year":
        y = int(period)
        start, length = datetime(y, 1, 1, tzinfo=UTC), (366 if calendar.isleap(y) else 365) * DAY
    else:
        date, _, time = period.partition("T")
        hour, _, minute = time.partition(":")
        y, m, d = map(int, date.split("-"))
        start = datetime(y, m, d, int(hour or 0), int(minute or 0), tzinfo=UTC)
        length = {"minute": 60, "hour": 3_600}.get(window, DAY)
    return epoch(start) + length + END_SLACK


@dataclass(frozen=True)
class Violation:
    rule_id: str
    metric: str
    period: str
    limit: Decimal
    used: Decimal


@dataclass(frozen=True)
class Limit:
    """One entry of a verdict's ``limits``: a rule's bucket after the decision (README,
    *Verdicts*); amounts in the rule's currency, None where the rule sets no such limit
    (an amount used, where the rule has no currency)."""

    rule_id: str
    window: str
    period: str
    count_used: int
    count_limit: int | None
    count_remaining: int | None
    amount_used: Decimal | None
    amount_limit: Decimal | None
    amount_remaining: Decimal | None


@dataclass
class Verdict:
    event_id: str
    account_id: str
    type: str
    decision: str
    reason: str | None
    violations: list[Violation]
    limits: list[Limit]
    occurred_at: str  # as sent
    amount: str | None  # README, *Verdicts*: see ``shown``
    currency: str | None
    original_event_id: str | None
    seq: int = 0


@dataclass(frozen=True)
class Blank:
    """A line of JSON blanks: in neither output."""


@dataclass(frozen=True)
class DeadLetter:
    error: str  # invalid_json | invalid_event | idempotency_conflict
    why: str


@dataclass(frozen=True)
class Decided:
    verdict: Verdict
    duplicate: bool  # a resend: the product must repeat the original's bytes


Outcome = Blank | DeadLetter | Decided


@dataclass
class Event:
    event_id: str
    type: str
    account_id: str
    instant: datetime
    currency: str | None
    units: int | None  # a payment's amount in minor units
    reversal_amount: Decimal | None  # a reversal's, in its original's currency
    original_event_id: str | None
    fields: dict[str, Any]
    payload: tuple[object, ...]  # what a resend must repeat to be the same event


@dataclass
class Booked:
    """A payment that got a verdict, as a later reversal finds it."""

    account_id: str
    currency: str
    accepted: bool
    left: int  # minor units not reversed yet
    keys: list[BucketKey] = field(default_factory=list)
    born: list[int] = field(default_factory=list)  # the life of each bucket it was added to


def epoch(instant: datetime) -> int:
    """``instant`` in whole seconds since 1970 (floor)."""
    return (instant - EPOCH) // timedelta(seconds=1)


def canon(value: object) -> Canon:
    """A scope or match value: compared as text, a number by its value (``6011.0`` is
    ``6011``, and so is ``"6011"``), written out in full; ``("none", "")`` for a number
    of more than ``TEXT_DIGITS`` digits written out, which has no text (README)."""
    if isinstance(value, bool) or value is None or isinstance(value, list | dict):
        return ("other", json.dumps(value, sort_keys=True, default=str))
    if isinstance(value, int | float | Decimal):  # (a float: of a rules file, as YAML reads it)
        number = Decimal(repr(value)) if isinstance(value, float) else Decimal(value)
        if number and abs(number.adjusted()) > 2 * TEXT_DIGITS:
            return ("none", "")  # (not written out: it would take forever)
        text = format(number, "f")  # exact, never rounded (normalize() rounds to 28 digits)
        if "." in text:
            text = text.rstrip("0").rstrip(".")
        text = "0" if text in ("-0", "") else text
        if sum(c.isdigit() for c in text) > TEXT_DIGITS:
            return ("none", "")
        return ("text", text)
    return ("text", str(value))


def by_value(amount: Any) -> Any:
    """An amount written as text, as the number it stands for (README, *Rules*: rules
    scope and match by an amount's value, ``"100.00"`` is ``100``)."""
    return Decimal(amount.strip(" \t\n\r")) if isinstance(amount, str) else amount


def escape(text: str) -> str:
    """A scope value as a bucket key holds it, ``|`` and ``\\`` escaped: the README bounds
    the key's bytes, and this is how limitflow spells the key it counts them in."""
    return text.replace("\\", "\\\\").replace("|", "\\|")


def payload_value(value: object) -> object:
    """A field of one's own, for comparing resends: numbers by value, ``null`` kept."""
    if isinstance(value, dict):
        return tuple(sorted((k, payload_value(v)) for k, v in value.items()))
    if isinstance(value, list):
        return tuple(payload_value(v) for v in value)
    if isinstance(value, bool) or value is None:
        return ("literal", value)
    if isinstance(value, int | Decimal):
        return ("number", Decimal(value).normalize())
    return ("string", value)


def units_of(amount: Decimal, currency: str | None) -> int:
    """``amount`` in minor units; ``Invalid`` if it has more fraction digits than allowed."""
    scaled = amount.scaleb(MINOR[currency] if currency else REVERSAL_DIGITS)
    if scaled != scaled.to_integral_value():
        raise Invalid("too many fraction digits")
    if len(str(int(scaled))) > 15:
        raise Invalid("more than 15 digits in minor units")
    return int(scaled)


def shown(amount: Decimal | None, currency: str | None) -> str | None:
    """A verdict's ``amount`` (README, *Verdicts*): in the currency's digits when one is
    known, else as sent, written out without an exponent; null when there is none."""
    if amount is None:
        return None
    return format(amount, "f") if currency is None else f"{amount:.{MINOR[currency]}f}"


def _fitting(amount: Decimal, currency: str) -> int:
    """A reversal's ``amount`` in its original's ``currency``; ``Invalid`` when finer."""
    try:
        return units_of(amount, currency)
    except Invalid:
        raise Invalid(FINER_THAN_ITS_ORIGINAL) from None


def parse_amount(value: object) -> Decimal:
    """A decimal string (JSON blanks around it allowed) or a JSON number, > 0."""
    if isinstance(value, str):
        text = value.strip(" \t\r\n")
        if not DECIMAL_TEXT.fullmatch(text):
            raise Invalid("amount is not a decimal")
        amount = Decimal(text)
    elif isinstance(value, int | Decimal) and not isinstance(value, bool):
        amount = Decimal(value)
    else:
        raise Invalid("amount is not a string or number")
    if amount <= 0:
        raise Invalid("amount <= 0")
    return amount


def parse_time(value: object) -> datetime:
    """RFC 3339 with an offset; digits past the sixth and a leap second's ``:60`` are read
    as the last microsecond (README)."""
    match = RFC3339.fullmatch(value) if isinstance(value, str) else None
    if match is None:
        raise Invalid("occurred_at is not RFC 3339 with an offset")
    if len(match[0]) > 64:  # the event schema's maxLength
        raise Invalid("occurred_at is longer than 64 characters")
    year, month, day, hour, minute, second, fraction, offset = match.groups()
    micro = int((fraction[1:] + "000000")[:6]) if fraction else 0
    leap = second == "60"
    if leap:
        second, micro = "59", 999999
    if offset in ("Z", "z"):
        tz = UTC
    else:
        hours, minutes = int(offset[1:3]), int(offset[4:6])
        if hours > 23 or minutes > 59:
            raise Invalid("bad offset")
        delta = timedelta(hours=hours, minutes=minutes)
        tz = timezone(delta if offset[0] == "+" else -delta)
    try:
        local = datetime(
            int(year), int(month), int(day), int(hour), int(minute), int(second), micro, tz
        )
    except ValueError as e:
        raise Invalid(str(e)) from None
    instant = local.astimezone(UTC)
    if not EARLIEST <= instant < LATEST:
        raise Invalid("instant out of range")
    after = instant.replace(microsecond=0) + timedelta(seconds=1)
    if leap and (after.day, after.hour, after.minute, after.second) != (1, 0, 0, 0):
        # RFC 3339 (5.7): a leap second is the last second of a month, UTC; a :60
        # elsewhere is no time at all, like hour 24
        raise Invalid("a second 60 that is not a leap second")
    return instant


def _unique_members(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    if len({k for k, _ in pairs}) != len(pairs):
        raise Invalid("a member named twice")
    return dict(pairs)


def _text_field(doc: dict[str, Any], name: str, required: bool = True) -> str | None:
    value = doc.get(name)  # null and missing are the same for the event's own fields
    if value is None:
        if required:
            raise Invalid(f"{name} missing")
        return None
    if not isinstance(value, str) or not 1 <= len(value) <= 128:
        raise Invalid(f"{name} is not a 1-128 character string")
    return value


def parse_event(doc: dict[str, Any]) -> Event:
    """The event in ``doc``, or ``Invalid``."""
    event_id = _text_field(doc, "event_id")
    kind = doc.get("type", "payment")  # a null type is invalid
    if kind not in ("payment", "reversal"):
        raise Invalid("type")
    account_id = _text_field(doc, "account_id")
    assert event_id is not None and account_id is not None
    instant = parse_time(doc.get("occurred_at"))
    currency = doc.get("currency")
    if currency is not None and currency not in MINOR:
        raise Invalid("currency")
    units = reversal_amount = None
    original = _text_field(doc, "original_event_id", required=kind == "reversal")
    if kind == "payment":
        if currency is None or doc.get("amount") is None:
            raise Invalid("a payment needs a currency and an amount")
        units = units_of(parse_amount(doc["amount"]), currency)
    elif doc.get("amount") is not None:
        reversal_amount = parse_amount(doc["amount"])
        if currency is not None:
            units_of(reversal_amount, currency)  # only to check its digits
        else:  # in its original's currency, known once that is found (``_fitting``)
            scaled = reversal_amount.scaleb(REVERSAL_DIGITS)
            if scaled != scaled.to_integral_value():
                raise Invalid("more fraction digits than any currency has")
            if reversal_amount >= 10**15:  # more than 15 digits in any currency's units
                raise Invalid("more than 15 whole digits")
    extras = {k: v for k, v in doc.items() if k not in KNOWN_FIELDS}
    amount = Decimal(units) if units is not None else reversal_amount
    payload = (
        kind,
        account_id,
        currency,
        instant,
        original,
        None if amount is None else amount.normalize(),
        payload_value(extras),
    )
    return Event(
        event_id,
        kind,
        account_id,
        instant,
        currency,
        units,
        reversal_amount,
        original,
        doc,
        payload,
    )


class Model:
    """The state of one replay (or of several in turn on one durable store)."""

    def __init__(
        self, rules: list[dict[str, Any]], retention: tuple[int, int] | None = None
    ) -> None:
        self.rules = [Rule.from_doc(doc) for doc in rules]
        self.by_id = {rule.id: rule for rule in self.rules}
        self.buckets: dict[BucketKey, list[int]] = {}  # [count, minor units]
        self.seen: dict[str, tuple[tuple[object, ...], Verdict]] = {}
        self.booked: dict[str, Booked] = {}
        self.seqs: dict[str, int] = {}
        # retention: None, nothing ever expires
        self.retention = retention
        self.now = 0  # the store's clock, epoch s, for the batch at hand
        self.expires: dict[BucketKey, int | None] = {}  # of each bucket stored
        self.born: dict[BucketKey, int] = {}  # its life's stamp; 0 for none yet
        self.windows: dict[BucketKey, str] = {}  # the window it counts (its rule's then;
        # a key's period has that window's form, so no other window writes it)
        self.records: dict[str, tuple[int, int | None, list[BucketKey]]] = {}
        """Each idempotency record stored: its event time, its expiry, the buckets it
        counted in (an accepted reversal: released from)."""
        self.written: set[BucketKey] = set()  # by the batch at hand
        self.rewritten: dict[str, bool] = {}  # records it wrote: new (or replaced) or not
        self.reached: set[str] = set()  # what expiry did in this case, for choosing seeds
        self.forgotten: set[str] = set()  # events whose records expired

    def at(self, now: int) -> None:
        """A batch begins at ``now``: what expired by then is forgotten (it reads as
        absent), as a store's read finds it."""
        self.now = now
        for key, until in self.expires.items():
            if until is not None and until <= now and key in self.buckets:
                del self.buckets[key]
                self.born[key] = 0
                self.reached.add("bucket expired")
        for event_id, (_, until, _) in list(self.records.items()):
            if until is not None and until <= now:
                del self.records[event_id], self.seen[event_id]
                self.booked.pop(event_id, None)
                self.forgotten.add(event_id)

    def commit(self) -> None:
        """The batch at hand is stored: each record it wrote gets its expiry."""
        written, rewritten = self.written, self.rewritten
        self.written, self.rewritten = set(), {}
        if self.retention is None:
            return
        bucket_seconds, event_seconds = self.retention
        for key in written:
            end = period_end(self.windows[key], key[2])
            if end is not None:
                end = min(max(end, self.now) + bucket_seconds, LATEST_EXPIRY)
            self.expires[key] = end
        for event_id, new in rewritten.items():
            occurred, until, counted = self.records[event_id]
            if not new and until is None:
                continue  # stored never to expire: it stays so
            held = None if new else until  # a stored record's expiry never moves back
            own = min(max(occurred, self.now) + event_seconds, LATEST_EXPIRY)
            # the bucket retention past each bucket this batch wrote that it counted in:
            # a resend after the record went would count again in a bucket still
            # holding it (the margin: the clock difference tolerated between a deleter
            # and a member)
            kept = [self.expires[key] for key in counted if key in written]
            if None in kept:
                until = None  # a lifetime bucket's: kept for good
            else:
                past = (min(e + bucket_seconds, LATEST_EXPIRY) for e in kept if e is not None)
                until = max([own, *past])
                if until > own:
                    self.reached.add("record kept for its bucket")
                if held is not None and held > until:
                    until = held
            self.records[event_id] = (occurred, until, counted)

    def change_rules(self, rules: list[dict[str, Any]]) -> None:
        """The rules file changed in place between two runs on one store (README,
        *Changing rules*): buckets are named by rule id, period and scope values, and
        carry on under the new rules."""
        self.rules = [Rule.from_doc(doc) for doc in rules]
        self.by_id = {rule.id: rule for rule in self.rules}

    def _wrote(self, key: BucketKey, window: str) -> None:
        self.written.add(key)
        self.windows[key] = window
        if not self.born.get(key):
            self.born[key] = self.now  # a new life

    def process(self, line: str) -> Outcome:
        """The outcome of one input line (without its line end)."""
        if line.strip(" \t\r") == "":
            return Blank()
        try:
            doc = json.loads(line, parse_float=Decimal, object_pairs_hook=_unique_members)
        except Invalid as e:
            return DeadLetter("invalid_event", str(e))
        except (ValueError, RecursionError) as e:
            return DeadLetter("invalid_json", str(e))
        try:
            if not isinstance(doc, dict):
                raise Invalid("not an object")
            event = parse_event(doc)
        except Invalid as e:
            return DeadLetter("invalid_event", str(e))
        if event.event_id in self.forgotten and event.event_id not in self.seen:
            self.reached.add("an event decided again, its record expired")
        if event.original_event_id in self.forgotten and event.type == "reversal":
            self.reached.add("a reversal of an expired record")
        if event.event_id in self.seen:
            payload, verdict = self.seen[event.event_id]
            if payload == event.payload:
                return Decided(verdict, duplicate=True)
            return DeadLetter("idempotency_conflict", "another payload under a seen event_id")
        try:
            if event.type == "payment":
                verdict, counted = self._payment(event)
            else:
                verdict, counted = self._reversal(event)
        except Invalid as e:  # a reversal that does not fit its original: nothing changed
            return DeadLetter("invalid_event", str(e))
        verdict.seq = self.seqs[event.account_id] = self.seqs.get(event.account_id, 0) + 1
        self.seen[event.event_id] = (event.payload, verdict)
        self.records[event.event_id] = (epoch(event.instant), None, counted)
        self.rewritten[event.event_id] = True
        return Decided(verdict, duplicate=False)

    @staticmethod
    def _field(event: Event, name: str) -> Any:
        """An event's field as a rule scopes or matches by it: a payment that leaves its
        ``type`` out is one all the same (README, *Idempotency*: a ``type`` given must be
        ``payment`` or ``reversal``)."""
        value = event.fields.get(name)
        if name == "amount" and event.type == "payment":
            return by_value(value)  # README: an amount by its value, written as text or not
        return event.type if value is None and name == "type" else value

    def _applies(self, rule: Rule, event: Event) -> bool:
        if rule.currency is not None and rule.currency != event.currency:
            return False
        scoped = [self._field(event, name) for name in rule.scope]
        if any(value is None for value in scoped):
            return False
        if any(isinstance(value, list | dict) or canon(value)[0] == "none" for value in scoped):
            # README: a list or an object in a field that a rule scopes by is an
            # invalid_event (a rule of the event's currency with every scope field given,
            # whether or not its match would take the event), and so is a number with no
            # text
            raise Invalid("a list, an object or a number with no text in a scoped field")
        return all(
            self._field(event, name) is not None and canon(self._field(event, name)) in values
            for name, values in rule.match.items()
        )

    def _limit(self, rule: Rule, period: str, count: int, used: int) -> Limit:
        """``rule``'s entry in ``limits`` for a bucket holding ``count`` and ``used``."""
        minor = None if rule.currency is None else MINOR[rule.currency]

        def amount(units: int | None) -> Decimal | None:
            return None if units is None or minor is None else Decimal(units).scaleb(-minor)

        return Limit(
            rule.id,
            rule.window,
            period,
            count,
            rule.max_count,
            None if rule.max_count is None else max(rule.max_count - count, 0),
            amount(used),
            amount(rule.max_units),
            None if rule.max_units is None else amount(max(rule.max_units - used, 0)),
        )

    def _payment(self, event: Event) -> tuple[Verdict, list[BucketKey]]:
        assert event.currency is not None and event.units is not None
        minor = MINOR[event.currency]
        violations: list[Violation] = []
        keys: list[BucketKey] = []
        applied: list[tuple[Rule, BucketKey | None]] = []
        for rule in self.rules:
            if not self._applies(rule, event):
                continue
            if rule.window == "transaction":  # no bucket: the amount alone
                applied.append((rule, None))
                if rule.max_units is not None and event.units > rule.max_units:
                    limit = Decimal(rule.max_units).scaleb(-minor)
                    violations.append(
                        Violation(rule.id, "amount", "transaction", limit, Decimal(0))
                    )
                continue
            scope = tuple(canon(self._field(event, name)) for name in rule.scope)
            key = (rule.id, scope, rule.period(event.instant))
            named = "|".join((rule.id, key[2], *(escape(text) for _, text in scope)))
            if len(named.encode()) > MAX_KEY_BYTES:
                raise Invalid("a bucket key of more than 1,024 bytes")
            count, used = self.buckets.get(key, (0, 0))
            if rule.max_count is not None and count + 1 > rule.max_count:
                violations.append(
                    Violation(rule.id, "count", key[2], Decimal(rule.max_count), Decimal(count))
                )
            if rule.max_units is not None and used + event.units > rule.max_units:
                limit = Decimal(rule.max_units).scaleb(-minor)
                violations.append(
                    Violation(rule.id, "amount", key[2], limit, Decimal(used).scaleb(-minor))
                )
            keys.append(key)
            applied.append((rule, key))
        accepted = not violations
        if accepted:
            for key in keys:
                bucket = self.buckets.setdefault(key, [0, 0])
                bucket[0] += 1
                bucket[1] += event.units
                self._wrote(key, self.by_id[key[0]].window)
        limits = []
        for rule, applied_key in applied:
            if applied_key is None:  # a transaction: this payment alone, whatever the decision
                limits.append(self._limit(rule, "transaction", 1, event.units))
            else:  # after the decision: with this payment if accepted, as before it if not
                count, used = self.buckets.get(applied_key, (0, 0))
                limits.append(self._limit(rule, applied_key[2], count, used))
        self.booked[event.event_id] = Booked(
            event.account_id,
            event.currency,
            accepted,
            left=event.units if accepted else 0,
            keys=keys if accepted else [],
            born=[self.born[key] for key in keys] if accepted else [],
        )
        decision, reason = ("accept", None) if accepted else ("reject", "limit_exceeded")
        amount = Decimal(event.units).scaleb(-minor)
        verdict = self._verdict(event, decision, reason, violations, limits, amount, event.currency)
        return verdict, keys if accepted else []

    @staticmethod
    def _verdict(
        event: Event,
        decision: str,
        reason: str | None,
        violations: list[Violation],
        limits: list[Limit],
        amount: Decimal | None,
        currency: str | None,
    ) -> Verdict:
        return Verdict(
            event.event_id,
            event.account_id,
            event.type,
            decision,
            reason,
            violations,
            limits,
            occurred_at=event.fields["occurred_at"],
            amount=shown(amount, currency),
            currency=currency,
            original_event_id=event.original_event_id,
        )

    def _reversal(self, event: Event) -> tuple[Verdict, list[BucketKey]]:
        assert event.original_event_id is not None
        original = self.booked.get(event.original_event_id)
        released: list[BucketKey] = []
        reason = None
        # the verdict's amount and currency (README, *Verdicts*): its own where its
        # original is not found; where it is, the original's currency (unless the
        # reversal names one and the original was not accepted), and the amount released
        # or that would have been: the reversal's, or all that is left of the original
        amount, currency = event.reversal_amount, event.currency
        if original is None or original.account_id != event.account_id:
            reason = "original_not_found"
        elif not original.accepted:
            reason = "original_not_accepted"
            currency = currency or original.currency
            if event.reversal_amount is not None:  # README, *Reversals*
                _fitting(event.reversal_amount, currency)
        else:
            # README, *Reversals*: checked before anything else, whatever is left
            if event.currency is not None and event.currency != original.currency:
                raise Invalid(NOT_ITS_CURRENCY)
            currency = original.currency
            units = original.left
            if event.reversal_amount is not None:
                units = _fitting(event.reversal_amount, currency)
            amount = Decimal(units).scaleb(-MINOR[currency])
            if original.left == 0:
                reason = "already_reversed"
            elif units > original.left:
                reason = "reversal_exceeds_original"
            else:
                original.left -= units
                self.rewritten.setdefault(event.original_event_id, False)
                for key, born in zip(original.keys, original.born, strict=True):
                    bucket = self.buckets.get(key)
                    if bucket is None:
                        self.reached.add("reversal found its bucket expired")
                        continue  # nothing of it to release, nothing written
                    if self.born[key] != born:
                        self.reached.add("reversal found its bucket in a new life")
                        continue  # it expired and began again without this payment
                    bucket[1] -= units
                    if original.left == 0:
                        bucket[0] -= 1
                    self._wrote(key, self.windows[key])
                    released.append(key)
        # an accepted reversal explains the buckets its payment was counted in, after the
        # release, in that order (one that expired since as it stands; none that no
        # rule bounds now: its rule removed or moved to another window); a rejected one
        # released nothing
        limits = []
        if reason is None and original is not None:
            for key in original.keys:
                rule = self.by_id.get(key[0])
                if rule is None or rule.window != self.windows[key]:
                    continue
                count, used = self.buckets.get(key, (0, 0))
                limits.append(self._limit(rule, key[2], count, used))
        decision = "reject" if reason else "accept"
        verdict = self._verdict(event, decision, reason, [], limits, amount, currency)
        return verdict, released
