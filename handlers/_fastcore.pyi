"""Types of the compiled hot path (``_fastcore.pyx``), for mypy."""

from collections.abc import Callable, Sequence
from typing import Any

from handlers.state import Keys, Snapshot, WorkingState, Writes

class FastCore:
    def __init__(
        self,
        compiled_rules: tuple[Any, ...],
        version: str,
        applied_type: type[Any],
        outcome_type: type[Any],
        verdict_kind: object,
        escape: Callable[[str], str],
        short_key: int,
        ceiling: int,
        python_plan: Callable[[Any], Any],
        python_decide: Callable[[Any, Any, Any], Any],
        python_payment: Callable[[Any, Any, Any], Any],
        duplicate_kind: object = None,
        reason_in: Callable[[bytes], Any] | None = None,
        index_for: Callable[[tuple[Any, ...]], Any] | None = None,
    ) -> None: ...
    def plan(self, event: Any) -> tuple[Any, ...]: ...
    def decide(self, event: Any, applied: tuple[Any, ...], state: Any) -> Any: ...

def stored_reason(verdict: bytes, reason_in: Callable[[bytes], Any]) -> Any: ...
def slot_fields() -> dict[str, bool]: ...
def json_number(value: int, exponent: int, quoted: bool) -> bytes: ...
def keys(events: Sequence[Any], plans: Sequence[tuple[Any, ...]]) -> Keys: ...
def take_writes(state: WorkingState) -> Writes: ...
def stamp(
    writes: Writes, now: int, bucket_seconds: int, event_seconds: int, latest: int
) -> tuple[dict[str, int | None], dict[str, int | None]]: ...
def expire(snapshot: Snapshot, now: int) -> None: ...
