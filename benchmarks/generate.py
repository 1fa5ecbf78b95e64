"""Generate realistic synthetic event files for benchmarks and large tests."""

from __future__ import annotations

import argparse
import json
import random
import sys
from datetime import UTC, datetime, timedelta


def events(
    count: int,
    *,
    accounts: int = 20_000,
    merchants: int = 500,
    seed: int = 7,
    start: str = "2026-03-01",
) -> list[bytes]:
    """``count`` JSON lines: mostly CNY payments, some JPY, ~2% reversals, ~1% resends."""
    rng = random.Random(seed)
    moment = datetime.fromisoformat(start).replace(tzinfo=UTC)
    lines: list[bytes] = []
    accepted_like: list[tuple[str, str]] = []
    for n in range(count):
        moment += timedelta(milliseconds=rng.randint(1, 120))
        account = f"acct-{rng.randrange(accounts)}"
        roll = rng.random()
        if roll < 0.02 and accepted_like:
            original, owner = accepted_like[rng.randrange(len(accepted_like))]
            doc: dict[str, object] = {
                "event_id": f"evt-{n}",
                "type": "reversal",
                "account_id": owner,
                "original_event_id": original,
                "occurred_at": moment.isoformat().replace("+00:00", "Z"),
            }
        elif roll < 0.03 and lines:
            lines.append(lines[rng.randrange(len(lines))])
            continue
        else:
            currency = "JPY" if roll > 0.97 else "CNY"
            amount = (
                str(rng.randint(100, 20_000))
                if currency == "JPY"
                else f"{rng.randint(1, 150_000) / 100:.2f}"
            )
            doc = {
                "event_id": f"evt-{n}",
                "account_id": account,
                "card_id": f"card-{account[5:]}-{rng.randrange(2)}",
                "merchant_id": f"m-{rng.randrange(merchants)}",
                "amount": amount,
                "currency": currency,
                "occurred_at": moment.isoformat().replace("+00:00", "Z"),
                "channel": "atm" if rng.random() < 0.1 else "pos",
                "mcc": rng.choice(["5411", "5812", "6011", "4111"]),
            }
            accepted_like.append((f"evt-{n}", account))
        lines.append(json.dumps(doc).encode())
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("count", type=int)
    parser.add_argument("--accounts", type=int, default=20_000)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    out = sys.stdout.buffer
    for line in events(args.count, accounts=args.accounts, seed=args.seed):
        out.write(line + b"\n")


if __name__ == "__main__":
    main()
