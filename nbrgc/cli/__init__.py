"""Thin command-line front ends: parse, validate, call the library, print one-line errors."""
import sys

from ..errors import NbrgcError


def run_main(fn, argv=None):
    """Run ``fn(argv)``; a user error becomes one line on stderr and exit status 2."""
    try:
        return fn(argv) or 0
    except NbrgcError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
