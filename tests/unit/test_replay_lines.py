"""What ``limitflow replay`` writes for a batch is what it wrote when each result's line
was built (and ended with its newline) on its own: the same bytes, the same counts."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from handlers.decide import OutcomeKind
from schemas.events import DeadLetterError
from schemas.verdicts import Decision, Reason, dead_letter, verdict_encoder
from streams.engine import Record, Result
from streams.replay import ReplaySummary, _lines


def _verdict_line(result: Result, summary: ReplaySummary) -> bytes:
    """The line of one verdict as replay built it before it joined whole batches."""
    if result.kind is OutcomeKind.DEAD_LETTER:
        return b""
    summary.verdicts += 1
    if result.kind is OutcomeKind.DUPLICATE:
        summary.duplicates += 1
    elif result.decision == "accept":
        summary.accepted += 1
    else:
        summary.rejected += 1
    assert result.verdict is not None
    return result.verdict + b"\n"


def _dead_line(result: Result, summary: ReplaySummary) -> bytes:
    """The line of one dead letter as replay built it before."""
    if result.kind is not OutcomeKind.DEAD_LETTER:
        return b""
    summary.dead_letters += 1
    assert result.error is not None and result.detail is not None
    letter = dead_letter(
        result.error, result.detail, result.record.raw, result.record.source, result.event_id
    )
    return verdict_encoder.encode(letter) + b"\n"


_RECORD = st.builds(
    Record,
    st.binary(max_size=20) | st.text(max_size=10).map(str.encode),
    st.fixed_dictionaries({"line": st.integers(1, 10**6)}),
)
_VERDICT = st.builds(
    Result,
    _RECORD,
    st.sampled_from([OutcomeKind.VERDICT, OutcomeKind.DUPLICATE]),
    st.binary(max_size=30),  # the empty verdict too: its line is a lone newline
    st.sampled_from([Decision.ACCEPT, Decision.REJECT]),
    st.sampled_from([None, Reason.LIMIT_EXCEEDED]),
    st.text(min_size=1, max_size=5),
    st.text(min_size=1, max_size=5),
)
_DEAD = st.builds(
    Result,
    _RECORD,
    st.just(OutcomeKind.DEAD_LETTER),
    error=st.sampled_from(list(DeadLetterError)),
    detail=st.text(max_size=20),
    event_id=st.none() | st.text(min_size=1, max_size=5),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_VERDICT | _DEAD, max_size=12))
def test_batch_lines_are_the_lines_of_each_result(results: list[Result]) -> None:
    old, new = ReplaySummary(), ReplaySummary()
    together = b"".join(_verdict_line(r, old) + _dead_line(r, old) for r in results)
    assert _lines(results, new, verdicts=True, dead=True) == together
    assert new == old

    old, new = ReplaySummary(), ReplaySummary()
    verdicts = b"".join(_verdict_line(r, old) for r in results)
    dead = b"".join(_dead_line(r, old) for r in results)
    assert _lines(results, new, verdicts=True) == verdicts
    assert _lines(results, new, dead=True) == dead
    assert new == old
