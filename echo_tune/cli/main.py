"""The ``echo-tune`` command: a thin dispatcher over the library.

Each subcommand lives in its own module with ``add_parser(subparsers)`` and ``run(args) -> int``.
Errors raised on purpose (``EchoTuneError``) print one line on stderr and exit with code 2.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import os
import signal
import sys
import threading

from echo_tune import __version__
from echo_tune.cli.checked_args import guard_numeric_flags
from echo_tune.cli.progress import STOP
from echo_tune.errors import EchoTuneError
from echo_tune.io import os_error_message

# each subcommand is the module of its name under echo_tune.cli
SUBCOMMANDS = ("simulate", "search", "rank", "bench", "calibrate", "validate", "profile", "emulate", "presets",
               "plan")


class _Parser(argparse.ArgumentParser):
    """argparse that reports usage errors in one line with exit code 2."""

    def error(self, message: str) -> None:  # noqa: D401 - argparse API
        sys.stderr.write(f"echo-tune: error: {message} (see `{self.prog} --help`)\n")
        raise SystemExit(2)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="echo-tune", description="Find the fastest Megatron-LM layout before booking GPUs.")

    parser.add_argument("--version", action="version", version=f"echo-tune {__version__}",
                        help="print the version and exit")
    subparsers = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for name in SUBCOMMANDS:
        importlib.import_module(f"echo_tune.cli.{name}").add_parser(subparsers)
    guard_numeric_flags(parser)  # NaN, inf and out-of-range numbers: one-line usage errors, exit 2
    return parser


def _terminate(signum, frame) -> None:
    """SIGTERM (a job scheduler's time limit) is handled like Ctrl-C: finished work is kept, outputs written.
    During a search it waits for the trial in hand to be stored (see cli/progress.py ``STOP``)."""
    if STOP.deferred:
        STOP.requested = True
        return
    raise KeyboardInterrupt


def _quiet_broken_pipe() -> int:
    # the reader went away (`echo-tune simulate --json | head -1`): stop quietly, as the Python
    # docs advise, pointing stdout at devnull so the interpreter's final flush cannot fail again
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 1


LINE_OPTIONS = ("--megatron-args",)
"""Options whose value is a whole launch line: argparse takes a value that starts with '-' for an option."""


def _joined_line_values(argv: list[str]) -> list[str]:
    """``--megatron-args "--tensor-model-parallel-size=2 ..."`` as ``--megatron-args=...``: a line beginning
    with a flag would otherwise be read as echo-tune's own option ("expected one argument")."""
    out, i = [], 0
    while i < len(argv):
        if argv[i] in LINE_OPTIONS and i + 1 < len(argv) and argv[i + 1].startswith("-"):
            out.append(f"{argv[i]}={argv[i + 1]}")
            i += 2
            continue
        out.append(argv[i])
        i += 1
    return out


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(_joined_line_values(sys.argv[1:] if argv is None else argv))
    except SystemExit as exc:  # usage errors (exit 2) and --help (exit 0) as a return code
        return exc.code if isinstance(exc.code, int) else 2
    _quiet_resource_tracker()
    in_main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _terminate) if in_main else None
    try:
        return _dispatch(args)
    finally:
        if in_main:
            signal.signal(signal.SIGTERM, previous)

            STOP.deferred = STOP.requested = False


TRACKER_WARNINGS = "ignore:resource_tracker:UserWarning"
"""loky's resource tracker (its own interpreter, started with this process's environment) warns, after the last
line of a search interrupted by a signal to the process group, of semaphores it unlinks that a killed worker left
registered ("resource_tracker: /loky-...: FileNotFoundError", tests/cli/test_sigterm.py): nothing a user can act
on, and the search has already said what it kept."""


def _quiet_resource_tracker() -> None:
    """Pass ``TRACKER_WARNINGS`` to the processes a command starts (not to this one's own warnings)."""
    current = os.environ.get("PYTHONWARNINGS", "")
    if TRACKER_WARNINGS not in current.split(","):
        os.environ["PYTHONWARNINGS"] = ",".join(filter(None, (current, TRACKER_WARNINGS)))


def _dispatch(args: argparse.Namespace) -> int:
    try:
        return int(args.run(args) or 0)
    except EchoTuneError as exc:
        sys.stderr.write(f"echo-tune {args.command}: error: {exc}\n")
        return 2
    except OSError as exc:
        if isinstance(exc, BrokenPipeError):
            return _quiet_broken_pipe()
        # a file problem no loader caught on purpose: still one line, never a traceback (issue 10)
        sys.stderr.write(f"echo-tune {args.command}: error: {os_error_message(exc)}\n")
        return 2
    except UnicodeDecodeError as exc:
        sys.stderr.write(f"echo-tune {args.command}: error: a file is not UTF-8 text ({exc.reason} at byte "
                         f"{exc.start}); save it as UTF-8\n")
        return 2
    except KeyboardInterrupt:
        sys.stderr.write(f"echo-tune {args.command}: interrupted\n")
        return 130


_CONSOLE = {"exits_after_command": False}


def exits_after_command() -> bool:
    """Whether this process ends when the command returns (the installed ``echo-tune``, not ``main()`` called
    from Python): a command may then leave what it made to the exit (``search``: frozen, not collected)."""
    return _CONSOLE["exits_after_command"]


def console() -> None:
    """The installed ``echo-tune`` command: ``main()``, then a quick exit. A search's process holds its study
    (tens of thousands of trials) and its worker processes their caches; the interpreter's exit ran a full
    collection over the one (~0.5 s after a Qwen3-30B-A3B search) and waited for the others to free theirs
    (~0.7 s). Nothing is left to save by then: the workers are ended (``stop_workers``) and what this process
    holds is frozen (``gc.freeze``), so the exit skips that collection; atexit handlers still run."""
    _CONSOLE["exits_after_command"] = True
    code = main()
    workers = sys.modules.get("echo_tune.search.engines.workers")  # loaded by the commands that search
    if workers is not None:
        workers.stop_workers()
    gc.freeze()
    raise SystemExit(code)


if __name__ == "__main__":
    console()
