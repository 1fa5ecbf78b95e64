"""Random rules files and event streams aimed at the contract's edges.

``case(seed)`` is a function of the seed alone (one ``random.Random``, no clock): the
same seed gives the same rules and the same lines on every machine. Times cluster
around anchors (DST changes in New York, London, Lord Howe, Vancouver; local midnights
at year, ISO week, month and leap-day ends in each chosen zone) and are written with
random offsets, including ``+05:45``, ``-23:59`` and the zone's own. Amounts are near
the limits and written in every form the contract allows. A fifth of the lines or so
are resends (some reformatted, some changed) and invalid lines.

A reversal in another currency than its original's, or with an amount finer than the
original's currency allows, which the contract leaves open, came later (README,
*Reversals*, written from the code): now and then, picked by the event's number so that
the seeds' random draws stayed as they were.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal
from typing import Any, Final

from tests.oracle.model import MINOR, zone

ZONES: Final = (
    "UTC", "America/New_York", "Europe/London", "Australia/Lord_Howe", "Asia/Kathmandu",
    "Asia/Kolkata", "Asia/Shanghai", "Pacific/Chatham", "America/St_Johns", "Pacific/Kiritimati",
    "America/Vancouver", "Asia/Tehran", "Pacific/Apia", "Europe/Berlin", "America/Sao_Paulo",
)  # fmt: skip
WINDOWS: Final = ("transaction", "minute", "hour", "day", "week", "month", "year", "lifetime")
CURRENCIES: Final = ("CNY", "USD", "JPY", "KWD")
OFFSETS: Final = (
    "Z", "+00:00", "+08:00", "-05:00", "+05:45", "+05:30", "+14:00", "-11:00", "+13:45",
    "-03:30", "+01:00", "-09:30", "+10:30", "-23:59", "+23:59",
)  # fmt: skip
SCALE: Final = {"minute": 1, "hour": 2, "day": 3, "week": 5, "month": 6, "year": 8, "lifetime": 10}
SCOPES: Final[list[Any]] = [
    "account_id",
    ["account_id"],
    "card_id",
    ["account_id", "card_id"],
    "merchant_id",
    ["merchant_id", "channel"],
    ["card_id", "mcc"],
    None,
    None,
]
MATCHES: Final[list[dict[str, list[Any]] | None]] = [
    None,
    None,
    None,
    {"channel": ["atm"]},
    {"channel": ["pos", "web"]},
    {"mcc": [6011, "5411"]},
    {"mcc": [6011]},
    {"channel": ["atm"], "mcc": [6011]},
    {"account_id": ["acct-0", "acct-1"]},
    {"currency": ["USD", "JPY"]},
    {"mcc": [6011.0, 742]},
    {"card_id": [77]},
    {"merchant_id": ["m-1"], "channel": ["web", "atm"]},
    {"mcc": ["0742", "5411"]},
]
BY_AMOUNT: Final[tuple[list[Any], list[dict[str, list[Any]] | None]]] = (
    [["card_id", "amount"], ["account_id", "amount"]],  # "the same amount again"
    [{"amount": ["10.00", 25, "50"]}, {"amount": ["1", "20.0"]}],
)
"""Scopes and matches by ``amount`` (by its value, however written), which a case of
``case(seed, by_amount=True)`` draws among the others; apart, so that the cases of the
seeds other tests fix stay as they were, and with them the outcomes they reach."""
DST_CHANGES: Final = (  # UTC instants
    datetime(2026, 3, 8, 7, 0, tzinfo=UTC),  # New York springs forward
    datetime(2026, 11, 1, 6, 0, tzinfo=UTC),  # New York falls back
    datetime(2026, 11, 1, 5, 30, tzinfo=UTC),  # New York's first 01:30
    datetime(2026, 3, 29, 1, 0, tzinfo=UTC),  # London
    datetime(2026, 10, 25, 1, 0, tzinfo=UTC),
    datetime(2026, 4, 4, 15, 0, tzinfo=UTC),  # Lord Howe: half an hour
    datetime(2026, 10, 3, 15, 30, tzinfo=UTC),
    datetime(2026, 11, 1, 10, 0, tzinfo=UTC),  # Vancouver, which tzdata 2026 changed
    datetime(2026, 11, 8, 12, 0, tzinfo=UTC),
)
LOCAL_MIDNIGHTS: Final = (  # year, ISO week, month and leap-day ends
    (2026, 1, 1), (2027, 1, 1), (2027, 1, 4), (2026, 12, 28), (2027, 1, 3), (2026, 1, 5),
    (2025, 12, 29), (2026, 5, 1), (2026, 3, 1), (2028, 2, 29), (2028, 3, 1), (2024, 2, 29),
    (2026, 7, 1), (2021, 1, 4), (2020, 12, 31), (2026, 6, 15),
)  # fmt: skip


@dataclass(frozen=True)
class Case:
    rules: list[dict[str, Any]]
    lines: list[str]

    def rules_text(self) -> str:
        """The rules file (JSON is YAML too)."""
        return json.dumps({"rules": self.rules}, indent=1)


@dataclass(frozen=True)
class Sent:
    """An event line written, for resends and reversals to refer to."""

    event_id: str
    account_id: str
    pairs: list[tuple[str, str]]  # (member, JSON text), as rendered
    instant: datetime
    currency: str | None = None  # payments only
    units: int | None = None


@dataclass(frozen=True)
class Clock:
    """A store's clock for a case decided in batches, and the retentions to keep by it."""

    bucket_days: float
    event_days: float
    times: list[int]  # epoch s, one per batch, never going back

    @property
    def retention(self) -> tuple[int, int]:
        """The retentions in seconds (bucket, event), as ``tests.oracle.model`` takes them."""
        return int(self.bucket_days * 86_400), int(self.event_days * 86_400)

    @property
    def query(self) -> str:
        """The retentions as a store URL gives them."""
        return f"bucket_retention_days={self.bucket_days}&event_retention_days={self.event_days}"


