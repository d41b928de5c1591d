"""nbrgc-study: the convergence study of bounded-horizon RGC against backprop.

Every arm (bp and the RGC arms: rgc-sync, rgc-async with staleness 1 and 0, and the variants) first
sweeps its learning rate on seed 0 at --sweep-frac of the budget; then every arm runs every
seed at its own best rate (lowest final validation bpb of the sweep). Paired seeds share initial
weights and batches. The final metric is the test split's bits per byte with the full-context
sliding window of nbrgc-eval; validation bpb on fixed held-out batches gives the curves. Per RGC arm
the verdict is non-inferior iff the upper bound of the two-sided 95%% t-interval of the mean
relative gap to bp over the paired seeds is below --margin. bp has converged when its validation bpb
improved by less than 1%% over the last 20%% of its runs (reported; lengthen --tokens when it fails).

Runs are child processes (--jobs at a time, --threads each), resumable from their checkpoints in
--work; each finished run's result is a small JSON file in OUT/results/ whose key includes the
arm's numerics fingerprint (a float64 run of a few steps, rounded to 8 digits: the same on every
BLAS kernel, changed by any change of the math). Run the same command again, in a later session or
a fresh clone, to continue: finished results are reused, interrupted runs resume. SIGINT/SIGTERM
stop the runs at a checkpoint. OUT gets study.json, study.md and curves.png after every finished run.

Example (the deep study, in the background):
  nohup bin/nbrgc-study --config deep --dataset ../shared/data/enwik8-4M \\
        --out benchmarks/studies/deep-enwik8-4M > deep-study.log 2>&1 &
"""
import argparse
import shlex
import sys

from . import OneLineParser, finite_number, integer, run_main

DEFAULT_LRS = "5e-4,1e-3,2e-3,4e-3"


def build_parser():
    p = OneLineParser(prog="nbrgc-study", description=__doc__,
                      formatter_class=argparse.RawDescriptionHelpFormatter)
    d = p.add_argument_group("data and model")
    d.add_argument("--dataset", "--data", dest="dataset", default="../shared/data/enwik8-4M",
                   help="enwik8 | tinystories | default | text:PATH | a file path "
                        "(default: ../shared/data/enwik8-4M)")
    d.add_argument("--data-dir", default=None, help="download/cache folder (default: $NBRGC_DATA "
                   "or ~/.cache/nbrgc)")
    d.add_argument("--config", default="deep", help="model preset: tiny | small | paper | deep "
                   "(default: deep)")
    for name in ("n-layer", "d-model", "n-head", "ctx"):
        d.add_argument(f"--{name}", type=integer, default=None,
                       help=f"override the preset's {name} (default: the preset's)")
    s = p.add_argument_group("protocol")
    s.add_argument("--arms", default="all", help="comma list of arms (bp is always included): bp, "
                   "rgc-sync, rgc-async, rgc-async-s0, rgc-async-depthw, rgc-async-identity, "
                   "rgc-async-identity-depthw, rgc-async-k2, rgc-async-k8; the schemes between RGC "
                   "and BP: pipe (pipelined backprop), pipe-stash (with stashed weights), rgc-h1 "
                   "(losses reach one stage back, one step late; rgc-h1-d0: in the same step), "
                   "rgc-hall (local losses plus the late global gradient), rgc-readout (a private "
                   "block before each earlier stage's readout); bp-muon, pipe-muon, "
                   "rgc-async-muon (with --optimizer muon), pipe-2bw-muon (PipeDream-2BW's numerics: bp "
                   "--grad-delay 1, Muon); "
                   "and the diagnostics bp-quarter, bp-half (BP at 1/4 and 1/2 of the layers) "
                   "(default: all that fit the model)")
    s.add_argument("--seeds", default="5", help="a count N (seeds 0..N-1) or a list 0,3,7 (default: 5)")
    s.add_argument("--tokens", type=integer, default=5_000_000,
                   help="training tokens per main run (default: 5000000)")
    s.add_argument("--steps", type=integer, default=None,
                   help="optimizer steps per main run (default: from --tokens)")
    s.add_argument("--sweep-lrs", default=DEFAULT_LRS,
                   help=f"learning rates of every arm's sweep, at least 3 (default: {DEFAULT_LRS})")
    s.add_argument("--sweep-frac", type=finite_number, default=0.25,
                   help="a sweep run's budget as a fraction of a main run's (default: 0.25)")
    s.add_argument("--extend-sweep", type=integer, default=2,
                   help="when an arm's best lr is at the edge of the grid, add the next grid point "
                        "beyond it, up to this many times per arm (default: 2; 0: never)")
    s.add_argument("--phase", default="all", choices=("sweep", "main", "all"),
                   help="run only the sweep, only the main runs (needs a finished sweep), or both "
                        "(default: all)")
    s.add_argument("--margin", type=finite_number, default=0.01,
                   help="non-inferiority margin on the relative test-bpb gap (default: 0.01)")
    s.add_argument("--conf", type=finite_number, default=0.95,
                   help="confidence level of the two-sided interval (default: 0.95)")
    s.add_argument("--bootstrap", type=integer, default=10000,
                   help="paired bootstrap resamples, reported alongside (default: 10000)")
    t = p.add_argument_group("training")
    t.add_argument("--batch", type=integer, default=None, help="sequences per step (default: the "
                   "preset's, 16 for small and deep); the sequence length is the model's ctx")
    t.add_argument("--warmup-frac", type=finite_number, default=0.05,
                   help="linear warm-up as a fraction of each run (default: 0.05)")
    t.add_argument("--min-lr-frac", type=finite_number, default=0.1,
                   help="the cosine decays to this fraction of the lr (default: 0.1)")
    t.add_argument("--eval-every", type=integer, default=None,
                   help="steps between validation evaluations (and checkpoints) of a main run; "
                        "sweep runs scale it by --sweep-frac (default: 1/25 of the run)")
    t.add_argument("--eval-batches", type=integer, default=16,
                   help="fixed held-out batches per validation evaluation (default: 16)")
    t.add_argument("--n-stages", type=integer, default=None,
                   help="RGC stages (default: 4, or the largest divisor of n_layer below it)")
    t.add_argument("--test-bytes", type=integer, default=None,
                   help="score only the first N bytes of the test split (default: all of it)")
    r = p.add_argument_group("compute and output")
    r.add_argument("--jobs", type=integer, default=2,
                   help="runs at once, each a child process (default: 2; 0: one after another "
                        "inside this process, for debugging)")
    r.add_argument("--threads", type=integer, default=1, help="threads per run (default: 1)")
    r.add_argument("--out", required=True,
                   help="study folder: results/, study.json, study.md, curves.png")
    r.add_argument("--work", default=None, help="run folders with checkpoints (default: OUT/work, "
                   "git-ignored under benchmarks/studies/)")
    r.add_argument("--no-plot", action="store_true", help="skip curves.png")
    r.add_argument("--report-only", action="store_true",
                   help="rebuild study.json, study.md and curves.png from the finished runs in "
                        "OUT/results, running nothing (the arms, seeds and budget as given)")
    r.add_argument("--verbose", action="store_true", help="the trainer's notes in each child.log")
    return p


