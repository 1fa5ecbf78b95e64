"""The decision core: accept or reject each event, all-or-nothing across every limit.

Pure: no I/O, no clock. ``Decider.plan`` says which records an event needs, the caller
loads them into a ``WorkingState``, and ``Decider.decide`` changes that state in place
and returns the outcome. Events are decided in input order on their own time.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from typing import Final, NamedTuple

import msgspec

from handlers.periods import PeriodClock, Periods, clock_for, window_of
from handlers.state import Bucket, EventRecord, Keys, WorkingState
from schemas.amounts import TEXT_DIGITS, AmountError, format_minor, to_minor
from schemas.currencies import MINOR_UNITS
from schemas.events import DeadLetterError, Event, EventRejected, EventType
from schemas.rules import Rule, RuleSet, Window, scalar_text
from schemas.verdicts import (
    Decision,
    LimitState,
    Metric,
    Reason,
    Verdict,
    Violation,
    verdict_encoder,
)


def escape(value: str) -> str:
    """Make a scope value safe inside a bucket key."""
    if "|" in value or "\\" in value:
        return value.replace("\\", "\\\\").replace("|", "\\|")
    return value


def bucket_key(rule_id: str, period: str, scope_values: Iterable[str]) -> str:
    """``rule|period|value…``: rule ids and periods never contain ``|``."""
    return "|".join((rule_id, period, *(escape(v) for v in scope_values)))


def split_bucket_key(key: str) -> tuple[str, str]:
    """The rule id and period of a bucket key."""
    rule_id, period, _ = key.split("|", 2)
    return rule_id, period


try:
    from handlers import _fastcore
except ImportError:  # built without a C compiler: the Python below is the whole core
    _fastcore = None  # type: ignore[assignment]


_ABSENT_AS: Final = {"type": EventType.PAYMENT.value}
"""What a field a rule scopes or matches by means when an event leaves it out: a payment
need not say that it is one. (Only payments are planned.)"""


class _CompiledRule:
    """A rule plus what the hot path needs precomputed."""

    __slots__ = (
        "absent_as",
        "amount_exp",
        "clock",
        "count_limit_text",
        "currency",
        "fast",
        "fixed_period",
        "match",
        "max_amount",
        "max_amount_text",
        "max_count",
        "prefix",
        "rule",
        "scope",
        "scope_fields",
        "simple_scope",
        "window",
    )

    def __init__(self, rule: Rule) -> None:
        self.rule = rule
        self.window = rule.window
        self.currency = rule.currency
        self.scope = rule.scope
        self.simple_scope = rule.scope[0] if len(rule.scope) == 1 else None
        self.match = tuple((name, allowed, _ABSENT_AS.get(name)) for name, allowed in rule.match)
        self.scope_fields = tuple((name, _ABSENT_AS.get(name)) for name in rule.scope)
        self.absent_as = self.scope_fields[0][1]
        self.max_count = rule.max_count
        self.max_amount = rule.max_amount
        self.amount_exp = MINOR_UNITS[rule.currency] if rule.currency else None
        self.clock = clock_for(rule.timezone)
        self.fixed_period = (
            rule.window.value if rule.window in (Window.TRANSACTION, Window.LIFETIME) else None
        )
        """The one period of a window that has one, which needs no clock."""
        self.prefix = rule.id + "|"
        self.count_limit_text = None if rule.max_count is None else str(rule.max_count)
        self.max_amount_text = (
            None
            if rule.max_amount is None or self.amount_exp is None
            else format_minor(rule.max_amount, self.amount_exp)
        )
        self.fast: object = None
        """This rule in the compiled path (``handlers._fastcore``), when it is used."""


INDEX_FROM: Final = 8
"""Rules that can apply to one currency's events from which its events' candidates are
found by the ``RuleIndex``; fewer are tested in turn, faster than a lookup per indexed
field would be."""


class RuleIndex:
    """The rules that may apply to an event, found by its currency and ``match`` values
    instead of every rule tested in turn: a file of thousands of rules by MCC or merchant,
    each applying to few events, costs a dict lookup per indexed field, not a test per
    rule.

    Each rule with a ``match`` is filed, under its currency (or none), by every allowed
    value of one of its match fields (the one whose values are the fewest part of all the
    values rules allow for it); rules without a match are filed by currency alone. An
    event's candidates are those of no currency and of its own, filed under its values
    or without a match, in file order. A rule left out has another currency, or a match
    field whose event value it does not allow, so it would not apply: the candidates
    apply or not exactly as they would if all were tested. One index serves every
    currency (an issuer's 5,000 rules of no currency and one cap of each of 150
    currencies: one index, not 150 of ~8 MiB each). Only where a rule tested in turn
    could say more, a field rules scope by holding a list, an object or a number no text
    stands for (which it refuses), are all rules tested."""

    __slots__ = ("always", "scoped", "tables")

    def __init__(self, rules: Sequence[_CompiledRule]) -> None:
        values: dict[str, set[str]] = {}
        for c in rules:
            for name, allowed, _ in c.match:
                values.setdefault(name, set()).update(allowed)
        always: dict[str | None, list[int]] = {}
        tables: dict[tuple[str, str | None], dict[str | None, dict[str, list[int]]]] = {}
        for position, c in enumerate(rules):
            if not c.match:
                always.setdefault(c.currency, []).append(position)
                continue
            name, allowed, absent = min(c.match, key=lambda m: len(m[1]) / len(values[m[0]]))
            table = tables.setdefault((name, absent), {}).setdefault(c.currency, {})
            for value in allowed:
                table.setdefault(value, []).append(position)
        self.always: Final = {currency: tuple(filed) for currency, filed in always.items()}
        """Positions of the rules without a ``match``, by currency (None: of none)."""
        self.tables: Final = tuple(
            (
                name,
                absent,
                {
                    currency: {value: tuple(filed) for value, filed in table.items()}
                    for currency, table in by_currency.items()
                },
            )
            for (name, absent), by_currency in tables.items()
        )
        """Per indexed field: its name, what its absence means, and by currency (None: of
        none) the positions of the rules filed under each value."""
        self.scoped: Final = tuple(sorted({name for c in rules for name in c.scope}))
        """Every field the rules scope by."""

    def select(self, fields: dict[str, object], currency: str) -> list[int] | None:
        """Positions of the rules that may apply to an event of this currency and these
        fields, in order; None for all of them (a field the rules scope by holds what
        they refuse)."""
        for name in self.scoped:
            value = fields.get(name)
            if value is not None and type(value) is not str and scalar_text(value) is None:
                return None
        found = [*self.always.get(None, ()), *self.always.get(currency, ())]
        for name, absent, by_currency in self.tables:
            value = fields.get(name, absent)
            text = value if type(value) is str else scalar_text(value)
            if text is None:
                continue
            for table in (by_currency.get(None), by_currency.get(currency)):
                filed = table.get(text) if table is not None else None
                if filed is not None:
                    found += filed
        found.sort()
        return found

    def most(self, currency: str | None) -> int:
        """Most rules that may apply to one event of this currency (None: of one no rule
        names): those of no currency and of its own without a match, and for each
        indexed field those filed under the one value that files most. An upper bound:
        a rule with several match fields is counted by the one it is filed by."""
        owners = (None,) if currency is None else (None, currency)
        total = sum(len(self.always.get(owner, ())) for owner in owners)
        for _, _, by_currency in self.tables:
            tables = [by_currency.get(owner, {}) for owner in owners]
            values = set().union(*tables)
            total += max((sum(len(t.get(v, ())) for t in tables) for v in values), default=0)
        return total


class Applied(NamedTuple):
    """A rule that applies to an event, with the event's bucket for it."""

    rule: _CompiledRule
    period: str
    key: str | None
    """None for a ``transaction`` window, which keeps no bucket."""
    period_end: int | None


