"""Time and peak memory of reading a large rules file, as ``run`` and ``replay`` do at
every start (``limitflow rules check`` reads it the same way), and how fast events are
then decided against it.

    python -m benchmarks.rules_load                     # 100, 1,000 and 5,000 rules
    python -m benchmarks.rules_load --rules 1000 --mccs 50
    python -m benchmarks.rules_load --json              # each file also written as JSON

Each file holds rules of every window, in six zones and six currencies, each with a
``match`` on channel and a list of ``--mccs`` MCCs (an issuer's file of limits by
merchant category), written as YAML. Each is read in a new process (``load_rules``),
so the peak RSS is that of the read alone, and the kept RSS what stays resident once
it is done (the interpreter, ~20 MiB, included). The same process then plans and decides
``--events`` payments in time order, in the six currencies, over 10,000 MCCs, three
channels and 5,000 accounts, on the compiled path and on the Python path alone. The
``Decider``, which builds the ``RuleIndex`` (before 2026-11-27 20:11, the first event
that needed it did, and that time was in decided/s), is timed apart: ``decider s``.
Not a test: figures vary with the machine's load.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

_WINDOWS = ("minute", "hour", "day", "week", "month", "year", "lifetime", "transaction")
_ZONES = ("UTC", "Asia/Shanghai", "Europe/London", "America/New_York", "Asia/Tokyo", "Asia/Kolkata")
_CURRENCIES = ("CNY", "USD", "EUR", "JPY", "KWD", "GBP")

_READ = """
import gc, json, sys, time
t = time.perf_counter()
from schemas.rules import load_rules
rules = load_rules(sys.argv[1])
seconds = time.perf_counter() - t
def status(name):  # VmHWM: ru_maxrss would count what this process shared with its parent
    with open("/proc/self/status") as lines:
        return next(int(line.split()[1]) // 1024 for line in lines if line.startswith(name))
peak = status("VmHWM:")
gc.collect()
kept = status("VmRSS:")
from handlers.decide import Decider
from handlers.state import Snapshot, WorkingState
from schemas.events import parse_event
from streams.engine import fewer_collections
with open(sys.argv[2], "rb") as lines:
    events = [parse_event(line) for line in lines]
rates, made, applied = [], [], 0
for compiled in (True, False):
    started = time.perf_counter()
    decider = Decider(rules, compiled=compiled)
    made.append(time.perf_counter() - started)
    state = WorkingState(Snapshot())
    with fewer_collections():
        started = time.perf_counter()
        for event in events:
            plan = decider.plan(event)
            applied += len(plan)
            decider.decide(event, plan, state)
        rates.append(len(events) / (time.perf_counter() - started))
print(json.dumps({"rules": len(rules.rules), "seconds": seconds, "peak_mib": peak, "kept_mib": kept,
                  "decider": made[0], "compiled": rates[0], "python": rates[1],
                  "applied": applied / 2 / len(events)}))
"""


def rules_file(count: int, mccs: int, seed: int = 1) -> str:
    """YAML for ``count`` rules, each with a match on channel and ``mccs`` MCCs."""
    pick = random.Random(seed)
    lines = ["rules:"]
    for n in range(count):
        window = _WINDOWS[n % len(_WINDOWS)]
        currency = _CURRENCIES[n % len(_CURRENCIES)]
        codes = ", ".join(f'"{pick.randrange(10_000):04d}"' for _ in range(mccs))
        limit = "max_amount" if window == "transaction" else "max_count"
        value = '"5000.00"' if limit == "max_amount" and currency != "JPY" else "9"
        lines += [
            f"  - id: rule-{n}",
            f"    scope: {'[account_id, mcc]' if n % 3 else 'card_id'}",
            f"    window: {window}",
            f"    timezone: {_ZONES[n % len(_ZONES)]}",
            f"    currency: {currency}",
            f"    {limit}: {value}",
            f"    match: {{channel: [pos, ecom], mcc: [{codes}]}}",
        ]
    return "\n".join(lines) + "\n"


def events_file(count: int, seed: int = 3) -> str:
    """``count`` payments, one JSON line each, ten a second from 2026-03-01 UTC."""
    pick = random.Random(seed)
    lines = []
    for n in range(count):
        currency = _CURRENCIES[pick.randrange(len(_CURRENCIES))]
        doc = {
            "event_id": f"e{n}",
            "account_id": f"a{pick.randrange(5_000)}",
            "card_id": f"c{pick.randrange(9_000)}",
            "amount": {"JPY": "900", "KWD": "1.500"}.get(currency, "12.34"),
            "currency": currency,
            "occurred_at": f"2026-03-01T{n // 36_000 % 24:02d}:{n // 600 % 60:02d}:"
            f"{n // 10 % 60:02d}.{n % 10}Z",
            "channel": ("pos", "ecom", "atm")[pick.randrange(3)],
            "mcc": f"{pick.randrange(10_000):04d}",
        }
        lines.append(json.dumps(doc))
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rules", type=int, nargs="+", default=[100, 1000, 5000])
    parser.add_argument("--mccs", type=int, default=200, help="MCCs in each rule's match")
    parser.add_argument("--events", type=int, default=20_000, help="payments to decide")
    parser.add_argument(
        "--json", action="store_true", help="also read each file written as JSON (indented)"
    )
    args = parser.parse_args()
    root = Path(__file__).resolve().parents[1]
    print(
        f"{'rules':>11} {'file MB':>8} {'load s':>7} {'peak MiB':>9} {'kept MiB':>9}"
        f" {'decider s':>10} {'rules/event':>12} {'decided/s':>10} {'Python path/s':>14}"
    )
    with tempfile.TemporaryDirectory() as tmp:
        stream = Path(tmp) / "events.jsonl"
        stream.write_text(events_file(args.events))
        files = []
        for count in args.rules:
            path = Path(tmp) / f"rules-{count}.yaml"
            path.write_text(rules_file(count, args.mccs))
            files.append((count, path))
            if args.json:
                as_json = path.with_suffix(".json")
                # libyaml's reader: yaml.safe_load's pure-Python one takes ~54 s at 5,000 rules
                data = yaml.load(path.read_text(), Loader=yaml.CSafeLoader)
                as_json.write_text(json.dumps(data, indent=2))
                files.append((count, as_json))
        for count, path in files:
            done = subprocess.run(
                [sys.executable, "-c", _READ, str(path), str(stream)],
                cwd=root,
                capture_output=True,
                check=True,
                text=True,
            )
            figures = json.loads(done.stdout)
            assert figures["rules"] == count
            size = path.stat().st_size / 1e6
            label = f"{count:,}" + (" JSON" if path.suffix == ".json" else "")
            print(
                f"{label:>11} {size:>8.1f} {figures['seconds']:>7.2f} {figures['peak_mib']:>9}"
                f" {figures['kept_mib']:>9} {figures['decider']:>10.2f}"
                f" {figures['applied']:>12.2f} {figures['compiled']:>10,.0f}"
                f" {figures['python']:>14,.0f}"
            )


if __name__ == "__main__":
    main()