def main(argv=None):
    return run_main(_main, argv)


def build_study(argv):
    """The Study the command line ``argv`` describes, checked, nothing run or written (also how a
    test rebuilds a finished study's keys from its recorded command)."""
    from ..errors import ConfigError
    from ..measure import study
    from ..threads import cpu_count
    a = build_parser().parse_args(argv)
    arms = study.parse_arms(a.arms)
    seeds = study.parse_seeds(a.seeds)
    lrs = study.parse_lrs(a.sweep_lrs)
    for name in ("tokens", "steps", "eval_every", "eval_batches", "batch", "n_stages", "threads"):
        v = getattr(a, name)
        if v is not None and v < 1:
            raise ConfigError(f"--{name.replace('_', '-')} must be >= 1, got {v}")
    if a.threads > 4 * cpu_count():
        raise ConfigError(f"--threads must be 1..{4 * cpu_count()}, got {a.threads}")
    if a.jobs < 0:
        raise ConfigError(f"--jobs must be >= 0, got {a.jobs}")
    if not 0 < a.sweep_frac <= 1:
        raise ConfigError(f"--sweep-frac must be in (0, 1], got {a.sweep_frac}")
    if not 0 <= a.warmup_frac < 1:
        raise ConfigError(f"--warmup-frac must be in [0, 1), got {a.warmup_frac}")
    if not 0 < a.conf < 1:
        raise ConfigError(f"--conf must be in (0, 1), got {a.conf}")
    if a.bootstrap < 1:
        raise ConfigError(f"--bootstrap must be >= 1, got {a.bootstrap}")
    if a.extend_sweep < 0:
        raise ConfigError(f"--extend-sweep must be >= 0, got {a.extend_sweep}")
    st = study.Study(out=a.out, dataset=a.dataset, config=a.config, data_dir=a.data_dir,
                     model_overrides=dict(n_layer=a.n_layer, d_model=a.d_model, n_head=a.n_head,
                                          ctx=a.ctx),
                     arms=arms, seeds=seeds, tokens=a.tokens, steps=a.steps, sweep_lrs=lrs,
                     sweep_frac=a.sweep_frac, extend_sweep=a.extend_sweep, margin=a.margin,
                     conf=a.conf, n_boot=a.bootstrap, batch=a.batch, warmup_frac=a.warmup_frac,
                     min_lr_frac=a.min_lr_frac, eval_every=a.eval_every, eval_batches=a.eval_batches,
                     n_stages=a.n_stages, threads=a.threads, jobs=a.jobs, work=a.work, phase=a.phase,
                     test_bytes=a.test_bytes, plot=not a.no_plot, verbose=a.verbose,
                     command="bin/nbrgc-study " + shlex.join(x for x in argv if not _is_report_only(x)))
    st.only_report = a.report_only
    return st


def _is_report_only(arg):
    """``--report-only`` or an abbreviation argparse accepts for it (no other flag starts --re)."""
    return len(arg) > 4 and "--report-only".startswith(arg)


def _main(argv):
    from ..measure import study
    argv = list(sys.argv[1:] if argv is None else argv)
    st = build_study(argv)
    try:
        report = st.report_only() if st.only_report else st.run()
    except study.StudyInterrupted as exc:
        print(f"interrupted: {exc}", file=sys.stderr)
        return 130
    sys.stdout.write(study.markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
