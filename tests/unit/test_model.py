"""The decision core against a deliberately simple model of the contract.

The model recomputes everything from scratch with plain datetime arithmetic and dicts;
hypothesis drives both with random streams (limits, accounts, cards, merchants, times
across period and zone boundaries, reversals, resends, conflicting resends) and random
batch sizes and commit-unit sizes, and the two must agree on every verdict.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from handlers.decide import Decider, OutcomeKind
from schemas import zones
from schemas.rules import parse_rules
from stores.memory import MemoryStore
from streams.engine import Engine, Record

pytestmark = pytest.mark.usefixtures("both_cores")

BASE = datetime(2025, 12, 31, 15, 50, tzinfo=UTC)  # near day, week, month and year ends


def rules_text(limits: dict[str, int]) -> str:
    return f"""
rules:
  - {{id: acct-day, window: day, timezone: Asia/Shanghai, currency: CNY,
      max_count: {limits["day_count"]}, max_amount: "{limits["day_amount"]}.00"}}
  - {{id: merchant-hour, scope: merchant_id, window: hour, currency: CNY,
      max_amount: "{limits["merchant_amount"]}.00"}}
  - {{id: card-merchant-month, scope: [card_id, merchant_id], window: month,
      timezone: America/New_York, max_count: {limits["pair_count"]}}}
  - {{id: atm-week, window: week, currency: CNY, max_amount: "{limits["atm_amount"]}.00",
      match: {{channel: atm}}}}
  - {{id: burst, window: minute, max_count: {limits["burst"]}}}
  - {{id: single, window: transaction, currency: CNY, max_amount: "{limits["single"]}.00"}}
  - {{id: jpy-life, window: lifetime, currency: JPY, max_amount: "{limits["jpy"]}"}}
  - {{id: acct-year, window: year, timezone: Pacific/Kiritimati, max_count: {limits["year"]}}}
