"""``python -m weightlift serve [--socket PATH] [--prepare cuda:N ...]``: the load server of :func:`weightlift.serve`
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
    args = parser.parse_args(argv)
    import weightlift

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
