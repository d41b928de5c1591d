"""nbrgc-train: train a byte-level Transformer by global backprop or bounded-horizon RGC."""
import argparse
import os
import sys

from . import DefaultsFormatter, OneLineParser, finite_number, run_main, workers


def build_parser():
    from ..config import CONSENSUS, STAGE_INIT
    p = OneLineParser(prog="nbrgc-train", description=__doc__,
                formatter_class=DefaultsFormatter)
    g = p.add_argument_group("data")
    g.add_argument("--dataset", "--data", dest="dataset", default="default",
                   help="enwik8 | tinystories | default (bundled, offline) | text:PATH | a file path")
    g.add_argument("--data-dir", default=None, help="download/cache folder (default: $NBRGC_DATA, "
                   "else ~/.cache/nbrgc)")
    g = p.add_argument_group("model")
    g.add_argument("--config", default="tiny", help="preset: tiny | small | paper")
    for name in ("n-layer", "d-model", "n-head", "ctx"):
        g.add_argument(f"--{name}", type=int, default=None, help=f"override the preset's {name} (default: the preset's)")
    g = p.add_argument_group("scheme")
    g.add_argument("--mode", default="bp", help="bp | rgc-sync | rgc-async")
    g.add_argument("--n-stages", type=int, default=4, help="RGC stages (must divide n_layer)")
    g.add_argument("--stage-threads", default="auto", help="rgc-async thread groups: auto or 1,1,1,1")
    g.add_argument("--attention", default="store",
                   help="store | recompute: keep each block's attention probabilities for the "
                        "backward, or recompute them there (same results, less memory, a few "
                        "percent slower)")
    g.add_argument("--stage-workers", type=workers, default=0,
                   help="rgc-async: worker threads the stages share (stage k on worker k mod W; "
                        "memory grows with W). auto: one per stage, or, when the thread budget is "
                        "below n_stages, the most workers with equal shares of the stages "
                        "(default: auto)")
    g.add_argument("--max-staleness", type=int, default=1, help="rgc-async: steps a stage may run ahead")
    g.add_argument("--consensus", choices=CONSENSUS, default="uniform",
                   help="rgc: how the stages' decoder gradients combine: uniform average, or depth "
                        "(stage k weighted (k+1)/sum)")
    g.add_argument("--stage-init", choices=STAGE_INIT, default="standard",
                   help="rgc: identity starts the residual output projections of stages 1..K-1 at "
                        "zero, so each later stage starts as the identity of its input")
    g = p.add_argument_group("budget (the first given wins: --time, --tokens, --steps)")
    g.add_argument("--steps", type=int, default=None, help="optimizer steps (default: 300)")
    g.add_argument("--tokens", type=int, default=None, help="train on this many tokens (sets --steps)")
    g.add_argument("--time", type=finite_number, default=None, help="stop after this many seconds, with a checkpoint")
    g = p.add_argument_group("optimization")
    g.add_argument("--batch", type=int, default=None, help="sequences per step (default: preset's)")
    g.add_argument("--seq", type=int, default=0, help="sequence length (default: 0, the preset's ctx)")
    g.add_argument("--lr", type=finite_number, default=1e-3, help="peak learning rate (AdamW)")
    g.add_argument("--min-lr-frac", type=finite_number, default=0.1,
                   help="the cosine schedule ends at lr times this")
    g.add_argument("--warmup", type=int, default=None, help="warm-up steps (default: 5%% of steps)")
    g.add_argument("--weight-decay", type=finite_number, default=0.1,
                   help="AdamW decoupled weight decay")
    g.add_argument("--grad-clip", type=finite_number, default=1.0, help="clip the gradient norm to this (per stage for RGC); 0 disables")
    g.add_argument("--on-nan", default="stop", help="on a non-finite loss or gradient: stop with an error, or skip the step")
    g = p.add_argument_group("evaluation and output")
    g.add_argument("--eval-every", type=int, default=None, help="steps between evaluations (default: steps/5)")
    g.add_argument("--eval-batches", type=int, default=8, help="held-out batches per evaluation")
    g.add_argument("--log-every", type=int, default=10, help="steps between log lines")
    g.add_argument("--out", default=None, help="run folder: checkpoints, log.jsonl, run.json (default: none, nothing saved)")
    g.add_argument("--resume", action="store_true", help="continue the run in --out")
    g.add_argument("--force", action="store_true", help="start over in an --out that holds a run")
    g.add_argument("--keep", type=int, default=3, help="checkpoints kept")
    g.add_argument("--ckpt-every", type=int, default=0, help="extra checkpoint interval in steps (0: at evaluations only)")
    g.add_argument("--json", action="store_true", help="JSON lines on stdout (log + summary)")
    g.add_argument("--quiet", action="store_true", help="no progress bar")
    g = p.add_argument_group("machine")
    g.add_argument("--threads", type=int, default=0, help="total thread budget (default: 0, all cores)")
    g.add_argument("--seed", type=int, default=0, help="initial weights and batch order")
    g.add_argument("--distributed", choices=("none", "mpi"), default="none",
                   help="mpi: run as the ranks of an mpiexec job (bp: data parallel; rgc-async: the "
                        "stages on ranks); --threads is then each rank's budget (default: the "
                        "machine's cores / the ranks on it)")
    g.add_argument("--max-memory", type=finite_number, default=None,
                   help="allowed peak memory in MiB (default: what is available)")
    return p


