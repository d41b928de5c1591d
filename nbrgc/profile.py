"""Per-kernel time breakdown of one training step.

The production path runs a whole block range as one nogil Numba call, which no profiler can see into.
This module replays exactly the same kernels in the same order from Python, timing each call; a test
checks that the replay produces the production gradients bit for bit, so the breakdown cannot drift
from the code it describes.

    python -m nbrgc.profile --config paper --batch 8 --threads 2
"""
import argparse
import json
import sys
import time
from collections import defaultdict

import numba
import numpy as np

from .kernels.attention import attention_bwd, attention_bwd_lean, attention_fwd, attention_fwd_lean
from .kernels.blocks import (DOWN_B, DOWN_W, LN1_B, LN1_W, LN2_B, LN2_W, PROJ_B, PROJ_W, QKV_B, QKV_W,
                            UP_B, UP_W, _copy_add_bias, decoder_fwd_bwd)
from .kernels.embedding import embedding_bwd, embedding_fwd
from .kernels.gemm import linear_bwd, linear_fwd, matmul
from .kernels.layernorm import layernorm_apply, layernorm_bwd, layernorm_fwd
from .kernels.mlp import bias_gelu_fwd, gelu_bwd, gelu_fwd


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
    """model.loss_and_grad, kernel by kernel (same kernels, same order, same buffers)."""
    cfg, P, G = model.cfg, model.flat, model.grad_flat
    d, H, L = cfg.d_model, cfg.n_head, cfg.n_layer
    x, y = model.check_batch(x, y)
    B, T = x.shape
    ws = model.cached_workspace(B, T)
    a, s = ws.acts, ws.scratch
    keep = ws.attention == "store"
    nt = numba.get_num_threads()
    offs = model.layout.block_offs
    from .gemm_plan import plan_for
    plan = plan_for()
    vec = lambda t, o, n: t[o:o + n]  # noqa: E731
    mat = lambda t, o, r, c: t[o:o + r * c].reshape(r, c)  # noqa: E731
    G[...] = 0.0
    ws.tokens[...] = x
    timer("embedding fwd", embedding_fwd, ws.tokens, model.params["wte"], model.params["wpe"], a.resid[0])
    for i in range(L):
        o = offs[i]
        timer("layernorm fwd", layernorm_fwd, a.resid[i], vec(P, o[LN1_W], d), vec(P, o[LN1_B], d), s.ln_out,
              a.ln1_mean[i], a.ln1_rstd[i])
        timer("qkv gemm fwd", linear_fwd, s.ln_out, mat(P, o[QKV_W], d, 3 * d), vec(P, o[QKV_B], 3 * d),
              a.qkv[i], nt)
        if keep:
            timer("attention fwd", attention_fwd, a.qkv[i], B, T, H, a.probs[i], a.att_out[i])
        else:
            timer("attention fwd", attention_fwd_lean, a.qkv[i], B, T, H, s.probs_scratch, a.att_out[i])
        timer("residual+bias", _copy_add_bias, a.resid[i], vec(P, o[PROJ_B], d), a.mid[i])
        timer("attn-out gemm fwd", matmul, a.att_out[i], mat(P, o[PROJ_W], d, d), a.mid[i], 1.0, nt)
        timer("layernorm fwd", layernorm_fwd, a.mid[i], vec(P, o[LN2_W], d), vec(P, o[LN2_B], d), s.ln_out,
              a.ln2_mean[i], a.ln2_rstd[i])
        timer("mlp-up gemm fwd", matmul, s.ln_out, mat(P, o[UP_W], d, 4 * d), a.mlp_pre[i], 0.0, nt)
        timer("bias+gelu fwd", bias_gelu_fwd, a.mlp_pre[i], vec(P, o[UP_B], 4 * d), s.gelu_out)
        timer("residual+bias", _copy_add_bias, a.mid[i], vec(P, o[DOWN_B], d), a.resid[i + 1])
        timer("mlp-down gemm fwd", matmul, s.gelu_out, mat(P, o[DOWN_W], 4 * d, d), a.resid[i + 1], 1.0, nt)
    lo, hi = model.layout.decoder_range
    ws.targets[...] = np.asarray(y).reshape(-1)
    n = ws.targets.shape[0]
    tot = timer("decoder fwd+bwd (LN, head, CE)", decoder_fwd_bwd, P[lo:hi], G[lo:hi], a.resid[L], ws.targets,
                ws.lnf_out, ws.lnf_mean, ws.lnf_rstd, ws.logits, ws.losses, ws.dh, s.ln_partials, 1.0 / n, nt,
                plan)
    dresid = ws.dresid  # the decoder wrote dL/dh here
    for i in range(L - 1, -1, -1):
        o = offs[i]
        timer("gelu recompute", gelu_fwd, a.mlp_pre[i], s.gelu_out)
        timer("mlp-down gemm bwd", linear_bwd, s.gelu_out, mat(P, o[DOWN_W], 4 * d, d), dresid, s.dgelu,
              mat(G, o[DOWN_W], 4 * d, d), vec(G, o[DOWN_B], d), nt, 0.0, plan[0], plan[1])
        timer("gelu bwd", gelu_bwd, a.mlp_pre[i], s.dgelu)
        timer("layernorm recompute", layernorm_apply, a.mid[i], vec(P, o[LN2_W], d), vec(P, o[LN2_B], d),
              a.ln2_mean[i], a.ln2_rstd[i], s.ln_out)
        timer("mlp-up gemm bwd", linear_bwd, s.ln_out, mat(P, o[UP_W], d, 4 * d), s.dgelu, s.dln2,
              mat(G, o[UP_W], d, 4 * d), vec(G, o[UP_B], 4 * d), nt, 0.0, plan[2], plan[3])
        timer("layernorm bwd", layernorm_bwd, s.dln2, a.mid[i], vec(P, o[LN2_W], d), a.ln2_mean[i],
              a.ln2_rstd[i], dresid, vec(G, o[LN2_W], d), vec(G, o[LN2_B], d), s.ln_partials, nt, 1.0)
        timer("attn-out gemm bwd", linear_bwd, a.att_out[i], mat(P, o[PROJ_W], d, d), dresid, s.datt,
              mat(G, o[PROJ_W], d, d), vec(G, o[PROJ_B], d), nt, 0.0, plan[4], plan[5])
        if keep:
            timer("attention bwd", attention_bwd, s.datt, a.qkv[i], B, T, H, a.probs[i], s.dprobs, s.dqkv)
        else:
            timer("attention bwd (recomputes probabilities)", attention_bwd_lean, s.datt, a.qkv[i], B, T,
                  H, s.probs_scratch, s.dprobs, s.dqkv)
        timer("layernorm recompute", layernorm_apply, a.resid[i], vec(P, o[LN1_W], d), vec(P, o[LN1_B], d),
              a.ln1_mean[i], a.ln1_rstd[i], s.ln_out)
        timer("qkv gemm bwd", linear_bwd, s.ln_out, mat(P, o[QKV_W], d, 3 * d), s.dqkv, s.dln1,
              mat(G, o[QKV_W], d, 3 * d), vec(G, o[QKV_B], 3 * d), nt, 0.0, plan[6], plan[7])
        timer("layernorm bwd", layernorm_bwd, s.dln1, a.resid[i], vec(P, o[LN1_W], d), a.ln1_mean[i],
              a.ln1_rstd[i], dresid, vec(G, o[LN1_W], d), vec(G, o[LN1_B], d), s.ln_partials, nt, 1.0)
    timer("embedding bwd", embedding_bwd, ws.tokens, dresid, model.grads["wte"], model.grads["wpe"], nt)
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
    from .config import PRESET_BATCH, preset
    p = argparse.ArgumentParser(prog="python -m nbrgc.profile", description=__doc__.splitlines()[0])
    p.add_argument("--config", default="small")
    p.add_argument("--batch", type=int, default=None)
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--attention", default="store", choices=("store", "recompute"))
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    cfg = preset(a.config)
    B = a.batch or PRESET_BATCH[a.config]
    per, wall, nt = measure(cfg, B, cfg.ctx, a.threads or numba.config.NUMBA_NUM_THREADS,
                            a.attention, a.repeats)
    if a.json:
        print(json.dumps({"config": a.config, "batch": B, "threads": nt, "step_s": wall, "kernels_s": per}))
        return 0
    print(f"# per-kernel time of one BP step: {a.config}, batch {B}, ctx {cfg.ctx}, {nt} threads"
          + ("" if a.attention == "store" else ", attention probabilities recomputed") + "\n")
    print("\n".join(table(per)))
    print(f"\nstep wall time {wall * 1e3:.1f} ms ({B * cfg.ctx / wall:.0f} tokens/s through this "
          "Python-driven replay)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
