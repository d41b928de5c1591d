"""The per-kernel profile replays the production step kernel by kernel, for both ways of handling
the attention probabilities, and its CLI prints a table whose rows add up.

The replay calls each kernel's own compiled copy; the production step calls the copies LLVM
re-optimised inside the block entry points, where the kernels' fast-math flags let it reassociate
sums to suit the CPU's vector widths. The two round alike on the machines measured (Zen 3, Zen 4)
but not by construction, so the replay is held to the arithmetic instead: it calls the production
sequence of kernels, and its float32 gradients are no further from the float64 gradients than four times
the production step's own rounding error (a skipped, repeated or different kernel is off by the
size of the gradient itself)."""
import json
import subprocess
import sys

import numpy as np
import pytest

import nbrgc  # noqa: F401
from nbrgc.config import ModelConfig
from nbrgc.model import Model
from nbrgc.profile import Timer, profile_step, profiled_loss_and_grad

CFG = ModelConfig(n_layer=3, d_model=16, n_head=2, ctx=72, vocab=256)  # T > QB: two query blocks


@pytest.mark.parametrize("attention", ["store", "recompute"])
def test_replay_computes_the_production_step(attention):
    rng = np.random.default_rng(0)
    x, y = rng.integers(0, 256, (2, 72)), rng.integers(0, 256, (2, 72))
    prod = Model(CFG, seed=3, attention=attention)
    loss, _ = prod.loss_and_grad(x, y)
    rep = Model(CFG, seed=3, attention=attention)
    timer = Timer()
    rloss = profiled_loss_and_grad(rep, x, y, timer)
    exact = Model(CFG, seed=3, dtype=np.float64, attention=attention)
    exact.flat[...] = prod.flat
    xloss, _ = exact.loss_and_grad(x, y)
    assert abs(rloss - xloss) <= 2 * abs(loss - xloss) + 4 * np.finfo(np.float32).eps * abs(xloss)
    err = np.abs(prod.grad_flat - exact.grad_flat).max()
    assert 0 < err < 1e-3 * np.abs(exact.grad_flat).max()  # float32 rounding, and only that
    assert np.abs(rep.grad_flat - exact.grad_flat).max() <= 4 * err
    assert timer.calls["qkv gemm fwd"] == CFG.n_layer
    bwd = "attention bwd" if attention == "store" else "attention bwd (recomputes probabilities)"
    assert timer.calls[bwd] == CFG.n_layer


def test_profile_step_and_cli():
    model = Model(CFG, seed=0)
    rng = np.random.default_rng(1)
    x, y = rng.integers(0, 256, (2, 72)), rng.integers(0, 256, (2, 72))
    per, wall = profile_step(model, x, y, repeats=2)
    assert {"adamw", "grad norm", "attention fwd", "mlp-up gemm bwd"} <= set(per)
    assert all(v >= 0 for v in per.values()) and 0 < sum(per.values()) <= wall * 1.05
    p = subprocess.run([sys.executable, "-m", "nbrgc.profile", "--config", "tiny", "--repeats", "1",
                        "--attention", "recompute", "--json"], capture_output=True, timeout=300)
    assert p.returncode == 0, p.stderr.decode()
    out = json.loads(p.stdout)
    assert out["config"] == "tiny" and out["step_s"] > 0
    assert "attention bwd (recomputes probabilities)" in out["kernels_s"]
