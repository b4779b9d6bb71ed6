"""The ``shadefs`` console script: :func:`run` wraps :func:`shadefs.cli.main` so that Ctrl-C at any
moment, the imports included, ends with one line on stderr and exit status 130, never a traceback.

Kept small and imported first: the SIGINT handler is in place before the command's modules load.
"""
import signal
import sys

__all__ = ["run"]


def _said_mount(argv) -> bool:
    """Whether the command line is ``shadefs [options] mount ...`` (read before argparse has run)."""
    return next((a for a in argv if not a.startswith("-")), None) == "mount"


def run(argv=None) -> int:
    """Run the command line ``argv`` (default ``sys.argv[1:]``); return its exit status.

    Ctrl-C (SIGINT) raises KeyboardInterrupt from the first line on; one that no command handled itself
    is answered here with ``shadefs: interrupted`` (``; nothing is mounted`` for ``mount``, which handles
    one arriving after its daemon started itself) and status 130. Further SIGINTs are ignored from then
    on, so the line is printed once and the exit is clean."""
    signal.signal(signal.SIGINT, signal.default_int_handler)  # also where the parent left SIGINT ignored
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        from .config import pause_point

        pause_point("cli-start")
        from .cli import main

        code = main(argv)
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # done: a late Ctrl-C changes nothing now
        return code
    except KeyboardInterrupt:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        print("shadefs: interrupted" + ("; nothing is mounted" if _said_mount(argv) else ""), file=sys.stderr,
              flush=True)
        return 130


def console() -> None:
    """The console script's entry point: :func:`run`, then exit with its status."""
    sys.exit(run())