class OutcomeKind(enum.Enum):
    """What happened to one event."""

    VERDICT = "verdict"
    DUPLICATE = "duplicate"
    DEAD_LETTER = "dead_letter"

    # Counted per result in every batch (engine, metrics): Enum's own __hash__ is
    # Python code (hash of the name), ~0.3 us a call. A member equals only itself, so
    # the identity hash agrees with equality.
    __hash__ = object.__hash__


class Outcome(NamedTuple):
    """The result of deciding one event."""

    kind: OutcomeKind
    verdict: bytes | None
    """The encoded verdict (the original's, for a duplicate)."""
    decision: Decision | None
    reason: Reason | None
    error: DeadLetterError | None = None
    detail: str | None = None


_EMPTY: Final[tuple[Applied, ...]] = ()
MAX_KEY_BYTES: Final = 1024
"""Longest bucket key, UTF-8 (DynamoDB refuses partition keys over 2,048 bytes): an event
whose scope values make a longer one is invalid, not a store error on every retry."""
_SHORT_KEY: Final = MAX_KEY_BYTES // 4
"""Keys of at most this many characters are short enough in any encoding."""
AMOUNT_CEILING: Final = 2**63 - 1
"""A bucket's amount stops here (every store keeps 64-bit integers). Only a bucket of a
rule without ``max_amount`` can get there (amounts have at most 15 digits, limits too),
after ~9,000 payments of the largest amount; its ``used`` is then only explanatory."""
MAX_APPLICABLE_RULES: Final = 200
"""Most rules that may apply to one event. Its verdict explains each (up to ~650 bytes
with a 64-character rule id and two violations) and its idempotency record keeps each
bucket key (up to ``MAX_KEY_BYTES``): 200 keep the verdict far inside one Kafka message
and the record inside a DynamoDB item (400 KB). A store may allow fewer
(``Decider.records_needed`` against ``Store.max_records_per_commit``)."""
_new_tuple: Final = tuple.__new__
_NO_PERIODS: Final[Periods] = ({}, {})


