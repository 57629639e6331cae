"""``python -m weightlift ...`` and the ``weightlift`` command that ``pip install`` brings: the weightlift command
line (``inspect``, ``generate``, ``load``, ``bench``, ``probe``, ``pack``, ``unpack``, ``checksum``), the same
program as the ``weightlift`` binary built with cargo, run in this process by the native module. It logs warnings,
more with ``-v`` / ``-vv``, as the binary does."""

from __future__ import annotations

import sys


def _log_level(argv: "list[str]") -> int:
    """The ``logging`` level the binary's ``-v`` flags ask for."""
    import logging

    verbose = sum(a.count("v") for a in argv if a.startswith("-") and not a.startswith("--") and set(a[1:]) == {"v"})
    verbose += argv.count("--verbose")
    return (logging.WARNING, logging.INFO, logging.DEBUG)[min(verbose, 2)]


def main(argv: "list[str] | None" = None) -> int:
    """Runs the command line ``argv`` (``sys.argv[1:]`` by default); returns its exit status."""
    import logging
    import signal
    import threading

    from . import _native

    argv = list(sys.argv[1:] if argv is None else argv)
    # The engine's events reach the `weightlift` logger; the binary prints them to stderr the same way.
    logging.basicConfig(level=_log_level(argv), stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    # The command handles its own signals where it has something to clean up (a load, a write), as the binary does;
    # elsewhere Ctrl-C and SIGTERM end the process at once, not at Python's next bytecode.
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    sys.stdout.flush()
    return _native.cli_main(["weightlift", *argv])


if __name__ == "__main__":
    sys.exit(main())
