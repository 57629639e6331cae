"""``python -m weightlift serve [--socket PATH] [--prepare cuda:N ...] [--quiet]``: the load server of :func:`weightlift.serve`
for installs without the ``weightlift`` command-line program."""

from __future__ import annotations

import argparse
import sys


def main(argv: "list[str] | None" = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m weightlift")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="serve loads for other processes (see weightlift.serve)")
    serve.add_argument("--socket", default=None, help="socket to listen on (default: the default socket)")
    serve.add_argument("--prepare", action="append", default=None, metavar="DEVICE",
                       help="a device to set up before serving (repeatable; default cuda:0)")
    serve.add_argument("--quiet", action="store_true", help="log only warnings (default: each load served, at INFO)")
    args = parser.parse_args(argv)
    import logging

    import weightlift

    # The engine's events reach the `weightlift` logger: a server says what it served and what it refused.
    logging.basicConfig(level=logging.WARNING if args.quiet else logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")

    import signal

    # SIGTERM stops the server as Ctrl-C does (its socket removed), instead of ending the process where it stands.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        weightlift.serve(args.socket, args.prepare or ["cuda:0"])
    except KeyboardInterrupt:
        print("weightlift serve: stopped", file=sys.stderr)
    except weightlift.WeightliftError as e:
        print(f"weightlift serve: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
