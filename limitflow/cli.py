"""The ``limitflow`` command line: the edge where settings become adapters."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import os
import signal
import stat
import sys
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Sequence
from typing import IO, TYPE_CHECKING, Any, BinaryIO, ClassVar, Final, cast

from limitflow.console import StdoutFailed, Waiting, non_blocking_fd, out, say, to_devnull
from limitflow.errors import (
    ConfigError,
    LimitflowError,
    StoppedOpening,
    StoreError,
    StoreNotInitialized,
)
from limitflow.settings import MAX_MESSAGE_BYTES, store_password, whole_number
from schemas.rules import RuleChanged, RulesError, RuleSet, counter_meaning, load_rules

if TYPE_CHECKING:
    from streams.replay import ReplaySummary

DEFAULT_STORE = "sqlite:///limitflow.db"

EXIT_OK = 0
EXIT_INPUT = 1
EXIT_USAGE = 2
EXIT_STORE = 3
EXIT_INTERRUPTED = 130
REPLAY_CONFLICT_RETRIES = 1_000
"""Conflicts in a row a replay retries (each after up to 0.5 s) before it gives up."""


class CommandFailed(Exception):
    """A one-line reason and an exit code for the user."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


def _positive(text: str) -> int:
    """A whole number above 0, for argparse, read as run's number flags are (``int`` took
    ``1_000``, ``+5`` and other scripts' digits)."""
    try:
        value = whole_number(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{value} is not above 0")
    return value


def _rules(path: str) -> RuleSet:
    try:
        return load_rules(path)
    except RulesError as exc:
        raise CommandFailed(f"rules: {exc}", EXIT_USAGE) from None


async def open_ready_store(
    url: str,
    rules: RuleSet | None = None,
    *,
    lock_wait: float | None = None,
    create: bool = True,
    stopping: Callable[[], bool] | None = None,
    as_is: bool = False,
) -> object:
    """Open the store of ``url``; embedded stores are created (unless not ``create``:
    then a sqlite file is left in its journal mode, see ``stores.sqlite._open``),
    servers must be initialised. With ``rules``, the store keeps what their counters hold
    (only where it ``create``s: else it compares), and a rule whose counters it keeps
    under another meaning is refused (``Store.keep_rules``). ``lock_wait``: see
    ``stores.open_store``. ``stopping``: whether a stop was asked for; one asked for
    before the meanings are kept, or in a wait for a lock to keep them, raises
    ``StoppedOpening`` (see ``Store.stopping``). ``as_is`` (not ``create``): a sqlite
    file that lacks tables or columns is taken as it is, for a command that only reads
    its rules' meanings and counters: a start adds what is missing (none of which holds
    a meaning)."""
    from stores import open_store
    from stores.base import redacted

    try:
        if create:
            await _refuse_foreign_as_is(url, lock_wait)
        # a store not made here is not changed by opening it: a sqlite file's journal mode
        # stays (a dry run, a check)
        store = open_store(
            url, lock_wait=lock_wait, password=store_password(os.environ), wal=create
        )
        try:
            if create and url.startswith(("memory:", "sqlite:")):
                refuse_foreign = getattr(store, "refuse_foreign", None)
                if refuse_foreign is not None:  # sqlite: not another program's file
                    refuse_foreign()
                await store.init()
            else:
                try:
                    await store.check()
                except StoreNotInitialized:
                    if not (as_is and url.startswith("sqlite:")):
                        raise
            if rules is not None:
                if stopping is not None and stopping():  # noted in a wait just ended
                    raise StoppedOpening("stopped before the rules' meanings were kept")
                store.stopping = stopping
                try:
                    await store.keep_rules(rules, keep=create)
                finally:
                    store.stopping = None
        except BaseException:
            # the failed store may hold a client and its connection pool: release them
            await store.close()
            raise
    except StoreNotInitialized as exc:
        # the store's own hint, without the URL, gives way to the whole command; logs and
        # messages never show a password, so the command is then to complete by hand
        shown = redacted(url)
        masked = "" if shown == url else " (with the password and options masked here)"
        raise CommandFailed(
            f"store: {exc.missing}: run `limitflow store init --store '{shown}'`{masked}",
            EXIT_STORE,
        ) from None
    except RuleChanged as exc:
        raise CommandFailed(f"rules: {exc}", EXIT_USAGE) from None
    except (StoreError, ConfigError) as exc:
        raise CommandFailed(f"store: {exc}", EXIT_STORE) from None
    except ValueError as exc:  # a driver's word on an endpoint it cannot use, at first use
        raise CommandFailed(f"store: {redacted(url)}: {exc}", EXIT_STORE) from None
    return store


def _holds_something(path: str) -> bool:
    """Whether ``path`` is a file with something in it (a stat: no wait worth a thread)."""
    return os.path.isfile(path) and os.path.getsize(path) > 0


async def _refuse_foreign_as_is(url: str, lock_wait: float | None) -> None:
    """Refuse another program's sqlite file (``refuse_foreign``) before a store is opened
    on it to be made: that opening switches the file to WAL, a change to the other
    program's file that stayed after the refusal. Opened here as it is, changing nothing."""
    from stores import embedded, open_store

    path = embedded(url)[1]
    if path is None or not _holds_something(path):
        return  # not sqlite, or a file to make: no other program's
    probe = open_store(url, lock_wait=lock_wait, wal=False)
    try:
        refuse_foreign = getattr(probe, "refuse_foreign", None)
        if refuse_foreign is not None:
            refuse_foreign()
    finally:
        await probe.close()


@contextlib.contextmanager
def _open_binary(path: str, mode: str) -> Iterator[BinaryIO]:
    code = EXIT_INPUT if mode == "rb" else EXIT_USAGE
    if path == "-":
        stream = sys.stdin if mode == "rb" else sys.stdout
        if stream is None:
            which = "standard input" if mode == "rb" else "standard output"
            raise CommandFailed(f"cannot use -: {which} is closed", code)
        fd = non_blocking_fd(stream)
        if fd is not None:
            waiting = Waiting(fd)
            if mode == "rb":
                yield io.BufferedReader(waiting)
                return
            writer = io.BufferedWriter(waiting)
            with _closing(writer):
                yield writer
            return
        yield stream.buffer
        return
    try:
        handle = open(path, mode)  # noqa: SIM115 - closed below
    except OSError as exc:
        raise CommandFailed(f"cannot open {path}: {exc.strerror}", code) from None
    with _closing(handle):
        yield handle  # type: ignore[misc]


@contextlib.contextmanager
def _closing(handle: IO[bytes]) -> Iterator[None]:
    """Close ``handle`` after the block; a failure to, only when the block raised none."""
    try:
        yield
    finally:
        try:
            handle.close()
        except OSError:
            # flushing what a failed write left buffered fails the same way: the
            # first error is the one to report
            if sys.exc_info()[0] is None:
                raise


class _Outputs:
    """``--output`` and ``--dead-letter``, opened before the store and emptied only once
    the replay starts: a path that cannot be written fails before a sqlite file is made
    or a rule's meaning kept there (a refused start keeps nothing), and a replay that
    ends before it starts leaves an existing file as it was and removes one it made."""

    def __init__(self, output: str, dead_letter: str) -> None:
        self._fds: dict[str, int] = {}
        self._made: list[tuple[str, os.stat_result]] = []
        if sys.stdout is None and "-" in (output, dead_letter):
            # found only once the replay started: the other output emptied by then, and
            # the store made and the rules' meanings kept in it
            raise CommandFailed("cannot use -: standard output is closed", EXIT_USAGE)
        try:
            for path in (output, dead_letter):
                if path != "-" and path not in self._fds:
                    self._fds[path] = self._open(path)
        except BaseException:
            self.discard()
            raise
        self.output, self.dead_letter = output, dead_letter

    def _open(self, path: str) -> int:
        existed = os.path.lexists(path)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o666)
        except OSError as exc:
            raise CommandFailed(f"cannot open {path}: {exc.strerror}", EXIT_USAGE) from None
        if not existed:
            self._made.append((path, os.fstat(fd)))
        return fd

    def discard(self) -> None:
        """Close what was opened, and remove the files made here (still the same files)."""
        fds, self._fds = self._fds, {}
        for fd in fds.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        made, self._made = self._made, []
        for path, made_file in made:
            found = _stat(path, -1)
            if found is not None and os.path.samestat(found, made_file):
                with contextlib.suppress(OSError):
                    os.unlink(path)

    def start(self, files: contextlib.ExitStack) -> tuple[BinaryIO, BinaryIO]:
        """The verdicts' and dead letters' files, emptied, closed with ``files``; one
        handle for both when they are one file (neither then overwrites the other's
        lines)."""
        opened: dict[os.stat_result, BinaryIO] = {}
        handles: list[BinaryIO] = []
        fds, self._fds, self._made = self._fds, {}, []
        for path in (self.output, self.dead_letter):
            if path == "-":
                handle = files.enter_context(_open_binary(path, "wb"))
                with contextlib.suppress(OSError, ValueError):  # a stream with no file
                    found = os.fstat(handle.fileno())
                    # the other output's file (``--output F --dead-letter - > F``): each
                    # written from its own offset, one overwrote the other's lines
                    handle = next(
                        (h for f, h in opened.items() if os.path.samestat(f, found)), handle
                    )
                    opened[found] = handle
                handles.append(handle)
                continue
            fd = fds.pop(path, None)
            if fd is None:  # the same path as the output's
                handles.append(handles[0])
                continue
            found = os.fstat(fd)
            same = next(
                (h for f, h in opened.items() if os.path.samestat(f, found)),
                None,
            )
            if same is not None:  # another name of the same file
                os.close(fd)
                handles.append(same)
                continue
            if stat.S_ISREG(found.st_mode):
                os.ftruncate(fd, 0)
            handle = os.fdopen(fd, "wb")
            files.enter_context(_closing(handle))
            opened[found] = handle
            handles.append(handle)
        return handles[0], handles[1]


