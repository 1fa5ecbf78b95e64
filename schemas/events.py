"""Transaction events: the wire format, and its parsing into validated ``Event`` values.

Parsing is hand-written rather than a typed decode because every field the sender adds
(``card_id``, ``merchant_id``, ``mcc``…) must be kept for rule scopes and matches. The
``EventDoc`` struct describes the same format for the generated JSON Schema.
"""

from __future__ import annotations

import enum
import hashlib
import json
import re
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from typing import Annotated, Any, Final, TypeGuard

import msgspec

from limitflow.errors import LimitflowError
from schemas.amounts import (
    JSON_BLANKS,
    MAX_MINOR,
    AmountError,
    amount_text,
    exact_text,
    to_decimal,
    to_minor,
    without_trailing_zeros,
)
from schemas.currencies import FINEST_MINOR_UNIT, MINOR_UNITS

_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
_CORE_FIELDS: Final = frozenset(
    {"event_id", "type", "account_id", "amount", "currency", "occurred_at", "original_event_id"}
)


class EventType(enum.StrEnum):
    """What an event asks for."""

    PAYMENT = "payment"
    REVERSAL = "reversal"


class DeadLetterError(enum.StrEnum):
    """Why an input record was not turned into a verdict."""

    INVALID_JSON = "invalid_json"
    INVALID_EVENT = "invalid_event"
    IDEMPOTENCY_CONFLICT = "idempotency_conflict"


class EventRejected(LimitflowError, ValueError):
    """An input record that cannot become an event; carries the dead-letter code."""

    def __init__(self, error: DeadLetterError, detail: str) -> None:
        super().__init__(detail)
        self.error = error
        self.detail = detail


class Event(msgspec.Struct, frozen=True, gc=False):
    """A validated transaction event."""

    event_id: str
    """Idempotency key, 1 to 128 characters."""
    type: EventType
    account_id: str
    amount: int | None
    """Minor units of ``currency``; None only for a reversal of "all that is left"."""
    amount_decimal: Decimal | None
    """The amount of a reversal sent without a currency (its currency is the original's)."""
    currency: str | None
    occurred_at: str
    """The timestamp exactly as sent (RFC 3339 with an offset)."""
    epoch: int
    """``occurred_at`` as whole seconds since the Unix epoch (floor)."""
    original_event_id: str | None
    fields: dict[str, Any]
    """The whole decoded object, for rule scopes and matches."""
    fingerprint: str
    """Hash of the parsed payload: equal for a resend of the same event."""
    legacy_fingerprint: str | None = None
    """The fingerprint limitflow gave this payload before numbers in extra fields were
    compared by value; set only where the two differ, so that a resend of an event stored
    before that is still a duplicate. (It cannot wrongly match a newer record: it differs
    from ``fingerprint`` only by a number written in a form the newer one never hashes.)"""


_DATE_TIME: Final = r"[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt ][0-9]{2}:[0-9]{2}:[0-9]{2}(?:\.[0-9]+)?"
"""RFC 3339's date and time (a space for the T, as its section 5.6 allows); [0-9], not
\\d, which a schema validator may take for other scripts' digits. With ``_OFFSET``, one
pattern for the parser and the JSON Schema, so that the two cannot drift apart."""
_NUMERIC_OFFSET: Final = r"[+-](?:[01][0-9]|2[0-3]):[0-5][0-9]"
"""RFC 3339's numeric time-offset: hours 00-23, minutes 00-59. Python 3.11's
fromisoformat reads ``+08:60`` as +09:00 and ``+08:99`` as +09:39, so the pattern
refuses them first."""
_OFFSET: Final = f"([Zz]|{_NUMERIC_OFFSET})"


