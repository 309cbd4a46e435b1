"""What a user's mistake looks like on the command line: one line ``error: ...`` on stderr and exit code 2, the
traceback only with ``--debug``; names get a "did you mean"; a local folder that does not exist is said to be missing
at once (not as a Hub lookup that retries for a minute and then blames the network).

Standard library only: `tf_family.cli`, the recipes (run directly or under ``accelerate launch``) and the models'
``from_pretrained`` use it.
"""

from __future__ import annotations

import difflib
import os
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

# the exceptions tf_family raises for a bad input (house rule: each names the argument, the value and the fix)
USER_ERRORS: tuple[type[BaseException], ...] = (ValueError, TypeError, FileNotFoundError, NotImplementedError)
EXIT_USAGE = 2  # argparse's exit code for a command line it refuses
DEBUG_FLAG = "--debug"


class MissingLocalPathError(FileNotFoundError, ValueError):
    """A local file or folder that does not exist. A `FileNotFoundError` (what ``open`` raises) and a `ValueError`
    (the house rule for bad input) both catch it."""


def did_you_mean(name: str, choices: Iterable[str]) -> str:
    """`` (did you mean 'n_layer'?)`` when ``name`` is close to one of ``choices``, else an empty string."""
    close = difflib.get_close_matches(name, list(choices), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def looks_local(source: str) -> bool:
    """Whether ``source`` names a local path rather than a Hub id: it starts with ``.``, ``/`` or ``~``, holds a
    backslash or more than one ``/`` (a Hub id is ``name`` or ``owner/name``), or its first part is a local folder
    (``runs/my-run`` where ``./runs`` exists)."""
    if source.startswith((".", "/", "~")) or "\\" in source or source.count("/") > 1:
        return True
    first, sep, _ = source.partition("/")
    return bool(sep) and Path(first).is_dir()


def check_local_path(source: str | os.PathLike | None, what: str, *, always_local: bool = False) -> None:
    """Raise `MissingLocalPathError` naming ``source`` (and ``what`` it is, e.g. ``"--model_name_or_path"``) when it
    is a local path (`looks_local`, or any string with ``always_local``: a data file) that does not exist."""
    if source is None:
        return
    text = os.fspath(source)
    path = Path(text).expanduser()
    if path.exists():
        return
    if always_local or not isinstance(source, str) or looks_local(text):
        resolved = path if path.is_absolute() else Path.cwd() / path
        fix = "check the path" if always_local else "check the path, or pass a Hub id (name or owner/name)"
        raise MissingLocalPathError(f"{what} {text!r}: no such file or folder ({resolved}); {fix}.")


def one_line(error: BaseException) -> str:
    """The error's message on one line (its own lines joined)."""
    text = " ".join(line.strip() for line in str(error).strip().splitlines() if line.strip())
    return text or type(error).__name__


def report_user_error(error: BaseException, prog: str | None = None) -> int:
    """Write ``error: <message>`` and return `EXIT_USAGE`. Each process of a launch writes its own line, named by
    its rank (an error on one rank only must not go unseen)."""
    where = f"{prog}: " if prog else ""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        where = f"[rank {os.environ.get('RANK', '?')}] {where}"
    sys.stderr.write(f"{where}error: {one_line(error)} ({DEBUG_FLAG} shows the traceback)\n")
    sys.stderr.flush()
    return EXIT_USAGE


def run_main(main: Callable[[list[str]], object], argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    """Run ``main(argv)`` as a command: a user's mistake (`USER_ERRORS`) prints one line and gives exit code 2,
    unless ``--debug`` is among the arguments, which lets the traceback through. Returns 0 after a normal run, or
    ``main``'s integer result. A command is a program of our own, so it first tells the allocator to keep freed
    memory (`tf_family.allocator.keep_freed_memory`, a process-wide setting that calling the library never makes)."""
    from ..allocator import keep_freed_memory

    keep_freed_memory()
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        result = main(argv)
    except USER_ERRORS as error:
        if DEBUG_FLAG in argv:
            raise
        return report_user_error(error, prog)
    return result if isinstance(result, int) else 0


__all__ = [
    "DEBUG_FLAG",
    "EXIT_USAGE",
    "USER_ERRORS",
    "MissingLocalPathError",
    "check_local_path",
    "did_you_mean",
    "looks_local",
    "one_line",
    "report_user_error",
    "run_main",
]
