"""Per-kernel time breakdown of one training step.

The production path runs a whole block range as one nogil Numba call, which no profiler can see into.
This module runs the same block bodies as Python (their ``py_func``), so the same kernels are called
in the same order, each call timed. Each kernel runs its own compiled copy, not the one LLVM
re-optimised inside the block entry point, so the replay's float32 sums may round differently on some
CPUs; a test checks that it calls the production sequence and computes the production gradients to
float32 rounding (tests/test_profile.py).

    python -m nbrgc.profile --config paper --batch 8 --threads 2
"""
import argparse
import json
import sys
import time
from collections import defaultdict

import numba
import numpy as np

from .kernels import blocks
from .kernels.embedding import embedding_bwd, embedding_fwd


class Timer:
    def __init__(self):
        self.total = defaultdict(float)
        self.calls = defaultdict(int)

    def __call__(self, name, fn, *args):
        t = time.perf_counter()
        out = fn(*args)
        self.total[name] += time.perf_counter() - t
        self.calls[name] += 1
        return out


def profiled_loss_and_grad(model, x, y, timer):
    """model.loss_and_grad, kernel by kernel: the block bodies themselves
    (:func:`nbrgc.kernels.blocks.replay_fwd`, ``replay_bwd``) run as Python, every kernel call
    timed (same kernels, same order, same buffers)."""
    cfg, P, G = model.cfg, model.flat, model.grad_flat
    H, L = cfg.n_head, cfg.n_layer
    x, y = model.check_batch(x, y)
    B, T = x.shape
    ws = model.cached_workspace(B, T)
    a, s = ws.acts, ws.scratch
    nt = numba.get_num_threads()
    offs = model.layout.block_offs
    from .kernels.gemm_plan import plan_for
    plan = plan_for()
    G[...] = 0.0
    ws.tokens[...] = x
    timer("embedding fwd", embedding_fwd, ws.tokens, model.params["wte"], model.params["wpe"], a.resid[0])
    blocks.replay_fwd(timer, P, offs, 0, L, B, T, H, a, s, nt, ws.attention)
    lo, hi = model.layout.decoder_range
    ws.targets[...] = np.asarray(y).reshape(-1)
    n = ws.targets.shape[0]
    tot = timer("decoder fwd+bwd (LN, head, CE)", blocks.decoder_fwd_bwd, P[lo:hi], G[lo:hi], a.resid[L],
                ws.targets, ws.lnf_out, ws.lnf_mean, ws.lnf_rstd, ws.logits, ws.losses, ws.dh, s.ln_partials,
                1.0 / n, nt, plan, True)
    # the decoder wrote dL/dh into ws.dresid
    blocks.replay_bwd(timer, P, G, offs, 0, L, B, T, H, a, s, ws.dresid, nt, plan, ws.attention)
    timer("embedding bwd", embedding_bwd, ws.tokens, ws.dresid, model.grads["wte"], model.grads["wpe"])
    return tot / n


def profile_step(model, x, y, lr=1e-3, repeats=3):
    """{kernel: seconds per step} averaged over ``repeats`` steps (plus the optimizer)."""
    from .kernels.adamw import adamw_update, sumsq
    M = np.zeros_like(model.flat)
    V = np.zeros_like(model.flat)
    profiled_loss_and_grad(model, x, y, Timer())  # load (or compile) every kernel first
    sumsq(model.grad_flat)
    adamw_update(model.flat.copy(), model.grad_flat, M.copy(), V.copy(), model.decay_mask, lr, 0.9, 0.95,
                 1e-8, 0.1, 1, 1.0)
    timer = Timer()
    t0 = time.perf_counter()
    for r in range(repeats):
        profiled_loss_and_grad(model, x, y, timer)
        timer("grad norm", sumsq, model.grad_flat)
        timer("adamw", adamw_update, model.flat, model.grad_flat, M, V, model.decay_mask, lr, 0.9, 0.95,
              1e-8, 0.1, r + 1, 1.0)
    wall = (time.perf_counter() - t0) / repeats
    per = {k: v / repeats for k, v in timer.total.items()}
    return per, wall


def measure(cfg, batch, seq, threads, attention="store", repeats=3, seed=0):
    """Profile one BP step of a fresh model on random bytes, with BLAS pinned to one thread and the
    calling thread's Numba group set to ``threads``: ({kernel: seconds per step}, step wall
    seconds, the group size actually used)."""
    from .model import Model
    from .threads import limit_blas, set_threads
    limit_blas(1)
    nt = set_threads(threads)
    model = Model(cfg, seed=seed, attention=attention)
    rng = np.random.default_rng(0)
    x = rng.integers(0, cfg.vocab, (batch, seq))
    y = rng.integers(0, cfg.vocab, (batch, seq))
    per, wall = profile_step(model, x, y, repeats=repeats)
    return per, wall, nt


def table(per, top=None):
    """Markdown table of a profile, slowest first, with the total; with ``top``, the kernels after
    the first ``top`` are summed into one row."""
    tot = sum(per.values())
    rows = sorted(per.items(), key=lambda kv: -kv[1])
    if top is not None and len(rows) > top + 1:
        rows = rows[:top] + [(f"{len(rows) - top} other kernels", sum(v for _, v in rows[top:]))]
    out = ["| kernel | ms/step | share |", "|---|---:|---:|"]
    out += [f"| {k} | {v * 1e3:.{1 if v >= 1e-4 else 3}f} | {v / tot:.1%} |" for k, v in rows]
    out.append(f"| **total (timed kernels)** | {tot * 1e3:.1f} | 100% |")
    return out


def main(argv=None):
    from .config import preset, preset_batch
    p = argparse.ArgumentParser(prog="python -m nbrgc.profile", description=__doc__.splitlines()[0])
    p.add_argument("--config", default="small")
    p.add_argument("--batch", type=int, default=None)
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--attention", default="store", choices=("store", "recompute"))
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    cfg = preset(a.config)
    B = a.batch or preset_batch(a.config)
    per, wall, nt = measure(cfg, B, cfg.ctx, a.threads or numba.config.NUMBA_NUM_THREADS,
                            a.attention, a.repeats)
    from .measure.machine import describe_machine, machine_line
    machine = describe_machine()  # a profile is of one machine: it says which
    if a.json:
        print(json.dumps({"config": a.config, "batch": B, "threads": nt, "step_s": wall, "kernels_s": per,
                          "machine": machine}))
        return 0
    print(f"# per-kernel time of one BP step: {a.config}, batch {B}, ctx {cfg.ctx}, {nt} threads"
          + ("" if a.attention == "store" else ", attention probabilities recomputed") + "\n")
    print(f"Machine: {machine_line(machine)}\n")
    print("\n".join(table(per)))
    print(f"\nstep wall time {wall * 1e3:.1f} ms ({B * cfg.ctx / wall:.0f} tokens/s through this "
          "Python-driven replay)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