class EventDoc(msgspec.Struct, forbid_unknown_fields=False):
    """A transaction event as sent. Fields beyond these are kept for rule scopes."""

    event_id: Annotated[str, msgspec.Meta(min_length=1, max_length=128)]
    account_id: Annotated[str, msgspec.Meta(min_length=1, max_length=128)]
    occurred_at: Annotated[
        str,
        msgspec.Meta(
            description="RFC 3339 timestamp with a UTC offset or Z; naive times are invalid",
            pattern=f"^{_DATE_TIME}{_OFFSET}$",
            max_length=64,
        ),
    ]
    type: EventType = EventType.PAYMENT
    amount: (
        Annotated[
            # [0-9], not \d: a validator's \d may take other scripts' digits
            str,
            msgspec.Meta(
                pattern=r"^[ \t\n\r]*\+?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+)?[ \t\n\r]*$"
            ),
        ]
        | Annotated[float, msgspec.Meta(gt=0)]
        | None
    ) = None
    """Decimal > 0 with no more fraction digits than the currency's minor unit."""
    currency: Annotated[str, msgspec.Meta(pattern=r"^[A-Z]{3}$")] | None = None
    """ISO 4217 code; required for payments."""
    original_event_id: Annotated[str, msgspec.Meta(min_length=1, max_length=128)] | None = None
    """For reversals: the payment being reversed."""


_decoder: Final = msgspec.json.Decoder(float_hook=Decimal)
_fingerprint_encoder: Final = msgspec.json.Encoder(order="sorted", decimal_format="number")


MAX_ID_CHARS: Final = 128
"""Longest ``event_id``, ``account_id`` or ``original_event_id``."""


def is_id(value: object) -> TypeGuard[str]:
    """Whether ``value`` is a usable ``event_id``/``account_id``: 1 to 128 characters."""
    return isinstance(value, str) and 1 <= len(value) <= MAX_ID_CHARS


def _id(doc: dict[str, Any], name: str, *, required: bool = True) -> str | None:
    value = doc.get(name)
    if value is None:
        if required:
            raise EventRejected(DeadLetterError.INVALID_EVENT, f"{name}: is required")
        return None
    if not is_id(value):
        raise EventRejected(
            DeadLetterError.INVALID_EVENT,
            f"{name}: must be a string of 1 to {MAX_ID_CHARS} characters",
        )
    return value


_RFC3339: Final = re.compile(f"{_DATE_TIME}{_OFFSET}?")
"""RFC 3339's date-time, the offset optional here so that its absence gets its own
message. Python's fromisoformat alone also takes ISO week dates, times without seconds,
``+0800`` and other ISO 8601 forms that the contract does not."""


def _timestamp(value: object) -> tuple[str, int, int]:
    """Return (text, floor epoch seconds, epoch microseconds) of an RFC 3339 timestamp."""
    if not isinstance(value, str):
        raise EventRejected(DeadLetterError.INVALID_EVENT, "occurred_at: is required, as a string")
    form = _RFC3339.fullmatch(value) if len(value) <= 64 else None
    if form is not None and form.group(1) is None:
        raise EventRejected(
            DeadLetterError.INVALID_EVENT,
            f"occurred_at: {value!r} has no UTC offset (use Z or +HH:MM)",
        )
    leap = False
    try:
        if form is None:
            raise ValueError(value)
        # RFC 3339 allows a lower-case "z"; Python 3.11's fromisoformat does not
        text = value[:-1] + "Z" if value[-1] == "z" else value
        if text[17:19] == "60":  # a leap second: Python's datetime has no second 60
            text, leap = text[:17] + "59" + text[19:], True
        moment = datetime.fromisoformat(text)
        if leap and (moment.astimezone(UTC) + _SECOND).strftime("%d %H:%M:%S") != "01 00:00:00":
            raise ValueError(value)  # leap seconds end a month (UTC): 23:59:60 of its last day
    except ValueError:
        raise EventRejected(
            DeadLetterError.INVALID_EVENT, f"occurred_at: {value!r} is not an RFC 3339 date-time"
        ) from None
    except OverflowError:  # a leap second whose UTC or next second is past Python's calendar
        raise _outside(value) from None
    micros = (moment - _EPOCH) // _MICROSECOND
    if leap:  # the last microsecond of 23:59:59: the same minute, day and year
        micros = micros - micros % 1_000_000 + 999_999
    if not _FIRST_MICROS <= micros < _END_MICROS:
        raise _outside(value)
    return value, micros // 1_000_000, micros