"""


FORMATS = {
    "minute": "%Y-%m-%dT%H:%M",
    "hour": "%Y-%m-%dT%H",
    "day": "%Y-%m-%d",
    "month": "%Y-%m",
    "year": "%Y",
}


@dataclass
class ModelRule:
    id: str
    window: str
    scope: tuple[str, ...]
    zone: str = "UTC"
    currency: str | None = None
    max_count: int | None = None
    max_amount: int | None = None  # minor units
    match: dict[str, str] = field(default_factory=dict)


def model_rules(limits: dict[str, int]) -> list[ModelRule]:
    return [
        ModelRule(
            "acct-day",
            "day",
            ("account_id",),
            "Asia/Shanghai",
            "CNY",
            limits["day_count"],
            limits["day_amount"] * 100,
        ),
        ModelRule(
            "merchant-hour",
            "hour",
            ("merchant_id",),
            "UTC",
            "CNY",
            None,
            limits["merchant_amount"] * 100,
        ),
        ModelRule(
            "card-merchant-month",
            "month",
            ("card_id", "merchant_id"),
            "America/New_York",
            None,
            limits["pair_count"],
        ),
        ModelRule(
            "atm-week",
            "week",
            ("account_id",),
            "UTC",
            "CNY",
            None,
            limits["atm_amount"] * 100,
            {"channel": "atm"},
        ),
        ModelRule("burst", "minute", ("account_id",), max_count=limits["burst"]),
        ModelRule(
            "single", "transaction", ("account_id",), "UTC", "CNY", None, limits["single"] * 100
        ),
        ModelRule("jpy-life", "lifetime", ("account_id",), "UTC", "JPY", None, limits["jpy"]),
        ModelRule("acct-year", "year", ("account_id",), "Pacific/Kiritimati", None, limits["year"]),
    ]


def model_period(rule: ModelRule, moment: datetime) -> str:
    local = moment.astimezone(zones.zone(rule.zone))
    if rule.window == "week":
        year, week, _ = local.isocalendar()
        return f"{year}-W{week:02d}"
    if rule.window in ("lifetime", "transaction"):
        return rule.window
    return local.strftime(FORMATS[rule.window])


def run_model(limits: dict[str, int], docs: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """Expected (kind, decision, reason, seq, sorted violations) per event."""
    rules = model_rules(limits)
    counters: dict[tuple[str, ...], list[int]] = {}
    seqs: dict[str, int] = {}
    seen: dict[str, tuple[str, tuple[Any, ...]]] = {}
    payments: dict[str, dict[str, Any]] = {}
    out: list[tuple[Any, ...]] = []
    for doc in docs:
        payload = json.dumps(doc, sort_keys=True)
        if doc["event_id"] in seen:
            old_payload, verdict = seen[doc["event_id"]]
            out.append(verdict if old_payload == payload else ("dead", "idempotency_conflict"))
            continue
        account = doc["account_id"]
        moment = datetime.fromisoformat(doc["occurred_at"])
        if doc.get("type") == "reversal":
            original = payments.get(doc["original_event_id"])
            reason = None
            if original is None or original["account"] != account:
                reason = "original_not_found"
            elif not original["accepted"]:
                reason = "original_not_accepted"
            elif original["amount"] - original["reversed"] == 0:
                reason = "already_reversed"
            else:
                left = original["amount"] - original["reversed"]
                scale = 10 ** original["exponent"]
                amount = int(doc["amount"]) * scale if "amount" in doc else left
                if amount > left:
                    reason = "reversal_exceeds_original"
                else:
                    original["reversed"] += amount
                    for key in original["keys"]:
                        counters[key][1] -= amount
                        if original["reversed"] == original["amount"]:
                            counters[key][0] -= 1
            seqs[account] = seqs.get(account, 0) + 1
            verdict = (
                "verdict",
                "reject" if reason else "accept",
                reason,
                seqs[account],
                (),
            )
        else:
            exponent = 0 if doc["currency"] == "JPY" else 2
            amount = int(doc["amount"]) * 10**exponent
            violations = []
            keys = []
            for rule in rules:
                if rule.currency and rule.currency != doc["currency"]:
                    continue
                if any(f not in doc for f in rule.scope):
                    continue
                if any(doc.get(f) != v for f, v in rule.match.items()):
                    continue
                if rule.window == "transaction":
                    if amount > (rule.max_amount or 0):
                        violations.append((rule.id, "amount"))
                    continue
                key = (rule.id, model_period(rule, moment), *(doc[f] for f in rule.scope))
                count, used = counters.get(key, [0, 0])
                if rule.max_count is not None and count + 1 > rule.max_count:
                    violations.append((rule.id, "count"))
                if rule.max_amount is not None and used + amount > rule.max_amount:
                    violations.append((rule.id, "amount"))
                keys.append(key)
            accepted = not violations
            if accepted:
                for key in keys:
                    counters.setdefault(key, [0, 0])
                    counters[key][0] += 1
                    counters[key][1] += amount
            payments[doc["event_id"]] = {
                "account": account,
                "accepted": accepted,
                "amount": amount if accepted else 0,
                "reversed": 0,
                "keys": keys if accepted else [],
                "exponent": exponent,
            }
            seqs[account] = seqs.get(account, 0) + 1
            verdict = (
                "verdict",
                "accept" if accepted else "reject",
                None if accepted else "limit_exceeded",
                seqs[account],
                tuple(sorted(violations)),
            )
        seen[doc["event_id"]] = (payload, verdict)
        out.append(verdict)
    return out


class SmallUnitStore(MemoryStore):
    """A memory store that forces batches to commit in many small units."""

    max_records_per_commit = 12


def run_core(
    limits: dict[str, int], docs: list[dict[str, Any]], batch: int, small_units: bool
) -> list[tuple[Any, ...]]:
    engine = Engine(
        Decider(parse_rules(rules_text(limits))), SmallUnitStore() if small_units else MemoryStore()
    )
    records = [Record(json.dumps(d).encode(), {"line": i}) for i, d in enumerate(docs, 1)]

    async def go() -> list[tuple[Any, ...]]:
        got: list[tuple[Any, ...]] = []
        for start in range(0, len(records), batch):
            for result in await engine.process(records[start : start + batch]):
                if result.kind is OutcomeKind.DEAD_LETTER:
                    got.append(("dead", str(result.error)))
                    continue
                assert result.verdict is not None
                v = json.loads(result.verdict)
                got.append(
                    (
                        "verdict",
                        v["decision"],
                        v["reason"],
                        v["seq"],
                        tuple(sorted((x["rule_id"], x["metric"]) for x in v["violations"])),
                    )
                )
        return got

    return asyncio.run(go())


ACCOUNTS = ["a1", "a2", "a3"]


@st.composite
def streams(draw: st.DrawFn) -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = []
    count = draw(st.integers(1, 60))
    for n in range(count):
        minutes = draw(st.integers(0, 60 * 24 * 9))
        moment = BASE + timedelta(minutes=minutes, seconds=draw(st.integers(0, 59)))
        zone = draw(st.sampled_from(["Z", "+08:00", "-05:00"]))
        if zone == "Z":
            stamp = moment.strftime("%Y-%m-%dT%H:%M:%SZ")
        else:
            hours = 8 if zone == "+08:00" else -5
            stamp = (moment + timedelta(hours=hours)).strftime("%Y-%m-%dT%H:%M:%S") + zone
        choice = draw(st.integers(0, 9))
        if choice == 0 and docs:
            docs.append(dict(draw(st.sampled_from(docs))))  # resend
            continue
        if choice == 1 and docs:
            changed = dict(draw(st.sampled_from(docs)))
            changed["note"] = "changed"  # same id, different payload
            docs.append(changed)
            continue
        account = draw(st.sampled_from(ACCOUNTS))
        if choice == 2 and docs:
            original = draw(st.sampled_from(docs))
            doc: dict[str, Any] = {
                "event_id": f"e{n}",
                "type": "reversal",
                "account_id": draw(st.sampled_from([account, original["account_id"]])),
                "original_event_id": original["event_id"],
                "occurred_at": stamp,
            }
            if draw(st.booleans()):
                doc["amount"] = str(draw(st.integers(1, 60)))
            docs.append(doc)
            continue
        currency = draw(st.sampled_from(["CNY", "CNY", "CNY", "JPY", "USD"]))
        doc = {
            "event_id": f"e{n}",
            "account_id": account,
            "amount": str(draw(st.integers(1, 120))),
            "currency": currency,
            "occurred_at": stamp,
            "merchant_id": draw(st.sampled_from(["m1", "m2"])),
            "channel": draw(st.sampled_from(["atm", "pos"])),
        }
        if draw(st.booleans()):
            doc["card_id"] = draw(st.sampled_from(["c1", "c2"]))
        docs.append(doc)
    return docs


limit_sets = st.fixed_dictionaries(
    {
        "day_count": st.integers(0, 6),
        "day_amount": st.integers(0, 300),
        "merchant_amount": st.integers(50, 400),
        "pair_count": st.integers(1, 5),
        "atm_amount": st.integers(0, 300),
        "burst": st.integers(1, 3),
        "single": st.integers(30, 120),
        "jpy": st.integers(50, 400),
        "year": st.integers(3, 40),
    }
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    limits=limit_sets,
    docs=streams(),
    batch=st.integers(1, 25),
    small_units=st.booleans(),
)
def test_core_agrees_with_the_model(
    limits: dict[str, int], docs: list[dict[str, Any]], batch: int, small_units: bool
) -> None:
    assert run_core(limits, docs, batch, small_units) == run_model(limits, docs)