def _stat(path: str, stream: int) -> os.stat_result | None:
    """The file a path argument names (``-``: the standard stream ``stream``), if any."""
    try:
        return os.fstat(stream) if path == "-" else os.stat(path)
    except OSError:
        return None


def _refuse_store_outputs(args: argparse.Namespace) -> None:
    """Refuse an output that is the sqlite store's file (or its WAL or shared memory):
    opening it for writing would destroy the saved state, and the store, writing it,
    the verdicts. Asked before the store opens (the outputs exist then) and after (a
    sqlite file it has just made exists only then)."""
    from stores import embedded

    try:
        _, store_file = embedded(args.store)
    except ConfigError as exc:
        raise CommandFailed(f"store: {exc}", EXIT_STORE) from None
    if store_file is None:
        return
    for option, path in (("--output", args.output), ("--dead-letter", args.dead_letter)):
        target = _stat(path, 1)
        if target is not None and any(
            os.path.samestat(target, found)
            for found in (_stat(store_file + end, -1) for end in ("", "-wal", "-shm"))
            if found is not None
        ):
            raise CommandFailed(
                f"{option} {path} is the store's file: writing there would destroy the saved state",
                EXIT_USAGE,
            )


async def _replay(args: argparse.Namespace) -> int:
    # its handlers stay until ``main`` has the exit code (see ``_Signals.active``)
    signals = _Signals.active = _Signals()
    signals._install()  # before the rules are read: a large file takes seconds
    return await _replay_with(args, signals)