def _outside(value: str) -> EventRejected:
    return EventRejected(
        DeadLetterError.INVALID_EVENT,
        f"occurred_at: {value!r} is outside 0001-01-02 to 9999-12-30 UTC",
    )


_MICROSECOND: Final = datetime(1970, 1, 1, 0, 0, 0, 1, tzinfo=UTC) - _EPOCH
_SECOND: Final = datetime(1970, 1, 1, 0, 0, 1, tzinfo=UTC) - _EPOCH
# A day inside Python's calendar on both ends, so the local time of an accepted instant
# exists in every zone (offsets stay under a day); beyond that, period keys overflow.
_FIRST_MICROS: Final = (datetime(1, 1, 2, tzinfo=UTC) - _EPOCH) // _MICROSECOND
_END_MICROS: Final = (datetime(9999, 12, 31, tzinfo=UTC) - _EPOCH) // _MICROSECOND


MAX_DEPTH: Final = 32
"""Deepest nesting of arrays and objects in an event's extra fields. The decoder and the
fingerprint's encoder recurse, so a record nested thousands deep would raise
RecursionError, which is no dead-letter code: it would stop the consumer on every retry."""


JSON_BLANK_BYTES: Final = JSON_BLANKS.encode()
"""``JSON_BLANKS`` for bytes: all that a blank line or an empty record may hold.
``bytes.strip()`` also takes vertical tab and form feed, which are not JSON's: a line of
them is bad input, to dead-letter, not a blank one to skip."""


_TOO_LONG: Final = "Integer value out of range"
"""How msgspec says an integer has more digits than Python reads."""


def decode_json(raw: bytes | str) -> Any:
    """Decode one JSON document, keeping number literals exact. An object that names a
    member twice is refused (``invalid_event``): readers disagree on which one counts
    (msgspec and Python keep the last, others the first or refuse it), and a payment
    whose amount depends on the reader must not be counted by one amount and booked by
    another."""
    if not (raw.strip(JSON_BLANKS) if isinstance(raw, str) else raw.strip(JSON_BLANK_BYTES)):
        raise EventRejected(DeadLetterError.INVALID_JSON, "empty record: no JSON document")
    try:
        doc = _decoder.decode(raw)
    except (msgspec.DecodeError, UnicodeDecodeError) as exc:
        if str(exc).startswith(_TOO_LONG):
            # Python reads no integer of more digits (``sys.get_int_max_str_digits``):
            # the time to read one grows with the square of its length
            where = str(exc).removeprefix(_TOO_LONG).strip(" -")
            raise EventRejected(
                DeadLetterError.INVALID_JSON,
                f"not valid JSON here: an integer of more than {sys.get_int_max_str_digits()}"
                f" digits ({where})",
            ) from None
        raise EventRejected(
            DeadLetterError.INVALID_JSON, f"not valid JSON: {_why_not_json(raw, exc)}"
        ) from None
    except RecursionError:
        raise EventRejected(
            DeadLetterError.INVALID_JSON, "not valid JSON here: nested too deeply to decode"
        ) from None
    except InvalidOperation:
        # a number of 10**(10**18) or more (or as small): ``Decimal``, the decoder's
        # float_hook, refuses it; the error it raised stopped the consumer on every retry
        raise EventRejected(
            DeadLetterError.INVALID_JSON,
            "not valid JSON here: a number's exponent is out of range (10^18 or more)",
        ) from None
    if type(doc) is dict:
        text = raw if isinstance(raw, bytes) else raw.encode("utf-8", "surrogatepass")
        if members(text) != len(doc):
            raise EventRejected(
                DeadLetterError.INVALID_EVENT,
                f"{_twice(text)}: given more than once (which one counts would depend on"
                " the reader)",
            )
    return doc


_ESCAPE: Final = re.compile(r"\\(?:u[0-9a-fA-F]{4}|.)", re.DOTALL)
"""One escape of a JSON string, so that ``\\\\ud800`` (an escaped backslash, then
text) is not taken for a ``\\u`` escape."""


