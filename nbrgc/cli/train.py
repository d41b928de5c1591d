"""nbrgc-train: train a byte-level Transformer by global backprop or bounded-horizon RGC."""
import argparse
import os
import shlex
import sys

from . import DefaultsFormatter, OneLineParser, finite_number, run_main, workers

RUNS = "runs"  # where a run without --out gets its folder ($NBRGC_RUNS moves it)

# the commands a finished run points to: shown by --help and at the end of every run that saved
NEXT = ("bin/nbrgc-sample {out} --prompt 'Once there was' --bytes 300 --temperature 0.8 --top-k 40",
        "bin/nbrgc-eval {out} --split test")
# after the demo (the bundled corpus), the next things to try
AFTER_DEMO = ("bin/nbrgc-train --dataset enwik8 --config small --steps 5000 --out runs/enwik8",
              "bin/nbrgc-train --mode rgc-async          # the method studied here: 4 local stages, "
              "no backprop across them")
EPILOG = ("A run without --out keeps its folder under runs/ (a fresh name every time). Then:\n  "
          + "\n  ".join(c.format(out="RUN") for c in NEXT + AFTER_DEMO)
          + "\nA run stopped early (Ctrl-C, --time) continues with its own command and --resume.")


class _Formatter(DefaultsFormatter, argparse.RawDescriptionHelpFormatter):
    """Real defaults beside the flags; the epilog's commands one per line."""