async def _replay_with(args: argparse.Namespace, signals: _Signals) -> int:
    from handlers.decide import Decider
    from stores.base import Store
    from streams.engine import Engine, fewer_collections
    from streams.replay import ReplaySummary, WriteFailed, replay

    # compared as files, not names: "-" and /dev/stdout, a symlinked folder, stdin
    # redirected from the output file
    source_file = _stat(args.input, 0)
    if source_file is not None and stat.S_ISREG(source_file.st_mode):
        for option, path in (("--output", args.output), ("--dead-letter", args.dead_letter)):
            target = _stat(path, 1)
            if target is not None and os.path.samestat(source_file, target):
                raise CommandFailed(
                    f"{option} {path} is the input file: it would be emptied before it is read",
                    EXIT_USAGE,
                )
    rules = _rules(args.rules)
    rules_file = None if args.rules == "-" else _stat(args.rules, 0)
    for option, path in (("--output", args.output), ("--dead-letter", args.dead_letter)):
        target = _stat(path, 1)
        if rules_file is not None and target is not None and os.path.samestat(rules_file, target):
            raise CommandFailed(
                f"{option} {path} is the rules file: verdicts would overwrite the rules",
                EXIT_USAGE,
            )
    if args.dry_run and _no_store_yet(args.store) and not args.store.startswith("memory:"):
        raise CommandFailed(
            f"store: {args.store}: no store there yet; a dry run decides against the"
            " counters of a store, and makes none",
            EXIT_STORE,
        )
    with contextlib.ExitStack() as files:
        # the input first: an unreadable one fails before a sqlite file is made for it;
        # then the outputs, not emptied yet: nor may one that cannot be written
        source = files.enter_context(_open_binary(args.input, "rb"))
        outputs = _Outputs(args.output, args.dead_letter)
        files.callback(outputs.discard)  # unless started: nothing then to discard
        _refuse_store_outputs(args)
        store = await signals.unless_stopped(args.store, rules, create=not args.dry_run)
        if store is None:
            say("limitflow: stopped before the replay started: nothing was decided or written")
            return EXIT_INTERRUPTED
        assert isinstance(store, Store)
        if args.dry_run:
            from stores.dry_run import DryRunStore

            store = DryRunStore(store)
        try:
            # again once the store is open: a sqlite file it has just made exists only now
            _refuse_store_outputs(args)
            verdicts, dead = outputs.start(files)
            size = os.fstat(source.fileno()).st_size if args.input != "-" else None
            summary = ReplaySummary()
            try:
                with signals, fewer_collections():
                    summary = await replay(
                        # a replay has no caller to retry it: it waits out contention on
                        # shared buckets (other writers) rather than stopping half done
                        Engine(Decider(rules), store, max_conflict_retries=REPLAY_CONFLICT_RETRIES),
                        source,
                        verdicts,
                        dead,
                        batch_size=args.batch_size or store.replay_batch_size,
                        max_line_bytes=args.max_line_bytes,
                        total_bytes=size or None,
                        stop=signals.stop,
                        summary=summary,
                    )
            except StoreError as exc:
                before = _decided(summary, (verdicts, dead), stored=not args.dry_run)
                raise CommandFailed(f"store: {exc}{before}", EXIT_STORE) from None
            except WriteFailed as exc:
                path = args.output if exc.output == "output" else args.dead_letter
                if isinstance(exc.__cause__, BrokenPipeError) and path == "-":
                    # the reader left: say so once, not again as Python exits
                    to_devnull(sys.stdout.fileno())
                kept = "" if args.dry_run or args.store.startswith("memory:") else _kept(summary)
                raise CommandFailed(f"cannot write {path}: {exc}{kept}", EXIT_INPUT) from None
            except OSError as exc:
                before = _decided(summary, (verdicts, dead), stored=not args.dry_run)
                raise CommandFailed(
                    f"cannot read {args.input}: {exc}{before}", EXIT_INPUT
                ) from None
        finally:
            await store.close()
    say(
        f"{_count(summary.lines, 'event')}: {summary.accepted} accepted, "
        f"{summary.rejected} rejected, {_count(summary.duplicates, 'duplicate')}, "
        f"{_count(summary.dead_letters, 'dead letter')} in {summary.seconds:.2f}s"
        + (" (a dry run: nothing was stored)" if args.dry_run else "")
    )
    if summary.interrupted:
        upto = f" (input lines 1-{summary.last_line})" if summary.lines else ""
        stopped = f"limitflow: stopped by a signal after {_count(summary.lines, 'event')}{upto};"
        if args.dry_run:
            say(f"{stopped} a dry run stores nothing")
        else:
            again = "Send the same input again" if args.input == "-" else "Replay the same file"
            say(
                f"{stopped} they are decided and written. {again} on the same store to"
                " finish: events decided before repeat their verdicts."
            )
        return EXIT_INTERRUPTED
    return EXIT_OK