def _why_not_json(raw: bytes | str, exc: Exception) -> str:
    """The decoder's reason, where it misleads replaced by the record's own fault."""
    if isinstance(exc, UnicodeDecodeError) and isinstance(raw, bytes):
        # the decoder counts from the start of the string it was reading, not the record
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError as whole:
            return (
                f"not UTF-8: byte 0x{raw[whole.start]:02x} at offset {whole.start} ({whole.reason})"
            )
    if "truncated" in str(exc):
        text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
        high: re.Match[str] | None = None  # a high surrogate escape awaiting its low one
        for found in _ESCAPE.finditer(text):
            code = int(found.group()[2:], 16) if len(found.group()) == 6 else -1
            paired = high is not None and found.start() == high.end()
            if high is not None and not (paired and 0xDC00 <= code <= 0xDFFF):
                break  # the decoder says "Input data was truncated" of this one
            high = found if 0xD800 <= code <= 0xDBFF and high is None else None
        if high is not None:
            return f"{high.group()} is half a surrogate pair, not a character"
    return str(exc)


_STRING: Final = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_STRUCTURE: Final = re.compile(rb"[{}\[\]:]")


def members(text: bytes) -> int:
    """The members of the object that valid JSON ``text`` is: the colons outside strings
    at its first level (each member has one). The reference of the compiled parser's
    ``lf_members``, and what runs without a C compiler."""
    depth = count = 0
    for mark in _STRUCTURE.findall(_STRING.sub(b'""', text)):
        if mark in b"{[":
            depth += 1
        elif mark in b"}]":
            depth -= 1
        elif depth == 1:
            count += 1
    return count


