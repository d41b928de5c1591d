"""nbrgc-plot: training and validation bits per byte against training tokens, one panel per run
(every stage for RGC runs), from each run folder's log.jsonl and run.json.

Example: nbrgc-plot runs/bp runs/rgc -o curves.png
Needs matplotlib: pip install 'nbrgc[plot]'.
"""
import argparse
import sys

from . import DefaultsFormatter, OneLineParser, integer, run_main


class _Formatter(DefaultsFormatter, argparse.RawDescriptionHelpFormatter):
    pass


def build_parser():
    p = OneLineParser(prog="nbrgc-plot", description=__doc__, formatter_class=_Formatter)
    p.add_argument("runs", nargs="+", metavar="RUN",
                   help="a run folder (written by nbrgc-train --out) or its log.jsonl")
    p.add_argument("-o", "--out", default="curves.png",
                   help="picture to write; the extension picks the format (png, pdf, svg)")
    p.add_argument("--dpi", type=integer, default=110, help="resolution of a raster picture")
    return p


def main(argv=None):
    return run_main(_main, argv)


def _main(argv):
    from ..errors import ConfigError
    from ..measure.plot import plot_runs
    from ..measure.runlog import load_run
    a = build_parser().parse_args(argv)
    if a.dpi < 10 or a.dpi > 1200:
        raise ConfigError(f"--dpi must be in 10..1200, got {a.dpi}")
    if not a.out.strip():
        raise ConfigError("--out needs a file name")
    runs = [load_run(r) for r in a.runs]
    for r in runs:
        if r["bad_lines"]:
            print(f"note: {r['name']}: skipped {r['bad_lines']} unreadable log line(s)", file=sys.stderr)
    plot_runs(runs, a.out, dpi=a.dpi)
    print(f"wrote {a.out} ({len(runs)} run{'s' * (len(runs) > 1)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
