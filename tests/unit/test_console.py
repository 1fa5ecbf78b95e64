"""``limitflow.console``: lines on stderr that survive a lost stderr and an open line."""

from __future__ import annotations

import io

import pytest

from limitflow import console


@pytest.fixture(autouse=True)
def fresh(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test with a stderr neither lost nor left on an open line."""
    monkeypatch.setattr(console, "_stderr", console._Stderr())


def test_a_line_after_a_progress_display_starts_on_a_line_of_its_own(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # a failed replay's one-line reason came after the progress display, on its line
    console.say("\r10 events", end="")
    console.say("\r20 events", end="")  # the display overwrites itself
    console.say("limitflow: cannot write out.jsonl: No space left on device")
    console.say("next")
    assert capsys.readouterr().err == (
        "\r10 events\r20 events\nlimitflow: cannot write out.jsonl: No space left on device\nnext\n"
    )


def test_a_display_ended_by_its_own_newline_needs_none_more(
    capsys: pytest.CaptureFixture[str],
) -> None:
    console.say("\r20 events", end="\n")
    console.say("20 events: 20 accepted")
    assert capsys.readouterr().err == "\r20 events\n20 events: 20 accepted\n"


class _Gone(io.StringIO):
    def write(self, text: str) -> int:
        raise BrokenPipeError(32, "Broken pipe")

    def fileno(self) -> int:
        raise io.UnsupportedOperation("no file")


def test_a_stderr_that_cannot_be_written_is_not_tried_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("sys.stderr", _Gone())
    assert console.say("first") is False
    assert console._stderr.lost
    monkeypatch.setattr("sys.stderr", io.StringIO())
    assert console.say("second") is False  # dropped: stderr was lost once
