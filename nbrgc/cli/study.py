"""nbrgc-study: train BP and RGC on paired seeds (same init, same batches, same token budget),
compare final validation bpb, and test RGC's non-inferiority at a margin (t-interval over seeds;
paired bootstrap alongside). Runs are cached and resumable in --out: rerun the same command to
continue an interrupted study or to re-print its table.

Example: nbrgc-study --dataset ../shared/data/enwik6 --config small --methods bp,rgc-async \\
             --seeds 5 --tokens 2000000 --margin 0.01 --out studies/small-enwik6 --plot
"""
import argparse
import sys

from . import OneLineParser, finite_number, run_main, workers


def build_parser():
    p = OneLineParser(prog="nbrgc-study", description=__doc__,
                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dataset", "--data", dest="dataset", default="default",
                   help="enwik8 | tinystories | default | text:PATH | a file path (default: default)")
    p.add_argument("--data-dir", default=None)
    p.add_argument("--config", default="small", help="preset: tiny | small | paper (default small)")
    for name in ("n-layer", "d-model", "n-head", "ctx"):
        p.add_argument(f"--{name}", type=int, default=None, help=f"override the preset's {name}")
    p.add_argument("--methods", default="bp,rgc-async", help="bp plus rgc-async and/or rgc-sync")
    p.add_argument("--seeds", default="5", help="a count N (seeds 0..N-1) or a list 0,3,7 (default 5)")
    p.add_argument("--steps", type=int, default=None, help="optimizer steps per run (default 300)")
    p.add_argument("--tokens", type=int, default=None, help="token budget per run (wins over --steps)")
    p.add_argument("--margin", type=finite_number, default=0.01, help="non-inferiority margin (default 0.01)")
    p.add_argument("--conf", type=finite_number, default=0.95, help="confidence level (default 0.95)")
    p.add_argument("--bootstrap", type=int, default=10000, help="bootstrap resamples (default 10000)")
    p.add_argument("--batch", type=int, default=None, help="sequences per step (default: preset's)")
    p.add_argument("--seq", type=int, default=0, help="sequence length (0: ctx)")
    p.add_argument("--lr", type=finite_number, default=1e-3)
    p.add_argument("--warmup", type=int, default=None, help="warm-up steps (default 5%% of steps)")
    p.add_argument("--eval-every", type=int, default=None, help="steps between evaluations (and "
                   "checkpoints; default steps/10)")
    p.add_argument("--eval-batches", type=int, default=8, help="held-out batches per evaluation")
    p.add_argument("--n-stages", type=int, default=None, help="RGC stages (default 4 or the largest "
                   "divisor of n_layer below it)")
    p.add_argument("--stage-threads", default="auto", help="rgc-async thread groups")
    p.add_argument("--stage-workers", type=workers, default=0,
                   help="rgc-async worker threads the stages share (auto: one per stage, or the "
                        "most with equal shares of the stages when --threads is below the stage count)")
    p.add_argument("--attention", default="store",
                   help="store | recompute the attention probabilities for the backward")
    p.add_argument("--max-staleness", type=int, default=1)
    p.add_argument("--threads", type=int, default=0, help="thread budget (0: all cores)")
    p.add_argument("--out", required=True, help="study folder: runs/, study.json, curves.png")
    p.add_argument("--plot", action="store_true", help="learning-curve PNG (needs matplotlib)")
    p.add_argument("--delete-checkpoints", action="store_true",
                   help="remove a run's checkpoints once its result is written")
    p.add_argument("--verbose", action="store_true", help="the trainer's own notes on stderr")
    return p


def main(argv=None):
    return run_main(_main, argv)


def _main(argv):
    from .. import study
    from ..errors import ConfigError
    from ..threads import cpu_count
    a = build_parser().parse_args(argv)
    methods = study.parse_methods(a.methods)
    seeds = study.parse_seeds(a.seeds)
    if a.steps is not None and a.steps < 1:
        raise ConfigError(f"--steps must be >= 1, got {a.steps}")
    if a.threads < 0 or a.threads > 4 * cpu_count():
        raise ConfigError(f"--threads must be 0..{4 * cpu_count()}, got {a.threads}")
    if not 0 < a.conf < 1:
        raise ConfigError(f"--conf must be in (0, 1), got {a.conf}")
    if a.bootstrap < 1:
        raise ConfigError(f"--bootstrap must be >= 1, got {a.bootstrap}")
    if a.n_stages is not None and a.n_stages < 1:
        raise ConfigError(f"--n-stages must be >= 1, got {a.n_stages}")
    st = study.Study(dataset=a.dataset, config=a.config, methods=methods, seeds=seeds, steps=a.steps,
                     tokens=a.tokens, margin=a.margin, out=a.out, batch=a.batch, seq=a.seq, lr=a.lr,
                     warmup=a.warmup, eval_every=a.eval_every, eval_batches=a.eval_batches,
                     n_stages=a.n_stages, stage_threads=a.stage_threads,
                     stage_workers=a.stage_workers, attention=a.attention,
                     max_staleness=a.max_staleness, threads=a.threads, data_dir=a.data_dir,
                     model_overrides=dict(n_layer=a.n_layer, d_model=a.d_model, n_head=a.n_head,
                                          ctx=a.ctx),
                     conf=a.conf, n_boot=a.bootstrap, delete_checkpoints=a.delete_checkpoints,
                     verbose=a.verbose)
    try:
        report = st.run()
    except study.StudyInterrupted as exc:
        print(f"interrupted: {exc}", file=sys.stderr)
        return 130
    path = study.write_report(report, a.out, plot=a.plot)
    sys.stdout.write(study.markdown(report))
    print(f"\nraw figures: {path}" + (f", plot: {report['plot']}" if report.get("plot") else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
