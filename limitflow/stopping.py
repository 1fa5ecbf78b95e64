"""SIGTERM and SIGINT of ``limitflow run`` while its consumer is not the one handling them.

``serve`` handles them on its event loop (the first finishes the batch in hand, a second
hurries an outage's wait). Before it does (the imports, settings, rules, opening the
store) the process had no handler of its own: SIGTERM ended it with 143 and SIGINT with
130, so an orchestrator stopping a process that had just started saw a failure.
``StopSignals`` records such a signal instead: ``run`` then stops without consuming
anything and exits 0. After ``serve``, until ``run`` is over, a signal is logged: the
stop is under way; after that, until the process ends, it is ignored.

This module imports nothing heavy: the console script installs the handlers before it
imports the rest of limitflow.
"""

from __future__ import annotations

import signal
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    import asyncio
    from collections.abc import Callable
    from types import FrameType

SIGNALS = (signal.SIGINT, signal.SIGTERM)
"""The signals that stop ``run``. SIGTERM's handler is installed last, so a process that
catches SIGTERM (``SigCgt`` in ``/proc/PID/status``) catches both."""


class StopSignals:
    """The stop signals of one ``run``, from ``install`` until ``restore``."""

    installed: ClassVar[StopSignals | None] = None
    """The instance whose handlers are installed, if any."""

    def __init__(self) -> None:
        self.received: signal.Signals | None = None
        """The first stop signal received, if any."""
        self.closing = False
        """Set once ``serve`` has handed the signals back: the stop is under way."""
        self._stop: asyncio.Event | None = None
        self._handler: Callable[[signal.Signals], None] | None = None
        self._before: dict[signal.Signals, Any] = {}

    @classmethod
    def install(cls) -> StopSignals:
        """The installed instance, or a new one whose plain handlers are installed now.

        A plain handler only records the signal: it may run anywhere in the main
        thread, before there is an event loop."""
        if cls.installed is None:
            made = cls()
            for sig in SIGNALS:
                made._before[sig] = signal.signal(sig, made._record)
            cls.installed = made
        return cls.installed

    @classmethod
    def restore(cls) -> None:
        """Put back the handlers there were before ``install``."""
        made, cls.installed = cls.installed, None
        if made is not None:
            for sig, before in made._before.items():
                signal.signal(sig, before)

    def _record(self, signum: int, _frame: FrameType | None) -> None:
        if self.received is None:
            self.received = signal.Signals(signum)

    def attach(self) -> asyncio.Event:
        """Handle the signals on the running event loop from now on (its handlers wake it
        from a wait, a plain handler may not); the event returned is set by a signal
        received since ``install`` or from now on."""
        import asyncio

        self._stop = asyncio.Event()
        # each replaces a plain handler that catches too: no moment without one
        self._on_loop()
        if self.received is not None:  # before the loop's handlers were installed
            self._stop.set()
        return self._stop

    def take(self, handler: Callable[[signal.Signals], None]) -> None:
        """``serve`` handles the signals from now on: ``handler`` is called for each, at
        once for one received already.

        The loop's handlers stay this instance's, which passes them on. Replacing them
        with ``serve``'s lost a signal the loop had read but not handled yet: its callback,
        already queued, came to this instance after ``serve`` had looked for one, and
        only set an event no one waited for any more."""
        self._handler = handler
        self._on_loop()
        if self.received is not None:
            handler(self.received)

    def hand_back(self) -> None:
        """``serve`` is done with the signals: a signal now is logged, not fatal.

        The loop's handlers are replaced, not removed (removing one restores the
        default action for a moment); closing the loop removes them."""
        self._handler = None
        self.closing = True
        self._on_loop()

    def done(self) -> None:
        """The run is over, its exit code decided: a stop signal from now on is ignored.

        Closing the event loop would put the default actions back, and SIGTERM then
        ended a process that had stopped cleanly with 143 (SIGINT with 130) while Python
        finished. The loop's handlers are removed here instead, each followed at once
        by SIG_IGN (the default action in between, for two system calls). ``restore``
        still puts back the handlers there were before ``install``."""
        import asyncio

        loop = asyncio.get_running_loop()
        for sig in SIGNALS:
            loop.remove_signal_handler(sig)
            signal.signal(sig, signal.SIG_IGN)

    def _on_loop(self) -> None:
        """This instance's handlers on the running event loop (again)."""
        import asyncio

        loop = asyncio.get_running_loop()
        for sig in SIGNALS:
            loop.add_signal_handler(sig, self._note, sig)

    def _note(self, sig: signal.Signals) -> None:
        """A signal, on the event loop."""
        if self.received is None:
            self.received = sig
        if self.closing:
            import logging

            logging.getLogger("limitflow.run").info("received %s: already stopping", sig.name)
        elif self._handler is not None:
            self._handler(sig)
        if self._stop is not None:
            self._stop.set()