def _twice(text: bytes) -> str:
    """Which member name an object gives twice, for the dead letter's detail."""
    seen: set[str] = set()
    twice: list[str] = []

    def pairs(items: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
        return items

    try:
        top = json.loads(text, object_pairs_hook=pairs)
    except (ValueError, RecursionError):  # not what the json module takes: say it unnamed
        return "a member name"
    for name, _ in top if isinstance(top, list) else []:
        if name in seen and name not in twice:
            twice.append(name)
        seen.add(name)
    return ", ".join(twice) if twice else "a member name"


_CONTAINERS: Final = (dict, list)
"""A tuple, not ``dict | list``: that builds a union object on every evaluation."""


def _nested_deeper_than(value: dict[str, Any] | list[Any], limit: int) -> bool:
    """Whether ``value`` (itself one level) nests arrays or objects more than ``limit``
    levels deep; level by level, without recursion."""
    level = [value]
    for _ in range(limit):
        level = [
            item
            for container in level
            for item in (container.values() if isinstance(container, dict) else container)
            if isinstance(item, _CONTAINERS)
        ]
        if not level:
            return False
    return True


def parse_event(raw: bytes | str) -> Event:
    """Decode and validate one event; raise ``EventRejected`` with the dead-letter code."""
    if _fast_parse is not None:
        found = _fast_parse(raw)
        if isinstance(found, Event):
            return found
        if found is not None:  # decoded, an object, not the usual event: every check
            return _checked_event(found)
    doc = decode_json(raw)
    if not isinstance(doc, dict):
        raise EventRejected(DeadLetterError.INVALID_EVENT, "an event must be a JSON object")
    return event_from_dict(doc)


def event_from_dict(doc: dict[str, Any]) -> Event:
    """Validate an already-decoded event object (numbers as Decimal, not float)."""
    event = _fast_event(doc)
    if event is None:
        event = _checked_event(doc)
    return event


def _shown(value: object) -> str:
    """``repr(value)``, or a word for a container too deep for it."""
    try:
        return repr(value)
    except RecursionError:
        return f"a {type(value).__name__} nested too deeply"


def _checked_event(doc: dict[str, Any]) -> Event:
    """``event_from_dict`` for any object: every check, every rejection and its words.
    ``_common_event`` must agree with it on whatever that one takes."""
    event_id = _id(doc, "event_id")
    account_id = _id(doc, "account_id")
    assert event_id is not None and account_id is not None
    kind_text = doc.get("type", "payment")
    kind = _TYPES.get(kind_text) if type(kind_text) is str else None
    if kind is None:
        raise EventRejected(
            DeadLetterError.INVALID_EVENT,
            f"type: must be 'payment' or 'reversal', got {_shown(kind_text)}",
        )
    occurred_at, epoch, micros = _timestamp(doc.get("occurred_at"))

    currency = doc.get("currency")
    if currency is not None and (not isinstance(currency, str) or currency not in MINOR_UNITS):
        raise EventRejected(
            DeadLetterError.INVALID_EVENT, f"currency: {_shown(currency)} is not an ISO 4217 code"
        )
    raw_amount = doc.get("amount")
    original_event_id = None
    amount: int | None = None
    amount_decimal: Decimal | None = None
    if kind is EventType.PAYMENT:
        if currency is None:
            raise EventRejected(DeadLetterError.INVALID_EVENT, "currency: is required")
        if raw_amount is None:
            raise EventRejected(DeadLetterError.INVALID_EVENT, "amount: is required")
        # a payment reverses nothing, but what it sends there must still be an event id
        _id(doc, "original_event_id", required=False)
    else:
        original_event_id = _id(doc, "original_event_id")
    if raw_amount is not None:
        try:
            if currency is not None:
                amount = to_minor(raw_amount, MINOR_UNITS[currency])
            else:
                amount_decimal = _currency_free_amount(raw_amount)
        except AmountError as exc:
            raise EventRejected(DeadLetterError.INVALID_EVENT, f"amount: {exc}") from None
        if amount is not None and currency is not None and type(raw_amount) is str:
            text = amount_text(amount, MINOR_UNITS[currency])
            if text != raw_amount:  # rules scope and match by the value, as for a number
                doc["amount"] = text

    extras = {k: v for k, v in doc.items() if k not in _CORE_FIELDS}
    texts_only = True
    for name, value in extras.items():
        if type(value) is str:
            continue
        texts_only = False
        if isinstance(value, _CONTAINERS) and _nested_deeper_than(value, MAX_DEPTH):
            raise EventRejected(
                DeadLetterError.INVALID_EVENT,
                f"{name}: nested more than {MAX_DEPTH} levels deep",
            )
    by_value = extras if texts_only else _numbers_by_value(extras)
    # the same currency makes minor units comparable; without one, the exact value
    amount_part = (
        amount
        if amount is not None
        else (None if amount_decimal is None else exact_text(amount_decimal))
    )
    original = doc.get("original_event_id")  # on a payment too: a changed resend differs
    fingerprint = _fingerprint(
        event_id,
        kind.value,
        account_id,
        amount_part,
        currency,
        micros,  # the instant, to the microsecond (a leap second is its last one)
        original,
        by_value,
    )
    legacy = None
    if by_value is not extras:
        legacy = _fingerprint(
            event_id, kind.value, account_id, amount_part, currency, micros, original, extras
        )
    return Event(
        event_id=event_id,
        type=kind,
        account_id=account_id,
        amount=amount,
        amount_decimal=amount_decimal,
        currency=currency,
        occurred_at=occurred_at,
        epoch=epoch,
        original_event_id=original_event_id,
        fields=doc,
        fingerprint=fingerprint,
        legacy_fingerprint=legacy,
    )


def _fingerprint(*canonical: Any) -> str:
    digest = _BLAKE2B_16.copy()  # cheaper than building one: no parameter block to parse
    digest.update(_fingerprint_encoder.encode(canonical))
    return digest.hexdigest()


_BLAKE2B_16: Final = hashlib.blake2b(digest_size=16)
"""An empty 16-byte BLAKE2b, copied for each fingerprint; never updated itself."""

_TYPES: Final = {"payment": EventType.PAYMENT, "reversal": EventType.REVERSAL}
_PAYMENT: Final = EventType.PAYMENT
"""A module constant: ``EventType.PAYMENT`` looks the member up on the enum's class each
time (~0.1 us)."""
_COMMON_TIME: Final = re.compile(
    r"[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt ][0-9]{2}:[0-9]{2}:[0-5][0-9](?:\.[0-9]+)?"
    f"(?:Z|{_NUMERIC_OFFSET})"
)
"""The part of ``_RFC3339`` that ``_timestamp`` hands to fromisoformat as it is: an offset
present, no lower-case "z" to rewrite, no second 60 (a leap second)."""
_PLAIN_EXTRAS: Final = (str, bool, type(None))


def _common_event(doc: dict[str, Any]) -> Event | None:
    """``_checked_event(doc)`` for the usual valid event, in fewer steps; None for anything
    else (it then decides, and words any rejection): a string amount in a currency, or a
    reversal with neither, an RFC 3339 time with an upper-case Z or an offset, and extra
    fields that are strings, booleans, nulls or integers of under 19 digits. Never raises.

    It takes the same steps as ``_checked_event`` on those, minus what cannot happen to
    them; tests/unit/test_events_fast.py feeds both the same tricky objects. Its compiled
    twin, ``schemas._fastparse.CommonEvent.event``, takes its place when built
    (``_fast_event``); this one stays the reference, and the fallback without a C compiler."""
    event_id = doc.get("event_id")
    account_id = doc.get("account_id")
    if (
        type(event_id) is not str
        or type(account_id) is not str
        or not 1 <= len(event_id) <= MAX_ID_CHARS
        or not 1 <= len(account_id) <= MAX_ID_CHARS
    ):
        return None
    kind_text = doc.get("type", "payment")
    kind = _TYPES.get(kind_text) if type(kind_text) is str else None
    if kind is None:
        return None
    value = doc.get("occurred_at")
    if type(value) is not str or len(value) > 64 or _COMMON_TIME.fullmatch(value) is None:
        return None
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        return None
    micros = (moment - _EPOCH) // _MICROSECOND
    if not _FIRST_MICROS <= micros < _END_MICROS:
        return None

    original = doc.get("original_event_id")  # on a payment too: a changed resend differs
    if original is not None and (
        type(original) is not str or not 1 <= len(original) <= MAX_ID_CHARS
    ):
        return None
    currency = doc.get("currency")
    raw_amount = doc.get("amount")
    if kind is _PAYMENT:
        original_event_id = None
    elif original is None:
        return None
    else:
        original_event_id = original
    if currency is None:
        if raw_amount is not None or kind is _PAYMENT:
            return None
        amount = None
    elif type(currency) is not str or type(raw_amount) is not str:
        return None
    else:
        exponent = MINOR_UNITS.get(currency)
        if exponent is None:
            return None
        # to_minor's own fast path, on the same form: ASCII digits, an optional fraction
        whole, dot, fraction = raw_amount.partition(".")
        if (
            not raw_amount.isascii()
            or not 1 <= len(whole) <= 30
            or not whole.isdigit()
            or (dot and (not 1 <= len(fraction) <= 30 or not fraction.isdigit()))
        ):
            return None
        fraction = fraction.rstrip("0")
        if len(fraction) > exponent:
            return None
        # whole * 10**exponent + the fraction in minor units, as one int() of the digits
        amount = int(whole + fraction.ljust(exponent, "0"))
        if not 0 < amount <= MAX_MINOR:
            return None
        if (dot and len(whole) + 1 + len(fraction) != len(raw_amount)) or (
            whole[0] == "0" and len(whole) > 1
        ):  # "100.00", "0100": rules scope and match by the value's text, "100"
            doc["amount"] = amount_text(amount, exponent)

    extras = doc.copy()
    del extras["event_id"], extras["account_id"], extras["occurred_at"]
    extras.pop("type", None)
    extras.pop("amount", None)
    extras.pop("currency", None)
    extras.pop("original_event_id", None)
    for item in extras.values():
        if type(item) is not str and (
            type(item) not in _PLAIN_EXTRAS
            and not (type(item) is int and -_LONGEST_INT < item < _LONGEST_INT)
        ):
            return None  # numbers to compare by value, or containers to measure
    digest = _BLAKE2B_16.copy()
    digest.update(
        _fingerprint_encoder.encode(
            (event_id, kind_text, account_id, amount, currency, micros, original, extras)
        )
    )
    return Event(
        event_id,
        kind,
        account_id,
        amount,
        None,
        currency,
        value,
        micros // 1_000_000,
        original_event_id,
        doc,
        digest.hexdigest(),
        None,
    )


_PLAIN_TYPES: Final = (str, bool, type(None))
_LONGEST_INT: Final = 10**18
"""Integers at least this long are compared as numbers, not as digits: a decoder may read
such a literal as an integer or as a number with an exponent."""


def _currency_free_amount(raw: object) -> Decimal:
    """A reversal's amount sent without a currency (the original's, known once it is
    looked up): > 0, with no more fraction digits than some currency has, written plain
    as the verdict shows it (``1E+3`` is ``1000``; trailing zeros as sent)."""
    number = to_decimal(raw)
    if number <= 0:
        raise AmountError(f"{raw!r} must be > 0")
    exp = without_trailing_zeros(number).as_tuple().exponent
    assert isinstance(exp, int)  # finite
    if -exp > FINEST_MINOR_UNIT:
        raise AmountError(f"{raw!r} has more fraction digits than any currency allows")
    return Decimal(format(number, "f"))


def _numbers_by_value(value: Any) -> Any:
    """``value`` (extra fields, or one of them) with every number in one form per value:
    ``6011``, ``6011.0`` and ``6.011e3`` alike, ``0.50`` as ``0.5``. The same object when
    nothing changes, which is the usual case (strings and ordinary integers)."""
    kind = type(value)
    if kind in _PLAIN_TYPES or (kind is int and -_LONGEST_INT < value < _LONGEST_INT):
        return value
    if kind is dict:
        for item in value.values():  # the usual extra fields: strings, ordinary integers
            if type(item) not in _PLAIN_TYPES and not (
                type(item) is int and -_LONGEST_INT < item < _LONGEST_INT
            ):
                break
        else:
            return value
        changed = {k: _numbers_by_value(v) for k, v in value.items()}
        if any(changed[k] is not v for k, v in value.items()):
            return changed
        return value
    if kind is list:
        items = [_numbers_by_value(v) for v in value]
        if any(a is not b for a, b in zip(items, value, strict=True)):
            return items
        return value
    number = value if kind is Decimal else Decimal(value)
    if not number.is_finite():
        return value
    exact = without_trailing_zeros(number)
    _, digits, exp = exact.as_tuple()
    assert isinstance(exp, int)
    if exp >= 0 and len(digits) + exp < 19:  # an integral value an int holds as such
        return int(exact)
    return value if kind is Decimal and exact.as_tuple() == value.as_tuple() else exact


# Last, once every name it is given exists: the compiled twin of _common_event.
try:
    from schemas import _fastparse
except ImportError:  # built without a C compiler: _common_event is the fast path
    _fastparse = None  # type: ignore[assignment]

_compiled = (
    None
    if _fastparse is None
    else _fastparse.CommonEvent(
        Event,
        EventType.PAYMENT,
        EventType.REVERSAL,
        MINOR_UNITS,
        _fingerprint_encoder,
        _BLAKE2B_16,
        MAX_ID_CHARS,
        _FIRST_MICROS,
        _END_MICROS,
        _LONGEST_INT,
        MAX_MINOR,
        decode=_decoder.decode,
    )
)
_fast_event: Callable[[dict[str, Any]], Event | None] = (
    _common_event if _compiled is None else _compiled.event
)
"""What ``event_from_dict`` tries first: the compiled ``_common_event`` when it is built."""
_fast_parse: Callable[[bytes | str], Event | dict[str, Any] | None] | None = (
    None if _compiled is None else _compiled.parse
)
"""What ``parse_event`` tries first, when the extension is built (``CommonEvent.parse``)."""
