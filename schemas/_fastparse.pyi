"""Types of the compiled common-event path (``_fastparse.pyx``), for mypy."""

from collections.abc import Callable
from typing import Any

class CommonEvent:
    def __init__(
        self,
        event_type: Callable[..., Any],
        payment: object,
        reversal: object,
        minor_units: dict[str, int],
        encoder: Any,
        blake: Any,
        max_id: int,
        first_micros: int,
        end_micros: int,
        longest_int: int,
        max_minor: int,
        decode: Callable[[bytes | str], Any] | None = None,
    ) -> None: ...
    def parse(self, raw: bytes | str) -> Any: ...
    def event(self, doc: dict[str, Any]) -> Any: ...
