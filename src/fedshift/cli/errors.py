"""The one error handler of the command line.

A user error (:class:`~fedshift.core.errors.FedshiftError`, or an ``OSError`` such as a
missing file) ends in one line ``fedshift: error: ...`` on stderr and exit code 2; Ctrl-C in
``fedshift: interrupted...`` and exit code 130. Bugs keep their traceback.
"""

from __future__ import annotations

import argparse
import errno
import os
import re
import sys
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from fedshift.core.errors import FedshiftError, RunInterrupted, StorageError, did_you_mean

EXIT_USAGE = 2
#: exit status after Ctrl-C (128 + SIGINT), as shells report it
EXIT_INTERRUPTED = 130


def fail(message: object) -> int:
    """Report an error as one line on stderr; the exit code of a usage error."""
    text = " ".join(str(message).split())
    print(f"fedshift: error: {text}", file=sys.stderr)
    return EXIT_USAGE


class HelpFormatter(argparse.HelpFormatter):
    """argparse's help layout, but a name such as ``office-caltech10`` is never broken at
    its hyphen."""

    def _split_lines(self, text: str, width: int) -> list[str]:
        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False)


class ArgumentParser(argparse.ArgumentParser):
    """argparse that reports errors as one line (with a did-you-mean) and exit code 2."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str):  # noqa: D401 - argparse API
        choice = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
        if choice:
            message += did_you_mean(choice.group(1), re.findall(r"'([^']*)'", choice.group(2)))
        print(f"fedshift: error: {message}", file=sys.stderr)
        raise SystemExit(EXIT_USAGE)


def add_force_flag(parser: argparse.ArgumentParser, flag: str = "--out") -> None:
    """``--force``: the one way to let a command write over a file fedshift did not write
    (the rule of :mod:`fedshift.core.outputs`)."""
    parser.add_argument(
        "--force",
        action="store_true",
        help=f"replace the file at {flag} even when fedshift did not write it",
    )


def run_again(args: argparse.Namespace, run_dir: Path) -> str:
    """What to do after a failed write, unless a command knows better."""
    return "run the same command again"


def no_hint(args: argparse.Namespace, stop: RunInterrupted) -> str:
    """Nothing to add after ``fedshift: interrupted``."""
    return ""


@dataclass(frozen=True)
class Command:
    """One ``fedshift`` command: its parser, what it does, and how it tells the user to go on
    after Ctrl-C (``interrupted``: text after ``fedshift: interrupted``) or a failed write
    (``after_write_error``: what to do once the disk is fixed)."""

    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]
    interrupted: Callable[[argparse.Namespace, RunInterrupted], str] = no_hint
    after_write_error: Callable[[argparse.Namespace, Path], str] = run_again


#: errno values of a folder that refuses writes, as opposed to a full disk
READ_ONLY_ERRNOS = (errno.EROFS, errno.EACCES, errno.EPERM)


def storage_advice(exc: StorageError) -> str:
    """What to fix after a failed write: a read-only folder is not cured by free space."""
    cause = exc.__cause__
    if isinstance(cause, OSError) and cause.errno in READ_ONLY_ERRNOS:
        return f"{exc.path.parent} is read-only: make it writable (or use another --out)"
    return "free some space (or fix the folder)"


def run_command(command: Command, args: argparse.Namespace) -> int:
    """``command.run(args)`` with every user error and Ctrl-C turned into one stderr line."""
    try:
        return command.run(args)
    except RunInterrupted as stop:
        print(f"fedshift: interrupted{command.interrupted(args, stop)}", file=sys.stderr)
        return EXIT_INTERRUPTED
    except KeyboardInterrupt:
        print("fedshift: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # `fedshift list models | head`: the reader stopped, no error
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # nothing left to flush at exit either
        return 1
    except StorageError as exc:
        then = command.after_write_error(args, exc.path.parent)
        return fail(f"{exc}; {storage_advice(exc)}, then {then}")
    except (FedshiftError, OSError) as exc:
        return fail(exc)