def build_parser():
    from dataclasses import fields

    from ..config import (ATTENTION, CONSENSUS, DEFAULT_PRESET, DERIVED_DEFAULTS, MODES, ON_NAN,
                          OPTIMIZERS, PRESET_LR, PRESETS, REPLAY_WEIGHTS, STAGE_INIT, TrainConfig)
    # every training default is TrainConfig's: the flags only say it
    D = {f.name: f.default for f in fields(TrainConfig)}

    def derived(name):
        return f" (default: {DERIVED_DEFAULTS[name]})"
    p = OneLineParser(prog="nbrgc-train", description=__doc__, epilog=EPILOG,
                      formatter_class=_Formatter)
    g = p.add_argument_group("data")
    g.add_argument("--dataset", "--data", dest="dataset", default="default",
                   help="enwik8 | tinystories | default (bundled, offline) | text:PATH | a file path")
    g.add_argument("--data-dir", default=None, help="download/cache folder (default: $NBRGC_DATA, "
                   "else ~/.cache/nbrgc)")
    g = p.add_argument_group("model")
    g.add_argument("--config", default=DEFAULT_PRESET, help="preset: " + " | ".join(PRESETS))
    for name in ("n-layer", "d-model", "n-head", "ctx"):
        g.add_argument(f"--{name}", type=int, default=None, help=f"override the preset's {name} (default: the preset's)")
    g = p.add_argument_group("scheme")
    g.add_argument("--mode", default=D["mode"], help=" | ".join(MODES))
    g.add_argument("--n-stages", type=int, default=D["n_stages"], help="RGC stages (must divide n_layer)")
    g.add_argument("--stage-threads", default=D["stage_threads"],
                   help="rgc-async, pipe-async thread groups: auto or 1,1,1,1")
    g.add_argument("--attention", default=D["attention"],
                   help=" | ".join(ATTENTION) + ": keep each block's attention probabilities for the "
                        "backward, or recompute them there (same results, less memory, a few "
                        "percent slower)")
    g.add_argument("--stage-workers", type=workers, default=D["stage_workers"],
                   help="rgc-async, pipe-async: worker threads the stages share (stage k on worker k mod W; "
                        "memory grows with W). auto: one per stage, or, when the thread budget is "
                        "below n_stages, the most workers with equal shares of the stages "
                        "(default: auto)")
    g.add_argument("--max-staleness", type=int, default=D["max_staleness"],
                   help="rgc-async, pipe-sync/async: step t reads the decoder version t - S (S: steps a "
                        "stage may run ahead)")
    g.add_argument("--consensus", choices=CONSENSUS, default=D["consensus"],
                   help="rgc: how the stages' decoder gradients combine: uniform average, depth "
                        "(stage k weighted (k+1)/sum), or last (the last stage's alone)")
    g.add_argument("--horizon", default=None,
                   help="staged modes: blocks below a stage's input its loss's gradient reaches: 0 "
                        "(RGC), stage (one stage back), or all (default: pipe-sync/async all, "
                        "else 0; docs/schemes.md)")
    g.add_argument("--aux-weight", type=finite_number, default=None,
                   help="staged modes: weight of the earlier stages' losses beside the last one's "
                        "(default: pipe-sync/async 0, pipelined backprop; else 1, RGC)")
    g.add_argument("--boundary-delay", type=int, default=D["boundary_delay"],
                   help="pipe-sync/async, rgc-async with a horizon: steps a boundary gradient takes per hop (1: an asynchronous "
                        "pipeline's; 0: none)")
    g.add_argument("--grad-delay", type=int, default=D["grad_delay"],
                   help="bp: compute each gradient on the weights of N updates ago and apply it to "
                        "the current ones (1: PipeDream-2BW's numerics, every stage one step late "
                        "with consistent weights; keeps N copies of the weights)")
    g.add_argument("--delay-warmup", type=int, default=D["delay_warmup"],
                   help="pipe-sync/async: the first N steps run with no boundary delay (the pipeline "
                        "synchronous while Adam's steps are largest)")
    g.add_argument("--replay-weights", choices=REPLAY_WEIGHTS, default=D["replay_weights"],
                   help="pipe-sync/async: the late backward recomputes a stage's forward with its current "
                        "weights, with the stashed weights that micro-batch's forward used, or "
                        "(predicted) runs that forward on weights extrapolated to the step its "
                        "gradient lands, W + D (W - W_prev), or (momentum) D Adam steps ahead along "
                        "its moments, and replays on them")
    g.add_argument("--delay-lr-power", type=finite_number, default=D["delay_lr_power"],
                   help="pipe-sync/async: a stage whose gradient is D steps late steps at lr / (1 + D)^p")
    g.add_argument("--readout-blocks", type=int, default=D["readout_blocks"],
                   help="staged modes: private blocks between each stage but the last and "
                        "the shared decoder, trained by that stage's loss alone, never evaluated")
    g.add_argument("--stage-init", choices=STAGE_INIT, default=D["stage_init"],
                   help="rgc: identity starts the residual output projections of stages 1..K-1 at "
                        "zero, so each later stage starts as the identity of its input")
    g = p.add_argument_group("budget (the first given wins: --time, --tokens, --steps)")
    g.add_argument("--steps", type=int, default=None, help=f"optimizer steps (default: {D['steps']})")
    g.add_argument("--tokens", type=int, default=None, help="train on this many tokens (sets --steps)")
    g.add_argument("--time", type=finite_number, default=None, help="stop after this many seconds, with a checkpoint")
    g = p.add_argument_group("optimization")
    g.add_argument("--batch", type=int, default=D["batch"], help="sequences per step" + derived("batch"))
    g.add_argument("--seq", type=int, default=D["seq"], help="sequence length; 0: the preset's ctx")
    g.add_argument("--lr", type=finite_number, default=None,
                   help="peak learning rate (AdamW) (default: the preset's: "
                        + ", ".join(f"{v:g} for {k}" for k, v in PRESET_LR.items()) + f", else {D['lr']:g})")
    g.add_argument("--min-lr-frac", type=finite_number, default=D["min_lr_frac"],
                   help="the cosine schedule ends at lr times this")
    g.add_argument("--warmup", type=int, default=D["warmup"],
                   help="linear warm-up steps" + derived("warmup").replace("%", "%%"))
    g.add_argument("--weight-decay", type=finite_number, default=D["weight_decay"],
                   help="AdamW decoupled weight decay")
    g.add_argument("--optimizer", choices=OPTIMIZERS, default=D["optimizer"],
                   help="adamw, or muon: Muon (orthogonalised momentum) on the blocks' matrices, "
                        "AdamW on embeddings, LayerNorms, biases and the decoder, at the same --lr")
    g.add_argument("--muon-momentum", type=finite_number, default=D["muon_momentum"],
                   help="--optimizer muon: the momentum of the matrices' updates")
    g.add_argument("--beta1", type=finite_number, default=D["beta1"],
                   help="AdamW's first-moment decay (momentum)")
    g.add_argument("--beta2", type=finite_number, default=D["beta2"],
                   help="AdamW's second-moment decay")
    g.add_argument("--grad-clip", type=finite_number, default=D["grad_clip"],
                   help="clip the gradient norm to this (per stage for RGC); 0 disables")
    g.add_argument("--on-nan", default=D["on_nan"], help=" | ".join(ON_NAN) + ": on a non-finite "
                   "loss or gradient, stop with an error or skip the step")
    g = p.add_argument_group("evaluation and output")
    g.add_argument("--eval-every", type=int, default=D["eval_every"],
                   help="steps between evaluations; 0: only at the end" + derived("eval_every"))
    g.add_argument("--eval-batches", type=int, default=D["eval_batches"], help="held-out batches per evaluation")
    g.add_argument("--log-every", type=int, default=D["log_every"], help="steps between log lines")
    g.add_argument("--out", default=None, help="run folder: checkpoints, log.jsonl, run.json "
                   "(default: a fresh runs/CONFIG-MODE[-N])")
    g.add_argument("--no-save", action="store_true", help="no run folder: nothing is written")
    g.add_argument("--sample", type=int, default=200, metavar="BYTES",
                   help="bytes the trained model writes at the end; 0: none")
    g.add_argument("--resume", action="store_true", help="continue the run in --out")
    g.add_argument("--force", action="store_true", help="start over in an --out that holds a run")
    g.add_argument("--keep", type=int, default=D["keep"], help="checkpoints kept")
    g.add_argument("--ckpt-every", type=int, default=D["ckpt_every"],
                   help="extra checkpoint interval in steps; 0: at evaluations only")
    g.add_argument("--json", action="store_true", help="JSON lines on stdout (log + summary)")
    g.add_argument("--quiet", action="store_true", help="no progress bar")
    g = p.add_argument_group("machine")
    g.add_argument("--threads", type=int, default=D["threads"], help="total thread budget; 0: all cores")
    g.add_argument("--seed", type=int, default=D["seed"], help="initial weights and batch order")
    g.add_argument("--distributed", choices=("none", "mpi"), default="none",
                   help="mpi: run as the ranks of an mpiexec job (bp: data parallel; rgc-async, "
                        "pipe-async: the stages on ranks); --threads is then each rank's budget (default: the "
                        "machine's cores / the ranks on it)")
    g.add_argument("--max-memory", type=finite_number, default=None,
                   help="allowed peak memory in MiB (default: what is available)")
    return p