class Decider:
    """Decides events against one rule set."""

    def __init__(self, rules: RuleSet, *, compiled: bool = True) -> None:
        self.rules = rules
        self._compiled = tuple(_CompiledRule(rule) for rule in rules.rules)
        self._by_id = {c.rule.id: c for c in self._compiled}
        self._by_currency: dict[str, tuple[tuple[_CompiledRule, ...], RuleIndex | None]] = {}
        """Rules that can apply to events of a currency, and their index when they have
        one, filled on first sight."""
        self._index: RuleIndex | None = None
        """The index of every rule, made here when any currency's candidates use it."""
        # made now, not by the first event that needs it: 0.45 s at 5,000 rules of 200
        # MCCs, which the first batch of `run` waited for once it reported ready
        for currency in {c.currency for c in self._compiled}:
            self._index_for([c for c in self._compiled if c.currency in (None, currency)])
        self._fast = (
            _fastcore.FastCore(
                self._compiled,
                rules.version,
                Applied,
                Outcome,
                OutcomeKind.VERDICT,
                escape,
                _SHORT_KEY,
                AMOUNT_CEILING,
                self._plan,
                self._decide,
                self._payment,
                OutcomeKind.DUPLICATE,
                _reason_in,
                self._index_for,
            )
            if compiled and _fastcore is not None
            else None
        )
        """The compiled payment path, when the extension is built and ``compiled``; it
        hands anything unusual back to the Python path, which decides it the same way."""
        if self._fast is not None:
            # the compiled methods themselves, with no Python frame per event before them
            self.plan = self._fast.plan  # type: ignore[method-assign]
            self.decide = self._fast.decide  # type: ignore[method-assign]
            self.keys = _fastcore.keys  # type: ignore[method-assign]

    @property
    def compiled(self) -> bool:
        """Whether payments take the compiled path."""
        return self._fast is not None

    # -- planning -------------------------------------------------------------------------

    def plan(self, event: Event) -> tuple[Applied, ...]:
        """The rules that apply to a payment, with its bucket for each.

        Raises ``EventRejected`` when a field a rule scopes by is not a scalar, or makes
        the bucket key longer than ``MAX_KEY_BYTES``. (On the compiled path an instance's
        ``plan`` is ``FastCore.plan``, which hands what it does not take to ``_plan``.)
        """
        if event.type is not EventType.PAYMENT:
            return _EMPTY
        fields = event.fields
        applied: list[Applied] = []
        found = self._by_currency.get(event.currency or "")
        if found is None:
            rules = tuple(c for c in self._compiled if c.currency in (None, event.currency))
            found = self._by_currency[event.currency or ""] = (rules, self._index_for(rules))
        candidates: Sequence[_CompiledRule] = found[0]
        if found[1] is not None and event.currency is not None:
            chosen = found[1].select(fields, event.currency)
            if chosen is not None:
                candidates = [self._compiled[position] for position in chosen]
        epoch = event.epoch
        last_clock: PeriodClock | None = None
        periods, ends = _NO_PERIODS
        for c in candidates:
            name = c.simple_scope
            if name is not None:
                raw = fields.get(name, c.absent_as)
                if raw is None:
                    continue
                value = raw if type(raw) is str else _scope_text(name, raw)
                tail = value if "|" not in value and "\\" not in value else escape(value)
            else:
                scoped = [fields.get(field, absent) for field, absent in c.scope_fields]
                if any(v is None for v in scoped):
                    continue
                tail = "|".join(
                    [escape(_scope_text(n, v)) for n, v in zip(c.scope, scoped, strict=True)]
                )
            if c.match and not _matches(c.match, fields):
                continue
            period = c.fixed_period
            end = None  # lifetime: never ends; transaction: no bucket
            if period is None:
                clock = c.clock
                if clock is not last_clock:  # rules of one zone share the event's keys
                    (periods, ends), last_clock = clock.periods(epoch), clock
                period = periods[c.window]
                end = ends[c.window]
            # tuple.__new__ skips NamedTuple's Python-level constructor: 5x cheaper per rule
            if c.window is Window.TRANSACTION:
                applied.append(_new_tuple(Applied, (c, period, None, None)))
            else:
                key = c.prefix + period + "|" + tail
                if len(key) > _SHORT_KEY and len(key.encode()) > MAX_KEY_BYTES:
                    raise EventRejected(
                        DeadLetterError.INVALID_EVENT,
                        f"{', '.join(c.scope)}: too long to count under rule {c.rule.id!r}"
                        f" (a bucket key has at most {MAX_KEY_BYTES} bytes)",
                    )
                applied.append(_new_tuple(Applied, (c, period, key, end)))
        return tuple(applied)

    _plan = plan
    """The Python path's ``plan``, also where an instance's ``plan`` is the compiled one."""

    def widest(self) -> int:
        """Most rules that may apply to one event, their ``match`` counted
        (``RuleIndex.most``): what ``limitflow rules check`` warns of."""
        index = self._every_rule()
        currencies = {c.currency for c in self._compiled} | {None}
        return max(index.most(currency) for currency in currencies)

    def _index_for(self, candidates: Sequence[_CompiledRule]) -> RuleIndex | None:
        """The ``RuleIndex`` (of every rule) for a currency with these candidates, or
        None to test them in turn: they are few, or none has a match."""
        if len(candidates) < INDEX_FROM or not any(c.match for c in candidates):
            return None
        return self._every_rule()

    def _every_rule(self) -> RuleIndex:
        """The ``RuleIndex`` of every rule, made once, when first asked for."""
        if self._index is None:
            self._index = RuleIndex(self._compiled)
        return self._index

    @staticmethod
    def keys(events: Sequence[Event], plans: Sequence[tuple[Applied, ...]]) -> Keys:
        """Every record the events need, except the buckets of reversed originals. (On the
        compiled path an instance's ``keys`` is ``handlers._fastcore.keys``, its twin.)"""
        keys = Keys()
        for event, applied in zip(events, plans, strict=True):
            keys.accounts.add(event.account_id)
            keys.events.add(event.event_id)
            if event.original_event_id is not None:
                keys.events.add(event.original_event_id)
            for a in applied:
                if a.key is not None:
                    keys.buckets.add(a.key)
        return keys

    @staticmethod
    def records_needed(event: Event, plan: tuple[Applied, ...], state: WorkingState) -> int:
        """Upper bound of the records deciding ``event`` changes: its buckets (a reversal:
        its original's), its account sequence, its own record and its original's."""
        if event.original_event_id is not None:
            original = state.event(event.original_event_id)
            return 3 + (0 if original is None else len(original.buckets))
        return 3 + sum(1 for a in plan if a.key is not None)

    @staticmethod
    def reversal_keys(events: Sequence[Event], state: WorkingState) -> Keys:
        """The buckets of loaded originals that reversals will release, to be read (again,
        if the batch's payments read them already) now that the originals' records have
        been read.

        A store reads a batch's keys one kind after another, not at one instant: a bucket
        read before another process committed the original there, then the original's
        record read after, made the bucket look as if it never held the payment. The
        reversal released nothing and wrote no bucket, so nothing conditioned its commit
        on it: the payment was marked reversed and stayed counted. Read after the record,
        a bucket holds the payment, or has changed since in a way that the commit's
        condition on the record or the bucket refuses."""
        keys = Keys()
        for event in events:
            if event.original_event_id is None:
                continue
            original = state.event(event.original_event_id)
            if original is not None:
                keys.buckets.update(original.buckets)
        return keys

    # -- deciding -------------------------------------------------------------------------

    def decide(self, event: Event, applied: tuple[Applied, ...], state: WorkingState) -> Outcome:
        """Decide one event, applying its effects to ``state``. (On the compiled path an
        instance's ``decide`` is ``FastCore.decide``, which hands what it does not take to
        ``_decide`` or ``_payment``.)"""
        seen = state.event(event.event_id)
        if seen is not None:
            if seen.fingerprint in (event.fingerprint, event.legacy_fingerprint):
                return Outcome(
                    OutcomeKind.DUPLICATE,
                    seen.verdict,
                    Decision.ACCEPT if seen.accepted else Decision.REJECT,
                    _reason_in(seen.verdict),
                )
            return _dead(
                DeadLetterError.IDEMPOTENCY_CONFLICT,
                f"event_id {event.event_id!r} was already decided with a different payload",
            )
        if event.type is EventType.PAYMENT:
            return self._payment(event, applied, state)
        return self._reversal(event, state)

    _decide = decide
    """The Python path's ``decide``, also where an instance's ``decide`` is the compiled one."""

    def _payment(self, event: Event, applied: tuple[Applied, ...], state: WorkingState) -> Outcome:
        amount = event.amount
        assert amount is not None
        violations: list[Violation] = []
        seen: list[tuple[int, int]] = []  # (count, used) of each applied rule before this event
        found: list[Bucket | None] = []
        buckets = state.snapshot.buckets
        for a in applied:
            c = a.rule
            if a.key is None:  # transaction window: the event alone against the limit
                seen.append((0, 0))
                found.append(None)
                if c.max_amount is not None and amount > c.max_amount:
                    violations.append(
                        Violation(
                            c.rule.id,
                            Metric.AMOUNT,
                            a.period,
                            c.max_amount_text or "",
                            format_minor(0, c.amount_exp or 0),
                        )
                    )
                continue
            bucket = buckets.get(a.key)
            count, used = (bucket.count, bucket.amount) if bucket is not None else (0, 0)
            seen.append((count, used))
            found.append(bucket)
            if c.max_count is not None and count >= c.max_count:
                violations.append(
                    Violation(
                        c.rule.id, Metric.COUNT, a.period, c.count_limit_text or "", str(count)
                    )
                )
            if c.max_amount is not None and used + amount > c.max_amount:
                violations.append(
                    Violation(
                        c.rule.id,
                        Metric.AMOUNT,
                        a.period,
                        c.max_amount_text or "",
                        format_minor(used, c.amount_exp or 0),
                    )
                )
        accepted = not violations
        keys: tuple[str, ...] = ()
        limits: list[LimitState] = []
        if accepted:
            dirty = state.dirty_buckets
            for a, (count, used), bucket in zip(applied, seen, found, strict=True):
                key = a.key
                if key is None:
                    count, used = 1, amount
                else:  # the same work as state.bucket_for_update, without a call per rule
                    count += 1
                    used += amount
                    if used > AMOUNT_CEILING:
                        used = AMOUNT_CEILING
                    if bucket is None:
                        bucket = buckets[key] = Bucket(count, used, 0, a.period_end)
                    else:
                        bucket.count = count
                        bucket.amount = used
                        end = a.period_end
                        if end is not None:  # (an expired bucket reads with none)
                            held = bucket.period_end
                            if held is None or held < end:
                                bucket.period_end = end
                    dirty[key] = bucket
                limits.append(_limit_state(a, count, used))
            keys = tuple(a.key for a in applied if a.key is not None)
            decision, reason = Decision.ACCEPT, None
        else:
            for a, (count, used) in zip(applied, seen, strict=True):
                limits.append(
                    _limit_state(a, 1, amount) if a.key is None else _limit_state(a, count, used)
                )
            decision, reason = Decision.REJECT, Reason.LIMIT_EXCEEDED
        account = state.account_for_update(event.account_id)
        account.seq += 1
        encoded = verdict_encoder.encode(
            Verdict(
                event.event_id,
                event.account_id,
                event.type,
                decision,
                reason,
                account.seq,
                violations,
                event.occurred_at,
                format_minor(amount, MINOR_UNITS[event.currency or ""]),
                event.currency,
                None,
                self.rules.version,
                limits,
            )
        )
        state.put_event(
            event.event_id,
            EventRecord(
                fingerprint=event.fingerprint,
                account_id=event.account_id,
                type=event.type,
                accepted=accepted,
                seq=account.seq,
                verdict=encoded,
                amount=amount if accepted else 0,
                currency=event.currency,
                buckets=keys,
                occurred=event.epoch,
                born=None if keys else (),  # the commit records which life of each bucket
            ),
        )
        return Outcome(OutcomeKind.VERDICT, encoded, decision, reason)

    def _reversal(self, event: Event, state: WorkingState) -> Outcome:
        assert event.original_event_id is not None
        original = state.event(event.original_event_id)
        reason: Reason | None = None
        amount: int | None = None
        currency = event.currency
        if (
            original is None
            or original.type is not EventType.PAYMENT
            or original.account_id != event.account_id
        ):
            reason = Reason.ORIGINAL_NOT_FOUND
        elif not original.accepted:
            reason = Reason.ORIGINAL_NOT_ACCEPTED
            currency = currency or original.currency
            if event.amount_decimal is not None and currency is not None:
                # the original's currency is known now: its precision holds, as for a
                # reversal that names it
                try:
                    amount = to_minor(str(event.amount_decimal), MINOR_UNITS[currency])
                except AmountError as exc:
                    return _dead(DeadLetterError.INVALID_EVENT, f"amount: {exc}")
        else:
            currency = original.currency
            if event.currency is not None and event.currency != original.currency:
                return _dead(
                    DeadLetterError.INVALID_EVENT,
                    f"currency: {event.currency} differs from the original's {original.currency}",
                )
            left = original.amount - original.reversed
            if event.amount is not None:
                amount = event.amount
            elif event.amount_decimal is not None:
                try:
                    amount = to_minor(str(event.amount_decimal), MINOR_UNITS[currency or ""])
                except AmountError as exc:
                    return _dead(DeadLetterError.INVALID_EVENT, f"amount: {exc}")
            else:
                amount = left
            if left <= 0:
                reason = Reason.ALREADY_REVERSED
            elif amount > left:
                reason = Reason.REVERSAL_EXCEEDS_ORIGINAL
        limits: list[LimitState] = []
        released_from: list[str] = []
        """The buckets this reversal releases from: its record lives as long as they do
        (``stores.base.stamp``), so that a resend never releases again."""
        if reason is None and original is not None and amount is not None:
            original.reversed += amount
            fully = original.reversed >= original.amount
            state.touch_event(event.original_event_id)
            born = original.born or ()
            for index, key in enumerate(original.buckets):
                held = state.bucket(key)
                if held is None:
                    released = self._released_state(key, 0, 0)
                elif (held.count == 0 and held.amount == 0) or (
                    index < len(born) and born[index] and held.born != born[index]
                ):
                    # its period expired (reads as empty), nothing is left, or the bucket
                    # expired and started again without this payment (a late payment
                    # of the period): nothing of it to release, and no bucket to write
                    # (an empty one would carry no period end and never expire)
                    released = self._released_state(key, held.count, held.amount)
                else:
                    bucket = state.bucket_for_update(key, None)
                    released_from.append(key)
                    # never let a release go below zero
                    bucket.amount = max(bucket.amount - amount, 0)
                    if fully:
                        bucket.count = max(bucket.count - 1, 0)
                    released = self._released_state(key, bucket.count, bucket.amount)
                if released is not None:
                    limits.append(released)
        if amount is None and event.amount is not None:
            amount = event.amount
        accepted = reason is None
        decision = Decision.ACCEPT if accepted else Decision.REJECT
        account = state.account_for_update(event.account_id)
        account.seq += 1
        shown_amount = _show_amount(amount, currency, event)
        encoded = verdict_encoder.encode(
            Verdict(
                event.event_id,
                event.account_id,
                event.type,
                decision,
                reason,
                account.seq,
                [],
                event.occurred_at,
                shown_amount,
                currency,
                event.original_event_id,
                self.rules.version,
                limits,
            )
        )
        state.put_event(
            event.event_id,
            EventRecord(
                fingerprint=event.fingerprint,
                account_id=event.account_id,
                type=event.type,
                accepted=accepted,
                seq=account.seq,
                verdict=encoded,
                currency=currency,
                buckets=tuple(released_from),
                occurred=event.epoch,
            ),
        )
        return Outcome(OutcomeKind.VERDICT, encoded, decision, reason)

    def _released_state(self, key: str, count: int, used: int) -> LimitState | None:
        """A released bucket's state; None when its rule was removed since the payment, or
        changed to another window (the bucket is still released, there is just no limit
        left to explain: the rule's limits, and maybe its currency, are now those of
        another window's buckets)."""
        rule_id, period = split_bucket_key(key)
        c = self._by_id.get(rule_id)
        if c is None or window_of(period) is not c.window:
            return None
        return _limit_state(_new_tuple(Applied, (c, period, key, None)), count, used)


