"""Runs batches of raw records through the decision core and a store.

The one place that joins the pure core to I/O, shared by ``limitflow replay``, the Kafka
consumer and the faust agent. Per batch: parse, plan, read everything in (at most) two
round trips, decide in input order, and commit in as few atomic writes as the store
allows. A ``ConflictError`` (another writer got there first) re-reads and decides the
uncommitted rest again; what was committed before stays, and is recognised as a
duplicate with its stored verdict if the batch is seen again.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import hashlib
import logging
import random
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Final

import msgspec

from handlers.decide import MAX_APPLICABLE_RULES, Applied, Decider, Outcome, OutcomeKind
from handlers.state import WorkingState
from limitflow.errors import ConflictError
from schemas.events import DeadLetterError, Event, EventRejected, decode_json, is_id, parse_event
from schemas.verdicts import Decision, Reason
from stores.base import Store

log = logging.getLogger("limitflow.engine")

_SYSTEMATIC: Final = 10
"""Unexpected reading failures in one batch from which, if they are most of it, the batch
fails instead: a defect every record meets, not bad input."""


class Record(msgspec.Struct, frozen=True, gc=False):
    """One input record and where it came from.

    A frozen msgspec struct, not a frozen dataclass, whose ``__init__`` sets each field
    through ``object.__setattr__``: built once per record, that was a measurable share
    of a replay. (``gc=False``: it refers to nothing that could refer back to it.)"""

    raw: bytes
    source: dict[str, str | int]
    """``{"line": N}`` for a file, ``{"topic", "partition", "offset"}`` for Kafka."""
    null: bool = False
    """A Kafka record with no value at all (a tombstone); ``raw`` is then empty."""


class Oversized(Record, frozen=True, gc=False):
    """A record over the most a reader takes (``limit`` bytes: ``run``'s
    ``--max-message-bytes``, ``replay``'s ``--max-line-bytes``), in its place: not
    decided, and dead-lettered by its size and SHA-256 (``raw`` is empty)."""

    size: int = 0
    sha256: str = ""
    limit: int = 0

    def refusal(self) -> str:
        """The dead letter's ``detail``."""
        return (
            f"a record of {self.size:,} bytes, over the {self.limit:,} a record may hold"
            " (--max-message-bytes): not decided; its size and SHA-256 name it"
        )


class Result(msgspec.Struct, frozen=True, gc=False):
    """What one input record became: a verdict, or a dead letter. (A msgspec struct for
    the reason ``Record`` is one.)"""

    record: Record
    kind: OutcomeKind
    verdict: bytes | None = None
    decision: Decision | None = None
    reason: Reason | None = None
    event_id: str | None = None
    account_id: str | None = None
    error: DeadLetterError | None = None
    detail: str | None = None


@dataclass(slots=True)
class BatchStats:
    """Counters of one ``Engine``'s work, for metrics and benchmarks."""

    batches: int = 0
    conflicts: int = 0
    commits: int = 0
    by_kind: dict[OutcomeKind, int] = field(default_factory=dict)


def max_applicable_rules(max_records_per_commit: int | None) -> int:
    """Most rules one event may match on a store committing at most that many records at
    once: more, and its verdict or its one atomic commit (its buckets, the account
    sequence, its own record and a reversed original's) would not fit, on any retry."""
    if max_records_per_commit is None:
        return MAX_APPLICABLE_RULES
    return min(MAX_APPLICABLE_RULES, max_records_per_commit - 3)


class Engine:
    """Decides batches of records against a store."""

    def __init__(self, decider: Decider, store: Store, *, max_conflict_retries: int = 50):
        self.decider = decider
        self.store = store
        self.max_conflict_retries = max_conflict_retries
        self.stats = BatchStats()
        self.max_applicable = max_applicable_rules(store.max_records_per_commit)
        """Most rules one event may match on this store."""

    async def process(self, records: Sequence[Record]) -> list[Result]:
        """Results for ``records``, in order, once every state change is committed.

        Raises a retriable ``StoreError`` when the store is unavailable; nothing of the
        uncommitted part of the batch is then stored, and calling again is safe.
        """
        self.stats.batches += 1
        results: list[Result | None] = [None] * len(records)
        pending: list[tuple[int, Event, tuple[Applied, ...]]] = []
        plan = self.decider.plan
        add = pending.append
        unexpected: list[Exception] = []
        refused: dict[int, EventRejected] = {}
        """Events whose rules refuse them (a field a rule scopes by that cannot key a
        bucket): dead letters, unless a duplicate (``_decide_and_commit``)."""
        for index, record in enumerate(records):
            try:
                if record.null:
                    raise EventRejected(
                        DeadLetterError.INVALID_JSON,
                        "null record (no value: a tombstone): no JSON document",
                    )
                try:
                    event = parse_event(record.raw)
                    try:
                        planned = plan(event)
                    except EventRejected as exc:
                        # the rules, not the event, may have changed since it was decided:
                        # a resend gets its stored verdict (a rule scoping by a field it
                        # sends as an object, added since, dead-lettered a redelivered
                        # event whose verdict was published already)
                        refused[index] = exc
                        planned = ()
                except (EventRejected, MemoryError):
                    raise
                except Exception as exc:
                    # a defect in reading a record (a number out of Decimal's range once
                    # raised here) or in finding the rules that apply to it: dead-lettered
                    # with its bytes, not left to stop the consumer on every retry of its
                    # batch; the traceback goes to the log
                    log.exception("a record could not be read: %s", record.source)
                    unexpected.append(exc)
                    raise EventRejected(
                        DeadLetterError.INVALID_EVENT,
                        f"could not be read: {type(exc).__name__}: {exc}"
                        " (unexpected: a defect of limitflow, logged)",
                    ) from exc
                add((index, event, planned))
            except EventRejected as exc:
                results[index] = Result(
                    record,
                    OutcomeKind.DEAD_LETTER,
                    error=exc.error,
                    detail=exc.detail,
                    event_id=_event_id_hint(record.raw),
                )
        if len(unexpected) >= _SYSTEMATIC and 2 * len(unexpected) > len(records):
            # most of the batch: a defect that every record meets (after an upgrade, say),
            # not bad input. Dead-lettering them all would commit their offsets with none
            # decided; failing the batch stops here, and nothing is lost
            raise RuntimeError(
                f"{len(unexpected)} of {len(records)} records could not be read, unexpectedly:"
                " a defect of limitflow, not bad input; the batch is not committed"
            ) from unexpected[0]
        attempt = 0
        while pending:
            left = len(pending)
            try:
                pending = await self._decide_and_commit(records, pending, results, refused)
            except ConflictError as exc:
                if len(pending) < left:
                    # units committed before this one (a store committing at most so many
                    # records at once: DynamoDB's 100): progress, so the conflicts "in a
                    # row", and the backoff, start again. Counted over the whole batch, a
                    # `run` batch of ~40 units on a shared bucket was given up (an outage,
                    # to the consumer) while every unit was committing
                    attempt = 0
                attempt += 1
                self.stats.conflicts += 1
                if attempt > self.max_conflict_retries:
                    raise ConflictError(
                        f"{attempt} conflicts in a row: other writers kept changing the"
                        f" records this batch needs ({exc}); what was committed is kept"
                    ) from exc
                # contention on shared buckets: back off with jitter, then re-read
                await asyncio.sleep(random.uniform(0, min(0.5, 0.002 * 2 ** min(attempt, 16))))  # noqa: S311
        assert None not in results  # (a Result never equals None: msgspec compares by type)
        by_kind = self.stats.by_kind
        # counted in C; kinds new to by_kind enter it in the order they first occur, as before
        for kind, count in Counter(map(_KIND, results)).items():
            by_kind[kind] = by_kind.get(kind, 0) + count
        return results  # type: ignore[return-value]

    async def _decide_and_commit(
        self,
        records: Sequence[Record],
        pending: list[tuple[int, Event, tuple[Applied, ...]]],
        results: list[Result | None],
        refused: dict[int, EventRejected],
    ) -> list[tuple[int, Event, tuple[Applied, ...]]]:
        """Decide and commit ``pending``; on conflict, raise after keeping committed units.

        Returns the still-pending items (empty when all were committed).
        """
        decider = self.decider
        events = [event for _, event, _ in pending]
        # the buckets of an event too many rules apply to are not read: it is a dead
        # letter, unless a duplicate, which its own record tells (1,000 rules applying to
        # each event read 1,000 buckets an event, to dead-letter them all at ~400 a second)
        widest = self.max_applicable
        keys = decider.keys(events, [p if len(p) <= widest else () for _, _, p in pending])
        snapshot = await self.store.load(keys)
        state = WorkingState(snapshot)
        more = decider.reversal_keys(events, state)
        if more:
            snapshot.merge(await self.store.load(more))
        limit = self.store.max_records_per_commit
        unit_start = 0
        unit: list[tuple[int, Outcome, Event]] = []
        for position, (index, event, plan) in enumerate(pending):
            # a duplicate gets its verdict again even if the rules grew too wide since, or
            # came to refuse it (its own record is looked up only then: the hot path)
            refusal = refused.get(index) if refused else None
            too_wide = len(plan) > self.max_applicable
            if (too_wide or refusal is not None) and state.event(event.event_id) is not None:
                too_wide, refusal = False, None
            if (
                limit is not None
                and unit
                and not too_wide
                and refusal is None
                and state.pending + decider.records_needed(event, plan, state) > limit
            ):
                await self._commit(state, unit, records, results, pending, unit_start)
                unit, unit_start = [], position
            if refusal is not None:
                outcome = Outcome(
                    OutcomeKind.DEAD_LETTER, None, None, None, refusal.error, refusal.detail
                )
            elif too_wide:
                outcome = self._too_wide(plan)
            else:
                outcome = decider.decide(event, plan, state)
            unit.append((index, outcome, event))
        await self._commit(state, unit, records, results, pending, unit_start)
        return []

    def _too_wide(self, plan: tuple[Applied, ...]) -> Outcome:
        return Outcome(
            OutcomeKind.DEAD_LETTER,
            None,
            None,
            None,
            DeadLetterError.INVALID_EVENT,
            f"{len(plan)} rules apply to this event; at most {self.max_applicable} may"
            " (split the rules file's broadest rules by match or currency)",
        )

    async def _commit(
        self,
        state: WorkingState,
        unit: list[tuple[int, Outcome, Event]],
        records: Sequence[Record],
        results: list[Result | None],
        pending: list[tuple[int, Event, tuple[Applied, ...]]],
        unit_start: int,
    ) -> None:
        try:
            await self.store.commit(state.take_writes())
        except ConflictError:
            # keep only what is committed; the caller re-reads and redoes the rest
            del pending[:unit_start]
            raise
        self.stats.commits += 1
        for index, (kind, verdict, decision, reason, error, detail), event in unit:
            results[index] = Result(
                records[index],
                kind,
                verdict,
                decision,
                reason,
                event.event_id,
                event.account_id,
                error,
                detail,
            )


GC_THRESHOLD = 50_000
"""Container objects allocated (net) between young-generation collections in a replay or
a consumer; Python's default is 700."""


@contextlib.contextmanager
def fewer_collections() -> Iterator[None]:
    """Collect cyclic garbage less often while a replay or a consumer runs: a batch's
    events, plans and results live until the batch is written, so every young-generation
    collection in the middle of one walked them all, and moved them on for older
    generations to walk again (about 8% of a replay of 200,000 events, and a `limitflow
    run` drained a backlog 9-19% faster without them), finding almost no garbage.
    Nothing is decided differently; only cycles, of which both make few, wait longer."""
    before = gc.get_threshold()
    if before[0]:  # 0: automatic collection is off, and stays so
        gc.set_threshold(max(before[0], GC_THRESHOLD), *before[1:])
    try:
        yield
    finally:
        gc.set_threshold(*before)


_KIND: Final = attrgetter("kind")


def _event_id_hint(raw: bytes) -> str | None:
    """The event_id of a rejected record when it can be read and is a valid one, to help
    tracing (an overlong one would be repeated in the dead letter and its header)."""
    try:
        doc = decode_json(raw)
    except MemoryError:
        raise
    except Exception:  # EventRejected, or what made reading the record fail unexpectedly
        return None
    value = doc.get("event_id") if isinstance(doc, dict) else None
    return value if is_id(value) else None


def oversized(raw: bytes, source: dict[str, str | int], most: int) -> Oversized:
    """The stand-in of a Kafka record whose value ``raw`` is over ``most`` bytes
    (``--max-message-bytes``, ``LIMITFLOW_MAX_MESSAGE_BYTES``), as ``replay`` takes no
    line over its ``--max-line-bytes`` (the same 1,000,000 by default): an input topic
    that allows larger records had them decided by ``run`` and the faust app, and
    dead-lettered by a replay of the same events."""
    return Oversized(b"", source, size=len(raw), sha256=hashlib.sha256(raw).hexdigest(), limit=most)


async def process_within(engine: Engine, records: list[Record]) -> list[Result]:
    """``engine.process`` of ``records`` but the ``Oversized`` (a Kafka record, a
    replay's long line), which are dead letters (counted in ``engine.stats`` as the
    engine counts what it decides)."""
    over = sum(isinstance(record, Oversized) for record in records)
    if not over:
        return await engine.process(records)
    decided = iter(await engine.process([r for r in records if not isinstance(r, Oversized)]))
    kinds = engine.stats.by_kind
    kinds[OutcomeKind.DEAD_LETTER] = kinds.get(OutcomeKind.DEAD_LETTER, 0) + over
    return [
        Result(
            record,
            OutcomeKind.DEAD_LETTER,
            error=DeadLetterError.INVALID_EVENT,
            detail=record.refusal(),
        )
        if isinstance(record, Oversized)
        else next(decided)
        for record in records
    ]