def parse(argv=None):
    """argv -> (ModelConfig, TrainConfig, options); raises NbrgcError on values that cannot work."""
    from ..config import TrainConfig, preset, preset_batch, preset_lr
    from ..errors import ConfigError
    from ..threads import cpu_count
    a = build_parser().parse_args(argv)
    mcfg = preset(a.config, n_layer=a.n_layer, d_model=a.d_model, n_head=a.n_head, ctx=a.ctx)
    batch = a.batch if a.batch is not None else preset_batch(a.config)  # overrides keep the preset's
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
        steps = TrainConfig.steps
    warmup, eval_every = a.warmup, a.eval_every  # None: TrainConfig derives them from steps
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
                     batch=batch, seq=a.seq, lr=a.lr if a.lr is not None else preset_lr(a.config), min_lr_frac=a.min_lr_frac, warmup=warmup,
                     weight_decay=a.weight_decay, optimizer=a.optimizer,
                     muon_momentum=a.muon_momentum, beta1=a.beta1, beta2=a.beta2,
                     grad_clip=a.grad_clip, eval_every=eval_every,
                     eval_batches=a.eval_batches, log_every=a.log_every, seed=a.seed,
                     threads=a.threads, n_stages=a.n_stages,
                     stage_threads=a.stage_threads, stage_workers=a.stage_workers, attention=a.attention,
                     max_staleness=a.max_staleness, on_nan=a.on_nan,
                     consensus=a.consensus, stage_init=a.stage_init, keep=a.keep, ckpt_every=a.ckpt_every,
                     horizon=a.horizon, aux_weight=a.aux_weight, boundary_delay=a.boundary_delay,
                     delay_warmup=a.delay_warmup, replay_weights=a.replay_weights,
                     readout_blocks=a.readout_blocks, delay_lr_power=a.delay_lr_power,
                     grad_delay=a.grad_delay)
    tc.validate_for(mcfg)
    if tc.threaded:
        from ..config import parse_stage_threads
        groups = parse_stage_threads(a.stage_threads, tc.n_stages)
        if groups and sum(groups) > 4 * cpu_count():
            raise ConfigError(f"--stage-threads total {sum(groups)} is far beyond this machine's "
                              f"{cpu_count()} cores")
    if a.out is not None and not a.out.strip():
        raise ConfigError("--out needs a folder name")
    if a.resume and not a.out:
        raise ConfigError("--resume needs --out DIR (the run to continue)")
    if a.no_save and a.out is not None:
        raise ConfigError("give --out DIR or --no-save, not both")
    if a.sample < 0:
        raise ConfigError(f"--sample must be >= 0, got {a.sample}")
    return mcfg, tc, a


