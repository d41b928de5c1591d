"""Thin command-line front ends: parse, validate, call the library, print one-line errors."""
import argparse
import sys

from ..errors import NbrgcError


class DefaultsFormatter(argparse.HelpFormatter):
    """Shows a flag's real default: the value when it is one, nothing when the help line already
    says what the default is (``auto``, ``5% of steps``, the preset's)."""

    def _get_help_string(self, action):
        h = action.help or ""
        if ("default" in h or action.default is None or action.default is False
                or action.default == argparse.SUPPRESS or not action.option_strings):
            return h
        return (h + " " if h else "") + "(default: %(default)s)"


class OneLineParser(argparse.ArgumentParser):
    """argparse that reports a bad flag as one ``error:`` line and exit 2 (no usage dump)."""

    def error(self, message):
        print(f"error: {message} (see --help)", file=sys.stderr)
        raise SystemExit(2)


def finite_number(text):
    """argparse type: a finite float (nan and inf would silently disable checks)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if value != value or value in (float("inf"), float("-inf")):
        raise argparse.ArgumentTypeError(f"not a finite number: {text!r}")
    return value


def integer(text):
    """argparse type: an integer, with a one-line message."""
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None


def workers(text):
    """argparse type for --stage-workers: ``auto`` (0) or a positive integer."""
    from ..config import parse_stage_workers
    try:
        return parse_stage_workers(text)
    except NbrgcError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


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