def _limit_state(a: Applied, count: int, used: int) -> LimitState:
    """A rule's bucket after the decision; ``count``/``used`` are its values then."""
    c = a.rule
    exp = c.amount_exp
    max_count = c.max_count
    max_amount = c.max_amount
    return LimitState(
        c.rule.id,
        c.window,
        a.period,
        count,
        max_count,
        None if max_count is None else (max_count - count if count < max_count else 0),
        None if exp is None else format_minor(used, exp),
        c.max_amount_text,
        None
        if max_amount is None or exp is None
        else format_minor(max_amount - used if used < max_amount else 0, exp),
    )


def _show_amount(amount: int | None, currency: str | None, event: Event) -> str | None:
    if amount is not None and currency is not None:
        return format_minor(amount, MINOR_UNITS[currency])
    if event.amount_decimal is not None:
        return str(event.amount_decimal)
    return None


def _matches(
    match: tuple[tuple[str, frozenset[str], str | None], ...], fields: dict[str, object]
) -> bool:
    """Whether every ``match`` field of an event has one of its allowed values."""
    for name, allowed, absent in match:
        value = fields.get(name, absent)
        if (value if type(value) is str else scalar_text(value)) not in allowed:
            return False
    return True


def _scope_text(name: str, value: object) -> str:
    text = scalar_text(value)
    if text is None:
        raise EventRejected(
            DeadLetterError.INVALID_EVENT,
            f"{name}: a rule scopes by this field, so it must be a string, a number, true or false"
            f" (of at most {TEXT_DIGITS:,} digits written out)",
        )
    return text


class _ReasonOnly(msgspec.Struct):
    reason: Reason | None = None


_decode_reason: Final = msgspec.json.Decoder(_ReasonOnly).decode


def _reason_in(verdict: bytes) -> Reason | None:
    """The reason a stored verdict gives, for a duplicate's outcome (metrics count it
    under its original's reason). Only that field is decoded."""
    try:
        return _decode_reason(verdict).reason
    except msgspec.DecodeError:  # not a verdict this version knows: no reason to tell
        return None


def _dead(error: DeadLetterError, detail: str) -> Outcome:
    return Outcome(OutcomeKind.DEAD_LETTER, None, None, None, error, detail)