def main(argv=None):
    return run_main(_main, argv)


def _main(argv):
    mcfg, tc, a = parse(argv)
    from ..data import load_dataset
    from ..faults import FaultHook
    from ..trainer import Trainer
    fault = os.environ.get("NBRGC_FAULT")  # test hook: see nbrgc.faults.FaultHook
    fault_hook = FaultHook(fault) if fault else None
    if a.distributed == "mpi":
        from ..distributed.run import run_ranks
        return run_ranks(mcfg, tc, a, fault_hook)
    ds = load_dataset(a.dataset, data_dir=a.data_dir, log=lambda m: print(m, file=sys.stderr),
                      seq=tc.seq or mcfg.ctx)
    out = a.out if a.out is not None or a.no_save else fresh_run_folder(f"{a.config}-{tc.mode}")
    trainer = Trainer(mcfg, tc, ds, out, resume=a.resume, force=a.force, json_lines=a.json,
                      progress=not a.quiet, data_spec=a.dataset,
                      max_memory=None if a.max_memory is None else a.max_memory * 2**20,
                      time_limit=a.time, fault_hook=fault_hook)
    from ..kernels.warmup import warm_up
    warm_up(attention=tc.attention, mode=tc.mode, quiet=a.quiet, optimizer=tc.optimizer)
    summary = trainer.run()
    # with --json stdout is the machine's; the sample and the next commands are for the person
    say = (lambda m: print(m, file=sys.stderr, flush=True)) if a.json else print
    if a.sample and summary["steps"] > 0:
        show_sample(trainer.model, ds.val, a.sample, say)
    if out is not None and summary["checkpoint"]:
        say(f"run kept in {out}; next:\n  " + "\n  ".join(next_commands(out, argv, a, tc, summary)))
    return 0


def next_commands(out, argv, a, tc, summary):
    """What to run after this run: sample and evaluate it; continue it where it stopped early (its
    own command with --out and --resume); after the demo, a real dataset and the method."""
    cmds = [c.format(out=shlex.quote(out)) for c in NEXT]
    if summary["steps"] < tc.steps:  # stopped early: Ctrl-C, a signal, --time
        args = [x for x in (sys.argv[1:] if argv is None else argv) if x != "--resume"]
        if a.out is None:
            args += ["--out", out]
        cmds.append(shlex.join(["bin/nbrgc-train"] + args + ["--resume"]) + "   # continue it")
    if a.dataset == "default":
        cmds += AFTER_DEMO
    return cmds


def fresh_run_folder(name):
    """Create and return ``runs/NAME`` (``$NBRGC_RUNS/NAME``), or ``NAME-2``, ``NAME-3``, ... when
    it exists: a run without --out never lands in an earlier run's folder. Creating the folder is
    what claims the name, so two runs started at once get two folders."""
    from ..errors import NbrgcError
    root = os.environ.get("NBRGC_RUNS") or RUNS
    try:
        os.makedirs(root, exist_ok=True)
        for n in range(1, 10**6):
            path = os.path.join(root, name if n == 1 else f"{name}-{n}")
            try:
                os.mkdir(path)
                return path
            except FileExistsError:
                continue
    except OSError as exc:
        raise NbrgcError(f"cannot create a run folder in {root}: {exc.strerror or exc} "
                         "(pass --out DIR or --no-save)") from None
    raise NbrgcError(f"{root} holds a million runs named {name}: pass --out DIR")


def show_sample(model, val, n_bytes, say):
    """A few bytes from the trained model, continuing the first line of the held-out text."""
    from ..sample import generate
    text = bytes(val[:4096])
    start = text.find(b"\n") + 1
    prompt = text[start:start + min(24, model.cfg.ctx // 2)] or b"\n"
    out = generate(model, prompt, n_bytes, temperature=0.8, top_k=40, seed=0)
    body = (prompt + out).decode("utf-8", errors="replace").replace("\r", "")
    say(f"sample ({n_bytes} bytes after a {len(prompt)}-byte prompt from the held-out text, "
        "temperature 0.8, top-k 40):")
    say("\n".join("  | " + line for line in body.split("\n")))


if __name__ == "__main__":
    sys.exit(main())