def clock(seed: int, batches: int, start: int) -> Clock:
    """Retentions of hours to days and a clock for ``batches`` batches from about
    ``start``: mostly minutes between batches, now and then hours or days, so that buckets
    and records expire within a case. A function of the seed alone, drawn apart from the
    case's own draws (which stay as they were)."""
    rnd = random.Random(f"clock {seed}")
    bucket_days = rnd.choice((0.25, 0.5, 1, 2))
    event_days = rnd.choice((0.25, 0.5, 1, 2, 3))
    now = start - rnd.randint(0, 7_200)
    times = []
    for _ in range(batches):
        times.append(now)
        r = rnd.random()
        if r < 0.7:
            now += rnd.randint(0, 1_200)
        elif r < 0.9:
            now += rnd.randint(3_600, 8 * 3_600)
        else:
            now += rnd.randint(86_400, 3 * 86_400)
    return Clock(bucket_days, event_days, times)


def changed(seed: int, rules: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``rules`` changed in place as README *Changing rules* allows, for a second run on
    the same store: limits raised or lowered (to 0 now and then, or under what is used),
    ``match`` changed, a window moved to another (not of or to ``transaction``), rules
    removed, and copies of some under new ids. Never a zone, a currency or a scope: a
    store refuses those under the same id. A function of the seed alone."""
    rnd = random.Random(f"changed {seed}")
    out = []
    for rule in rules:
        r = rnd.random()
        if r < 0.15:
            continue  # removed
        new = dict(rule)
        if r < 0.45:
            factor = rnd.choice((0, 0.5, 0.5, 2, 3))
            if "max_count" in new:
                new["max_count"] = int(new["max_count"] * factor)
            if "max_amount" in new:
                amount = Decimal(new["max_amount"])
                minor = MINOR[new["currency"]]
                new["max_amount"] = (
                    f"{(amount * Decimal(factor)).quantize(Decimal(1).scaleb(-minor))}"
                )
        elif r < 0.65 and new["window"] != "transaction":
            new["window"] = rnd.choice([w for w in WINDOWS[1:] if w != new["window"]])
        elif r < 0.75:
            match = rnd.choice(MATCHES)
            if match is None:
                new.pop("match", None)
            else:
                new["match"] = match
        out.append(new)
    for i in range(rnd.randint(0 if out != rules else 1, 2)):  # new ids count from zero
        out.insert(rnd.randint(0, len(out)), {**rnd.choice(rules), "id": f"new{i}"})
    return out


def case(seed: int, events: int | None = None, *, by_amount: bool = False) -> Case:
    """The case of ``seed``: a rules file and ``events`` lines (by default 100-250);
    ``by_amount``: some rules scope or match by the amount (``BY_AMOUNT``)."""
    return _Generator(random.Random(seed), by_amount).case(events)


def _by_amount(rule: dict[str, Any]) -> bool:
    """Whether ``rule`` scopes or matches by the amount."""
    return "amount" in rule.get("scope", ()) or "amount" in (rule.get("match") or {})


class _Generator:
    def __init__(self, rnd: random.Random, by_amount: bool = False) -> None:
        self.rnd = rnd
        self.scopes = [*SCOPES, *BY_AMOUNT[0]] if by_amount else SCOPES
        self.matches = [*MATCHES, *BY_AMOUNT[1]] if by_amount else MATCHES
        self.zones = rnd.sample(ZONES, rnd.randint(2, 5))
        self.currencies = rnd.sample(CURRENCIES, rnd.randint(1, 3))
        self.rule_docs = self.rules()
        if by_amount and not any(_by_amount(rule) for rule in self.rule_docs):
            self.rule_docs[0]["scope"] = BY_AMOUNT[0][0]  # one at least (no draw: the same case)
        self.anchors = rnd.sample(self.all_anchors(), 6)
        self.accounts = [f"acct-{i}" for i in range(rnd.randint(2, 4))]
        self.anchor = rnd.choice(self.anchors)
        self.time = self.anchor + timedelta(seconds=rnd.randint(-600, 600))
        self.last_id = 0

    def new_id(self) -> str:
        self.last_id += 1
        return f"e{self.last_id}"

    def case(self, events: int | None) -> Case:
        rnd = self.rnd
        lines: list[str] = []
        payments: list[Sent] = []
        sent: list[Sent] = []
        for _ in range(rnd.randint(100, 250) if events is None else events):
            r = rnd.random()
            if r < 0.03:
                lines.append(rnd.choice(["", "   ", "\t", " \t "]))
                continue
            if r < 0.62 or not payments:
                payment = self.payment()
                payments.append(payment)
                sent.append(payment)
                lines.append(self.render(payment.pairs, shuffle=rnd.random() < 0.3))
            elif r < 0.80:
                reversal = self.reversal(payments, sent)
                sent.append(reversal)
                lines.append(self.render(reversal.pairs, shuffle=rnd.random() < 0.3))
            elif r < 0.93:
                lines.append(self.resend(rnd.choice(sent[-30:])))
            else:
                lines.append(self.invalid([s.event_id for s in sent]))
        return Case(self.rule_docs, lines)

    def rules(self) -> list[dict[str, Any]]:
        rnd = self.rnd
        rules = []
        for i in range(rnd.randint(3, 8) if rnd.random() < 0.6 else rnd.randint(15, 40)):
            window = rnd.choice(WINDOWS)
            rule: dict[str, Any] = {"id": f"r{i}.{window}_{rnd.randrange(100)}"}
            scope = rnd.choice(self.scopes)
            if scope is not None:
                rule["scope"] = scope
            rule["window"] = window
            tz = rnd.choice([*self.zones, None])
            if tz is not None:
                rule["timezone"] = tz
            currency = rnd.choice([*self.currencies, None, None])
            if window == "transaction" and currency is None:
                currency = rnd.choice(self.currencies)  # a transaction rule limits an amount
            if currency:
                rule["currency"] = currency
            scale = SCALE.get(window, 1)
            if window != "transaction" and (currency is None or rnd.random() < 0.6):
                rule["max_count"] = 0 if rnd.random() < 0.03 else rnd.choice([1, 2, 3]) * scale
            if currency and (
                window == "transaction" or "max_count" not in rule or rnd.random() < 0.7
            ):
                minor = MINOR[currency]
                base = 0 if rnd.random() < 0.03 else rnd.choice([10, 30, 50, 60, 100, 100, 200])
                units = base * scale * 10**minor
                if minor and rnd.random() < 0.2:
                    units += 5
                rule["max_amount"] = f"{Decimal(units).scaleb(-minor):.{minor}f}"
            match = rnd.choice(self.matches)
            if match:
                rule["match"] = match
            rules.append(rule)
        return rules

    def all_anchors(self) -> list[datetime]:
        out = list(DST_CHANGES)
        for name in self.zones:
            for y, m, d in self.rnd.sample(LOCAL_MIDNIGHTS, 5):
                out.append(datetime(y, m, d, tzinfo=zone(name)).astimezone(UTC))
            hour = self.rnd.randrange(24)
            out.append(datetime(2026, 3, 14, hour, tzinfo=zone(name)).astimezone(UTC))
        return out

    def next_time(self) -> datetime:
        """Mostly forward in small steps, sometimes back (out of order) or to an anchor."""
        rnd = self.rnd
        r = rnd.random()
        if r < 0.08:
            self.anchor = rnd.choice(self.anchors)
            self.time = self.anchor + timedelta(seconds=rnd.randint(-3600, 600))
        elif r < 0.5:
            micro = rnd.choice([0, 0, 0, 500000, 123456])
            self.time += timedelta(seconds=rnd.randint(0, 40), microseconds=micro)
        elif r < 0.8:
            self.time += timedelta(seconds=rnd.randint(30, 1800))
        elif r < 0.9:
            self.time -= timedelta(seconds=rnd.randint(0, 3600))
        else:
            self.time = self.anchor + timedelta(seconds=rnd.randint(-120, 120))
        return self.time

    def payment(self) -> Sent:
        rnd = self.rnd
        account = rnd.choice(self.accounts)
        currency = rnd.choice([*self.currencies, rnd.choice(CURRENCIES)])
        minor = MINOR[currency]
        units = rnd.choice([1, 5, 10, 10, 20, 25, 30, 50, 50, 100]) * 10**minor
        if minor and rnd.random() < 0.25:
            units += rnd.choice([1, 5, 50, 10**minor // 2])
        instant = self.next_time()
        event_id = self.new_id()
        pairs = [("event_id", json.dumps(event_id))]
        if rnd.random() < 0.3:
            pairs.append(("type", '"payment"'))
        pairs.append(("account_id", json.dumps(account)))
        c = rnd.random()
        if c < 0.75:  # card 77 as a number or a string: scope and match values by value
            card = rnd.choice([f"card-{account[-1]}{j}" for j in range(2)] + ["77"])
            numeric = rnd.choice(["77", "77.0", '"77"'])
            pairs.append(("card_id", numeric if card == "77" else json.dumps(card)))
        elif c < 0.85:
            pairs.append(("card_id", "null"))
        if rnd.random() < 0.85:
            pairs.append(("merchant_id", json.dumps(rnd.choice(["m-1", "m-2", "m-3"]))))
        if rnd.random() < 0.9:
            pairs.append(("channel", json.dumps(rnd.choice(["pos", "atm", "web", "atm"]))))
        if rnd.random() < 0.6:
            mcc = ["6011", "6011.0", '"6011"', "5411", '"5411"', '"0742"', "742"]
            pairs.append(("mcc", rnd.choice(mcc)))
        pairs += [
            ("amount", self.amount(units, minor)),
            ("currency", json.dumps(currency)),
            ("occurred_at", json.dumps(self.time_text(instant))),
        ]
        return Sent(event_id, account, pairs, instant, currency, units)

    def reversal(self, payments: list[Sent], sent: list[Sent]) -> Sent:
        rnd = self.rnd
        original = rnd.choice(payments[-15:] if rnd.random() < 0.7 else payments)
        assert original.currency is not None and original.units is not None
        account, original_id = original.account_id, original.event_id
        k = rnd.random()
        if k < 0.08:
            account = rnd.choice(self.accounts)  # maybe another account's payment
        elif k < 0.13:
            original_id = f"nope-{rnd.randrange(5)}"
        elif k < 0.18:
            original_id = rnd.choice(sent).event_id  # maybe a reversal
        elif k < 0.22:
            original_id = f"e{self.last_id + rnd.randint(2, 6)}"  # an id still to come
        event_id = self.new_id()
        instant = self.next_time()
        pairs = [
            ("event_id", json.dumps(event_id)),
            ("type", '"reversal"'),
            ("account_id", json.dumps(account)),
            ("original_event_id", json.dumps(original_id)),
        ]
        a = rnd.random()
        minor = MINOR[original.currency]
        if original_id != original.event_id:
            # whatever the original turns out to be, whole units are in its currency
            if a >= 0.5:
                n = rnd.randint(1, 30)
                # a form by the number, not by a draw: the seeds' cases stay as they were
                forms = (json.dumps(str(n)), json.dumps(f"{n}e1"), f"{n}.0", f"{n}E1")
                pairs.append(("amount", forms[n % 4]))
        elif a >= 0.5:
            if a < 0.85:
                units = max(1, original.units // rnd.choice([2, 3, 4, 1]))
            else:
                units = original.units + 10**minor  # more than the original
            # by the event's number, not by a draw, so that the seeds' random streams stay
            # as they were: now and then a digit finer than the original's currency, or
            # another currency named than the original's (an invalid_event, if the
            # original is found)
            finer = self.last_id % 5 == 0
            amount = Decimal(units).scaleb(-minor) + Decimal(5).scaleb(-minor - 1)
            pairs.append(
                ("amount", json.dumps(str(amount)) if finer else self.amount(units, minor))
            )
            if rnd.random() < 0.5:
                currency = original.currency
                if self.last_id % 7 == 0:  # one whose digits the amount fits (none for KWD)
                    others = (c for c in CURRENCIES if c != currency and MINOR[c] >= minor)
                    currency = next(others, currency)
                pairs.append(("currency", json.dumps(currency)))
        if rnd.random() < 0.3 and all(name != "currency" for name, _ in pairs):
            pairs.append(("currency", "null"))  # the same as none
        pairs.append(("occurred_at", json.dumps(self.time_text(instant))))
        return Sent(event_id, account, pairs, instant)

    def resend(self, source: Sent) -> str:
        """``source`` again: as it was, reformatted (the same payload) or changed."""
        rnd = self.rnd
        k = rnd.random()
        if k < 0.3:
            return self.render(source.pairs)
        if k < 0.65:
            pairs = []
            for name, value in source.pairs:
                if name == "type" and value == '"payment"' and rnd.random() < 0.5:
                    continue
                if name == "amount" and source.units is not None:
                    assert source.currency is not None
                    value = self.amount(source.units, MINOR[source.currency])
                elif name == "occurred_at":
                    value = json.dumps(self.time_text(source.instant))
                elif name == "mcc" and value in ("6011", "6011.0"):
                    value = rnd.choice(["6011", "6011.0", "6.011e3"])
                elif name == "card_id" and value in ("77", "77.0"):
                    value = rnd.choice(["77", "77.0", "7.7e1"])
                pairs.append((name, value))
            has_type = any(name == "type" for name, _ in pairs)
            if source.units is not None and not has_type and rnd.random() < 0.3:
                pairs.insert(1, ("type", '"payment"'))
            return self.render(pairs, shuffle=True)
        pairs = list(source.pairs)
        c = rnd.random()
        if c < 0.3 and source.units is not None:
            assert source.currency is not None
            changed = self.amount(source.units + 1, MINOR[source.currency])
            pairs = [(n, changed if n == "amount" else v) for n, v in pairs]
        elif c < 0.5:
            changed = json.dumps(self.time_text(source.instant + timedelta(seconds=1)))
            pairs = [(n, changed if n == "occurred_at" else v) for n, v in pairs]
        elif c < 0.7:
            pairs.append(("note", '"x"'))
        elif c < 0.85 and any(n == "card_id" for n, _ in pairs):
            # a card becomes null, a null card goes missing: both a different payload
            pairs = [
                (n, "null" if n == "card_id" else v)
                for n, v in pairs
                if not (n == "card_id" and v == "null")
            ]
        else:
            changed = json.dumps(rnd.choice(self.accounts) + "x")
            pairs = [(n, changed if n == "account_id" else v) for n, v in pairs]
        return self.render(pairs, shuffle=rnd.random() < 0.5)

    def invalid(self, ids: list[str]) -> str:
        """A line that is not JSON or not a valid event (sometimes under a seen id)."""
        rnd = self.rnd
        event_id = rnd.choice([self.new_id(), self.new_id(), rnd.choice(ids or ["e1"])])
        doc = {
            "event_id": json.dumps(event_id),
            "account_id": '"acct-0"',
            "amount": '"10.00"',
            "currency": '"USD"',
            "occurred_at": '"2026-03-14T10:00:00+08:00"',
        }
        k = rnd.randrange(18)
        if k == 0:
            return rnd.choice(["this is not json", "{", '{"event_id": "x", ', "nul", "{'a': 1}"])
        if k < 6:
            del doc[["event_id", "account_id", "amount", "currency", "occurred_at"][k - 1]]
        elif k == 6:
            doc["occurred_at"] = json.dumps(
                rnd.choice(
                    [
                        "2026-03-14T10:00:00",
                        "2026-03-14T10:00:00+08:60",
                        "2026-02-29T10:00:00Z",
                        "2026-03-14T24:00:00Z",
                        "2026-03-14",
                        "yesterday",
                    ]
                )
            )
        elif k == 7:
            amounts = ['"10.005"', "10.005", '"0"', "0", '"-5"', "-5", '"abc"', '"1_000"', "true"]
            doc["amount"] = rnd.choice(amounts)
        elif k == 8:
            doc["currency"] = rnd.choice(['"QQQ"', '"usdx"', "5"])
        elif k == 9:
            doc["currency"], doc["amount"] = '"JPY"', rnd.choice(['"1.5"', "0.1"])
        elif k == 10:
            doc["currency"], doc["amount"] = '"KWD"', rnd.choice(['"0.0001"', '"1.2345"'])
        elif k == 11:
            doc["type"] = rnd.choice(['"refund"', "null", '"Payment"'])
        elif k == 12:
            doc["event_id"] = rnd.choice(['""', json.dumps("x" * 129), "5"])
        elif k == 13:
            doc["account_id"] = rnd.choice(['""', json.dumps("a" * 129), "null"])
        elif k == 14:  # a reversal of nothing
            doc["type"] = '"reversal"'
            del doc["amount"]
        elif k == 15:  # a member named twice
            return self.render([*doc.items(), ("amount", '"9000.00"')])
        elif k == 16:
            doc["type"] = '"reversal"'
            doc["original_event_id"] = json.dumps(rnd.choice(ids or ["e1"]))
            doc["amount"] = rnd.choice(['"0"', '"-1"'])
        else:
            doc["amount"] = '"12345678901234.00"'  # 16 digits in minor units
        return self.render(list(doc.items()))

    def amount(self, units: int, minor: int) -> str:
        """``units`` as JSON text: a string or a number, trimmed, padded or with an exponent."""
        value = Decimal(units).scaleb(-minor)
        exact = f"{value:.{minor}f}"
        trimmed = format(value.normalize(), "f")
        forms = [json.dumps(exact)] * 3 + [
            json.dumps(trimmed),
            json.dumps(f"{value:.{minor + 1}f}"),
            trimmed,
            exact,
        ]
        if units % 10 == 0:
            forms.append(json.dumps(f"{value.normalize():e}"))
        return self.rnd.choice(forms)

    def time_text(self, instant: datetime) -> str:
        """``instant`` in RFC 3339 with a zone's offset, a fixed one or UTC."""
        rnd = self.rnd
        r = rnd.random()
        offset: timedelta | None = None
        if r < 0.35:
            offset = instant.astimezone(zone(rnd.choice(self.zones))).utcoffset()
        elif r >= 0.55:
            text = rnd.choice(OFFSETS)
            if text != "Z":
                sign = 1 if text[0] == "+" else -1
                offset = sign * timedelta(hours=int(text[1:3]), minutes=int(text[4:6]))
        if offset is None:
            local = instant.astimezone(UTC)
            suffix = rnd.choice(["Z", "Z", "+00:00"])
        else:
            local = instant.astimezone(timezone(offset))
            minutes = int(offset.total_seconds()) // 60
            suffix = (
                f"{'+' if minutes >= 0 else '-'}{abs(minutes) // 60:02d}:{abs(minutes) % 60:02d}"
            )
        if local.microsecond:
            fraction = f".{local.microsecond:06d}"
            if local.microsecond % 1000 == 0 and rnd.random() < 0.5:
                fraction = f".{local.microsecond // 1000:03d}"
        else:
            fraction = rnd.choice(["", "", "", ".0", ".000"])
        return local.strftime("%Y-%m-%dT%H:%M:%S") + fraction + suffix

    def render(self, pairs: list[tuple[str, str]], shuffle: bool = False) -> str:
        """A JSON object from (member, JSON text) pairs, compact or spaced."""
        if shuffle:
            pairs = list(pairs)
            self.rnd.shuffle(pairs)
        sep, colon = (", ", ": ") if self.rnd.random() < 0.5 else (",", ":")
        return "{" + sep.join(json.dumps(k) + colon + v for k, v in pairs) + "}"