def parse(argv=None):
    """argv -> (ModelConfig, TrainConfig, options); raises NbrgcError on values that cannot work."""
    from ..config import PRESET_BATCH, TrainConfig, preset
    from ..errors import ConfigError
    from ..threads import cpu_count
    a = build_parser().parse_args(argv)
    mcfg = preset(a.config, n_layer=a.n_layer, d_model=a.d_model, n_head=a.n_head, ctx=a.ctx)
    batch = a.batch if a.batch is not None else PRESET_BATCH.get(a.config, 8)
    seq = a.seq or mcfg.ctx
    if a.seq < 0:
        raise ConfigError(f"--seq must be >= 0, got {a.seq}")
    if batch < 1:  # checked here too: --tokens divides by it
        raise ConfigError(f"batch must be >= 1, got {batch}")
    steps = a.steps
    if a.tokens is not None:
        if a.tokens < 1:
            raise ConfigError(f"--tokens must be >= 1, got {a.tokens}")
        steps = max(1, -(-a.tokens // (batch * seq)))
    if steps is None:
        steps = 300
    warmup = a.warmup if a.warmup is not None else max(0, steps // 20)
    eval_every = a.eval_every if a.eval_every is not None else max(1, steps // 5)
    if a.threads and a.threads > 4 * cpu_count():
        raise ConfigError(f"--threads {a.threads} is far beyond this machine's {cpu_count()} cores")
    if a.time is not None and a.time <= 0:
        raise ConfigError(f"--time must be > 0, got {a.time}")
    if a.max_memory is not None and a.max_memory <= 0:
        raise ConfigError(f"--max-memory must be > 0, got {a.max_memory}")
    if a.time is not None and a.steps is None and a.tokens is None:
        steps = 10**9  # bounded by time only: the cosine schedule then holds lr after warm-up
        warmup = a.warmup if a.warmup is not None else 20
        eval_every = a.eval_every if a.eval_every is not None else 200
    tc = TrainConfig(mode=a.mode, steps=steps,
                     batch=batch, seq=a.seq, lr=a.lr, min_lr_frac=a.min_lr_frac, warmup=warmup,
                     weight_decay=a.weight_decay, grad_clip=a.grad_clip, eval_every=eval_every,
                     eval_batches=a.eval_batches, log_every=a.log_every, seed=a.seed,
                     threads=a.threads, n_stages=a.n_stages if a.mode != "bp" else 1,
                     stage_threads=a.stage_threads, stage_workers=a.stage_workers, attention=a.attention,
                     max_staleness=a.max_staleness, on_nan=a.on_nan,
                     consensus=a.consensus, stage_init=a.stage_init, keep=a.keep, ckpt_every=a.ckpt_every)
    tc.validate_for(mcfg)
    if a.mode == "rgc-async":
        from ..config import parse_stage_threads
        groups = parse_stage_threads(a.stage_threads, tc.n_stages)
        if groups and sum(groups) > 4 * cpu_count():
            raise ConfigError(f"--stage-threads total {sum(groups)} is far beyond this machine's "
                              f"{cpu_count()} cores")
    if a.out is not None and not a.out.strip():
        raise ConfigError("--out needs a folder name")
    if a.resume and not a.out:
        raise ConfigError("--resume needs --out DIR (the run to continue)")
    return mcfg, tc, a


def main(argv=None):
    return run_main(_main, argv)


def _main(argv):
    mcfg, tc, a = parse(argv)
    from ..data import load_dataset
    from ..trainer import FaultHook, Trainer
    fault = os.environ.get("NBRGC_FAULT")  # test hook: see nbrgc.trainer.FaultHook
    fault_hook = FaultHook(fault) if fault else None
    if a.distributed == "mpi":
        from ..distributed.run import run_ranks
        return run_ranks(mcfg, tc, a, fault_hook)
    ds = load_dataset(a.dataset, data_dir=a.data_dir, log=lambda m: print(m, file=sys.stderr),
                      seq=tc.seq or mcfg.ctx)
    trainer = Trainer(mcfg, tc, ds, a.out, resume=a.resume, force=a.force, json_lines=a.json,
                      progress=not a.quiet, data_spec=a.dataset,
                      max_memory=None if a.max_memory is None else a.max_memory * 2**20,
                      time_limit=a.time, fault_hook=fault_hook)
    trainer.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
