"""nbrgc-bench: tokens/s, ms/step, peak RSS and GFLOP/s of the training modes (and the PyTorch
peer) on one config, each run in its own fresh process, rounds interleaved, same thread budget.

Example: nbrgc-bench --config small --modes bp,rgc-sync,rgc-async,torch --threads 2 --repeats 3 \\
             --warmup-steps 3 --steps 20 --gemm-peak --out bench.json --plot
"""
import argparse
import sys

from . import OneLineParser, integer, run_main


def build_parser():
    p = OneLineParser(prog="nbrgc-bench", description=__doc__,
                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="small", help="preset: tiny | small | deep | paper | demo (default small)")
    for name in ("n-layer", "d-model", "n-head", "ctx"):
        p.add_argument(f"--{name}", type=int, default=None, help=f"override the preset's {name}")
    p.add_argument("--modes", default="bp,rgc-sync,rgc-async",
                   help="comma list of modes (bp, rgc-sync, rgc-async, pipe-sync, pipe-async), study "
                        "arms (nbrgc-study --help: e.g. rgc-h1, pipe-muon; a pipe-sync arm with :async, e.g. "
                        "rgc-h1:async, runs on the stage worker threads) and torch (default "
                        "bp,rgc-sync,rgc-async)")
    p.add_argument("--threads", default="2", help="thread budget, or a sweep: 1,2,4 (default 2)")
    p.add_argument("--repeats", type=int, default=3, help="interleaved rounds (default 3)")
    p.add_argument("--warmup-steps", type=int, default=3, help="untimed steps first (default 3)")
    p.add_argument("--steps", type=int, default=20, help="timed steps per run (default 20)")
    p.add_argument("--batch", type=int, default=None, help="sequences per step (default: preset's)")
    p.add_argument("--seq", type=int, default=0, help="sequence length (0: ctx)")
    p.add_argument("--n-stages", type=int, default=None, help="RGC stages (default 4, or the largest "
                   "divisor of n_layer below it)")
    p.add_argument("--stage-threads", default="auto",
                   help="rgc-async thread groups: auto (split --threads) or 2,1,1,1")
    p.add_argument("--stage-groups", default=None,
                   help="rgc-async stage-group sweep, ':'-separated: auto:2,1,1,1:1,1,1,1 "
                        "(overrides --stage-threads)")
    p.add_argument("--attention", default="store",
                   help="nbrgc modes: store | recompute the attention probabilities for the backward, "
                        "or both side by side: store,recompute")
    p.add_argument("--stage-workers", default="auto",
                   help="rgc-async worker threads the stages share, or a sweep: auto,2,4 (auto: one "
                        "per stage, or the most with equal shares of the stages when --threads is below "
                        "the stage count)")
    p.add_argument("--max-staleness", type=int, default=1, help="rgc-async staleness bound")
    p.add_argument("--dataset", default="default", help="data the batches come from (default: the "
                   "bundled corpus; contents do not affect speed)")
    p.add_argument("--data-dir", default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--gemm-peak", action="store_true",
                   help="also measure fp32 GEMM GFLOP/s (Numba path and np.dot) to state achieved/peak")
    p.add_argument("--gemm-shape", default=None, help="MxKxN for --gemm-peak (default: batch*seq x "
                   "d x 4d)")
    p.add_argument("--kernel-profile", type=integer, default=0, metavar="STEPS",
                   help="also time one BP step kernel by kernel (per thread count and attention "
                        "setting), averaged over STEPS steps (default 0: off)")
    p.add_argument("--timeout", type=float, default=None, help="seconds one worker may run")
    p.add_argument("--out", default=None, help="JSON file for every raw figure + machine description")
    p.add_argument("--plot", nargs="?", const=True, default=False,
                   help="PNG plot (needs matplotlib); optional path (default: --out with .png)")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    return p


def _gemm_shape(text):
    from ..errors import ConfigError
    try:
        vals = [int(v) for v in text.lower().replace("×", "x").split("x")]
    except ValueError:
        vals = []
    if len(vals) != 3 or any(v < 1 for v in vals):
        raise ConfigError(f"--gemm-shape must be MxKxN with positive integers, got {text!r}")
    return vals


def main(argv=None):
    return run_main(_main, argv)


def _main(argv):
    from ..measure import bench
    from ..errors import ConfigError
    a = build_parser().parse_args(argv)
    modes = bench.parse_modes(a.modes)
    threads = bench.parse_int_list(a.threads, "--threads")
    from ..threads import cpu_count
    if max(threads) > 4 * cpu_count():
        raise ConfigError(f"--threads {max(threads)} is far beyond this machine's {cpu_count()} cores")
    if a.timeout is not None and a.timeout <= 0:
        raise ConfigError(f"--timeout must be > 0, got {a.timeout}")
    from ..config import preset
    mcfg = preset(a.config, n_layer=a.n_layer, d_model=a.d_model, n_head=a.n_head, ctx=a.ctx)
    if a.n_stages is not None and a.n_stages < 1:
        raise ConfigError(f"--n-stages must be >= 1, got {a.n_stages}")
    n_stages = a.n_stages or bench.default_n_stages(mcfg.n_layer)
    groups = bench.parse_stage_groups(a.stage_groups if a.stage_groups is not None else a.stage_threads,
                                      n_stages)
    if a.plot and not a.out and a.plot is True:
        plot_path = "bench.png"
    elif a.plot is True:
        plot_path = (a.out[:-5] if a.out.endswith(".json") else a.out) + ".png"
    else:
        plot_path = a.plot or None
    log = (lambda m: None) if a.quiet else (lambda m: print(m, file=sys.stderr, flush=True))
    report = bench.run_bench(
        config=a.config, modes=modes, threads=threads, repeats=a.repeats, warmup_steps=a.warmup_steps,
        steps=a.steps, batch=a.batch, seq=a.seq, n_stages=n_stages, stage_groups=groups,
        stage_workers=bench.parse_worker_sweep(a.stage_workers),
        attention=bench.parse_attention(a.attention),
        max_staleness=a.max_staleness, dataset=a.dataset, data_dir=a.data_dir, seed=a.seed,
        gemm_peak=a.gemm_peak, gemm_shape=_gemm_shape(a.gemm_shape) if a.gemm_shape else None,
        timeout=a.timeout, log=log, kernel_profile=a.kernel_profile,
        model_overrides=dict(n_layer=a.n_layer, d_model=a.d_model, n_head=a.n_head, ctx=a.ctx))
    if plot_path:
        from ..measure.plot import EXTRA_HINT, PlotUnavailable, plot_bench
        try:
            plot_bench(report, plot_path)
            report["plot"] = plot_path
        except PlotUnavailable:
            report["notes"].append(f"matplotlib is not installed: no plot ({EXTRA_HINT})")
    if a.out:
        bench.write_json(report, a.out)
    sys.stdout.write(bench.markdown(report))
    if a.out:
        print(f"\nraw figures: {a.out}" + (f", plot: {report['plot']}" if report.get("plot") else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