_AGAIN: Final = ": replay the same input on the same store to write them"
"""What a failed replay whose output lines are not all written says to do."""


def _decided(summary: ReplaySummary, outputs: tuple[BinaryIO, BinaryIO], *, stored: bool) -> str:
    """What a replay that failed in deciding or reading had done before (``ReplaySummary``):
    the lines of the batches decided and written (and stored, unless a dry run). Written
    only once the outputs' buffers are flushed: on a full disk that fails, and the lines
    said written were not all there (a pipe's cannot be read again)."""
    if not summary.lines:
        return ""
    before = _before(summary.lines, summary.last_line)
    try:
        for output in outputs:
            output.flush()
    except OSError as exc:
        if isinstance(exc, BrokenPipeError) and sys.stdout and output is sys.stdout.buffer:
            to_devnull(sys.stdout.fileno())  # said here, not again as Python exits
        if not stored:
            return f"{before} were decided, but not all their output lines written ({exc.strerror})"
        return (
            f"{before} were decided and stored, but not all their output lines written"
            f" ({exc.strerror}){_AGAIN}"
        )
    return f"{before} were decided and written"


def _kept(summary: ReplaySummary) -> str:
    """What the store of a replay whose output failed holds: the batches decided (the
    one whose lines failed too), not all their lines written. Replayed on the same store,
    their events repeat their verdicts: every line is then written."""
    if not summary.decided:
        return ""
    before = _before(summary.decided, summary.decided_last_line)
    return f"{before} were decided and stored, not all their output lines written{_AGAIN}"


def _before(events: int, last_line: int) -> str:
    """The events a failed replay had decided: "; before it, 2 events (input lines 1-2)"."""
    return f"; before it, {_count(events, 'event')} (input lines 1-{last_line})"


def _count(n: int, noun: str) -> str:
    """``n`` and ``noun``, plural unless ``n`` is 1: "1 duplicate", "3 dead letters"."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


class _Signals:
    """SIGINT and SIGTERM during a replay. The first ends it after the batch in hand (the
    outputs then hold exactly the lines decided; a read waiting on a pipe is cut short);
    a second stops at once (``KeyboardInterrupt``: exit 130, nothing is half stored).

    Python-level handlers, not the event loop's: the reads and writes block the loop's
    thread, where only such a handler can interrupt them."""

    active: ClassVar[_Signals | None] = None
    """The replay's, once made: its handlers outlive the replay, through the event loop's
    end, until ``main`` has the exit code (``_end_signals``). Put back any earlier, and a
    SIGTERM while the loop closed ended a finished replay with 143."""

    def __init__(self) -> None:
        from streams.replay import Interruption

        self.stop = Interruption()
        self.over = False
        """Set once the replay is over: a first signal then is only noted."""
        self.starting = True
        """Until the store opens (the rules read, the outputs opened, not emptied): a
        first signal stops at once, nothing decided or written. The default action ended
        the process with 143, without a word."""
        self._before: dict[int, Any] = {}
        self._opening: tuple[asyncio.AbstractEventLoop, asyncio.Event] | None = None
        """While the store opens (its servers may be waited for): a first signal sets
        the event, on its loop."""

    async def unless_stopped(self, url: str, rules: RuleSet, *, create: bool) -> object | None:
        """The store of ``url``, opened as ``open_ready_store`` does (``create``: see
        there), with the handlers installed: None if a signal comes first (the default
        action ended the process with 143, without a word)."""
        from limitflow.run_cli import store_unless_stopped

        self._install()
        stopped = asyncio.Event()
        self._opening = asyncio.get_running_loop(), stopped
        self.starting = False
        try:
            return await store_unless_stopped(
                url,
                rules,
                stopped,
                consumer=False,
                create=create,
                stopping=lambda: self.stop.requested,  # noted by the handler at once
            )
        finally:
            self._opening = None

    def _install(self) -> None:
        if not self._before:
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._before[sig] = signal.signal(sig, self._handle)

    def __enter__(self) -> _Signals:
        self._install()
        self.starting = False
        return self

    def _handle(self, signum: int, _frame: object) -> None:
        from streams.replay import Interrupted

        name = signal.Signals(signum).name
        if self.stop.requested:
            say(f"limitflow: {name}: stopping now")
            raise KeyboardInterrupt
        self.stop.requested = True
        if self.over:
            say(f"limitflow: {name}: the replay is over; finishing (again to stop at once)")
            return
        if self.starting:
            say(
                f"limitflow: {name}: stopped before the replay started: nothing was decided"
                " or written"
            )
            raise KeyboardInterrupt
        if self._opening is not None:
            say(f"limitflow: {name}: stopping before the replay starts (again to stop at once)")
            loop, stopped = self._opening
            loop.call_soon_threadsafe(stopped.set)
            return
        say(f"limitflow: {name}: finishing the batch in hand (again to stop at once)")
        if self.stop.reading:
            raise Interrupted

    def __exit__(self, *exc: object) -> None:
        # the handlers stay (``restore`` or ``main`` ends them): with the default actions
        # back, a SIGTERM while the store closed and the summary was said ended the
        # process with 143 and no summary
        self.over = True

    def restore(self) -> None:
        """Put back the handlers there were before (once the command is done)."""
        for sig, before in self._before.items():
            signal.signal(sig, before)
        self._before.clear()


def _rules_check(args: argparse.Namespace) -> int | Coroutine[Any, Any, int]:
    rules = _rules(args.rules)
    from schemas.zones import DATA_VERSION

    out(
        f"{args.rules}: {_count(len(rules.rules), 'rule')}, version {rules.version},"
        f" zone data IANA {DATA_VERSION}"
    )
    for rule in rules.rules:
        limits = []
        if rule.max_count is not None:
            limits.append(f"count <= {rule.max_count}")
        if rule.max_amount is not None and rule.currency is not None:
            from schemas.amounts import format_minor
            from schemas.currencies import MINOR_UNITS

            limits.append(
                f"amount <= {format_minor(rule.max_amount, MINOR_UNITS[rule.currency])} "
                f"{rule.currency}"
            )
        if rule.window.value == "transaction":  # no bucket: no period, and no zone
            where = [f"each payment alone (those with {'+'.join(rule.scope)})"]
        else:
            where = [f"per {'+'.join(rule.scope)}", f"{rule.window.value} ({rule.timezone})"]
        if rule.currency and rule.max_amount is None:
            where.append(f"{rule.currency} only")
        for field, allowed in rule.match:
            where.append(f"{field} in {sorted(allowed)}")
        out(f"  {rule.id}: {' and '.join(limits)}, {', '.join(where)}")
    _note_wide_rules(rules)
    if args.store is None:
        return EXIT_OK
    if _no_store_yet(args.store):
        out(f"{args.store}: no store there yet: it will keep these rules")
        return EXIT_OK
    return _rules_check_store(args.store, rules)


def _no_store_yet(url: str) -> bool:
    """Whether ``url`` names a store that holds nothing yet, known without opening it
    (opening a sqlite file makes it): memory://, or a sqlite file not made yet in a
    folder that exists (else opening it says what is wrong), or still empty. A bad URL:
    ``CommandFailed``."""
    from stores import embedded

    try:
        _, path = embedded(url)
    except ConfigError as exc:
        raise CommandFailed(f"store: {exc}", EXIT_STORE) from None
    if path is None:
        return url.startswith("memory:")
    if os.path.exists(path):
        return os.path.getsize(path) == 0  # made, and nothing written yet
    return os.path.isdir(os.path.dirname(path) or ".")


async def _on_store(url: str, work: Callable[[Any], Awaitable[int]]) -> int:
    """``work`` done on the store of ``url`` (made by nothing here; closed after), and its
    refusals as the commands say them."""
    from stores.base import CountersLive, Store

    # a file a start would take, lacking what it adds (older, or left without tables),
    # was refused with the advice to run `store init`, whose columns broke the inserts
    # of older consumers still writing it
    store = await open_ready_store(url, create=False, as_is=True)
    assert isinstance(store, Store)
    try:
        return await work(store)
    except RuleChanged as exc:
        raise CommandFailed(f"rules: {exc}", EXIT_USAGE) from None
    except CountersLive as exc:
        raise CommandFailed(f"{exc} (or pass --force)", EXIT_USAGE) from None
    except StoreError as exc:
        raise CommandFailed(f"store: {exc}", EXIT_STORE) from None
    finally:
        await store.close()


async def _rules_check_store(url: str, rules: RuleSet) -> int:
    """Whether a store would take ``rules``: what it keeps of each rule's counters,
    compared and never written (see ``Store.keep_rules``)."""
    from stores.base import redacted

    known = await _on_store(url, lambda store: store.keep_rules(rules, keep=False))
    counting = sum(counter_meaning(rule) is not None for rule in rules.rules)
    new = counting - known
    kept = f"{_count(known, 'rule')} kept there unchanged" if known else "none kept there yet"
    fresh = f", {new} new: kept at the first start" if new else ""
    # a transaction window keeps no counters: nothing of it is kept, or can differ
    alone = len(rules.rules) - counting
    single = f", {_count(alone, 'transaction rule')} (no counters)" if alone else ""
    out(f"{redacted(url)}: takes these rules ({kept}{fresh}{single})")
    return EXIT_OK


def _note_wide_rules(rules: RuleSet) -> None:
    """Say so when more rules may apply to one event than every store can commit."""
    from handlers.decide import MAX_APPLICABLE_RULES, Decider
    from stores.base import MAX_TRANSACT_ITEMS
    from streams.engine import max_applicable_rules

    widest = Decider(rules, compiled=False).widest()
    dynamo = max_applicable_rules(MAX_TRANSACT_ITEMS)
    if widest > dynamo:
        out(
            f"note: up to {widest} rules may apply to one event; an event that more than"
            f" {MAX_APPLICABLE_RULES} apply to ({dynamo} on DynamoDB) becomes an"
            " invalid_event dead letter"
        )


async def _store_init(args: argparse.Namespace) -> int:
    from stores import open_store
    from stores.base import redacted

    try:
        store = open_store(args.store, password=store_password(os.environ))
        try:
            await store.init()
        finally:
            await store.close()
    except LimitflowError as exc:
        raise CommandFailed(f"store: {exc}", EXIT_STORE) from None
    except ValueError as exc:  # a driver's word on an endpoint it cannot use
        raise CommandFailed(f"store: {redacted(args.store)}: {exc}", EXIT_STORE) from None
    out(f"{redacted(args.store)}: ready")
    return EXIT_OK


def _store_forget_rule(args: argparse.Namespace) -> int | Coroutine[Any, Any, int]:
    if _no_store_yet(args.store):
        out(f"{args.store}: keeps nothing for rule {args.rule_id!r}")
        return EXIT_OK
    return _forget_rule(args.store, args.rule_id, args.force)


async def _forget_rule(url: str, rule_id: str, force: bool) -> int:
    from stores.base import redacted

    forgotten = await _on_store(url, lambda store: store.forget_rule(rule_id, force=force))
    if not forgotten:
        out(f"{redacted(url)}: keeps nothing for rule {rule_id!r}")
    else:
        out(
            f"{redacted(url)}: forgot what the counters of rule {rule_id!r} hold"
            f" ({_count(forgotten, 'window')}); the next start keeps the rules file's"
        )
    return EXIT_OK


class _Parser(argparse.ArgumentParser):
    """A parser whose commands refuse an option they do not know with their own usage:
    argparse left it to the top level, whose usage (``limitflow [-h] {replay,…}``) told
    the user nothing about the command's options. (Every subparser is of this class.)"""

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        parsed, extra = super().parse_known_args(args, namespace)
        if extra and self._subparsers is None:  # a command's own parser
            self.error(f"unrecognized arguments: {' '.join(extra)}")
        return parsed, extra


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every subcommand."""
    parser = _Parser(prog="limitflow", description="Payment velocity limits over event streams.")
    # of _Parser (argparse makes subparsers of the parser's class), typed as the base
    commands = cast(
        "argparse._SubParsersAction[argparse.ArgumentParser]",
        parser.add_subparsers(dest="command", required=True),
    )

    replay = commands.add_parser("replay", help="decide a file of events (JSON lines)")
    replay.add_argument("--rules", required=True, help="rules file (YAML)")
    replay.add_argument(
        "--input", required=True, help="events, one JSON object a line; - for stdin"
    )
    replay.add_argument("--output", required=True, help="verdicts file; - for stdout")
    replay.add_argument("--dead-letter", required=True, help="dead letters file; - for stdout")
    replay.add_argument(
        "--store",
        default=DEFAULT_STORE,
        help=f"state store URL: memory://, sqlite:///PATH, mongodb://…, dynamodb://… "
        f"(default {DEFAULT_STORE}, run's default too: a trial replay beside a run on its "
        "default counts into that run's state; LIMITFLOW_STORE is run's and is not read "
        "here)",
    )
    replay.add_argument(
        "--dry-run",
        action="store_true",
        help="decide against the store as it is and write the verdicts and dead letters,"
        " but store nothing: the verdicts these events would get now (each sees the ones"
        " before it); the store must exist, and new rules are not kept",
    )
    replay.add_argument(
        "--max-line-bytes",
        type=_positive,
        default=MAX_MESSAGE_BYTES,
        help=f"longest input line read (default {MAX_MESSAGE_BYTES:,}, as run's"
        " --max-message-bytes): a longer one is dead-lettered by its size and SHA-256",
    )
    # records per batch; by default the store's (Store.replay_batch_size)
    replay.add_argument("--batch-size", type=_positive, help=argparse.SUPPRESS)
    replay.set_defaults(handler=_replay)

    rules = commands.add_parser("rules", help="work with rules files")
    rules_commands = rules.add_subparsers(dest="rules_command", required=True)
    check = rules_commands.add_parser("check", help="validate and summarise a rules file")
    check.add_argument("rules")
    check.add_argument(
        "--store",
        help="also check the rules against this store: a rule whose counters of a window it"
        " keeps under another zone, currency or scope would be refused (nothing is kept)",
    )
    check.set_defaults(handler=_rules_check)

    store = commands.add_parser("store", help="manage a state store")
    store_commands = store.add_subparsers(dest="store_command", required=True)
    init = store_commands.add_parser("init", help="create tables, collections and indexes")
    init.add_argument("--store", required=True, help="state store URL")
    init.set_defaults(handler=_store_init)
    forget = store_commands.add_parser(
        "forget-rule",
        help="forget what a rule's counters hold (its zone, currency and scope, in every"
        " window), so that the next start keeps them anew: refused while any of its"
        " counters has not expired",
    )
    forget.add_argument("rule_id")
    forget.add_argument(
        "--force",
        action="store_true",
        help="forget even while counters of the rule have not expired (a damaged record:"
        " start again with the rule unchanged, which keeps its meaning anew)",
    )
    forget.add_argument("--store", required=True, help="state store URL")
    forget.set_defaults(handler=_store_forget_rule)

    for register in EXTRA_COMMANDS:
        register(commands)
    return parser


from limitflow.run_cli import register_commands as _run_commands  # noqa: E402

EXTRA_COMMANDS: list[Callable[[argparse._SubParsersAction[argparse.ArgumentParser]], None]] = [
    _run_commands
]
"""Registrars of subcommands that live with their runtime (``run``, ``topics``)."""


def main(argv: Sequence[str] | None = None, *, console: bool = False) -> int:
    """Entry point of the ``limitflow`` console script (``console``: the process ends
    when this returns, see ``_end_signals``)."""
    args = build_parser().parse_args(argv)
    try:
        outcome = args.handler(args)
        code: int = asyncio.run(outcome) if asyncio.iscoroutine(outcome) else outcome
    except CommandFailed as exc:
        say(f"limitflow: {exc}")
        return exc.code
    except StdoutFailed as exc:
        say(f"limitflow: {exc}")
        return EXIT_INPUT
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # the reader of stdout left (`limitflow rules check … | head`): nothing more to
        # say, and not again as Python flushes stdout on exit
        to_devnull(sys.stdout.fileno())
        return 141  # as a shell reports a process that SIGPIPE ended
    finally:
        _end_signals(console)
    return code


def _end_signals(console: bool) -> None:
    """The exit code is decided: a replay's stop signals are now ignored until the process
    ends (``console``), or the handlers there were before are back (a caller goes on)."""
    signals, _Signals.active = _Signals.active, None
    if signals is None:
        return
    if console:
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_IGN)
    else:
        signals.restore()


if __name__ == "__main__":
    sys.exit(main(console=True))
