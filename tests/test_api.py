"""The README's Python API, as a user types it."""
import numpy as np

import nbrgc
from nbrgc.trainer import Trainer  # importing the module first must not shadow nbrgc.train


def test_readme_api(tmp_path):
    cfg = nbrgc.preset("tiny")
    model = nbrgc.Model(cfg, seed=0, dtype=np.float32)
    rng = np.random.default_rng(0)
    x, y = rng.integers(0, 256, (2, 16)), rng.integers(0, 256, (2, 16))
    assert model.params["h.0.attn.wqkv"].shape == (32, 96)
    loss = model.loss(x, y)
    loss2, grads = model.loss_and_grad(x, y)
    assert abs(loss - loss2) < 1e-6 * loss and grads["head.w"].shape == (32, 256)
    ws = model.workspace(2, 16, 0, 1)
    h = model.forward_blocks(model.embed(x, ws).copy(), 0, 1, ws)
    assert model.backward_blocks(np.ones_like(h), 0, 1, ws).shape == h.shape
    losses, _ = nbrgc.local_loss_and_grad(model, x, y, n_stages=2)
    assert len(losses) == 2
    assert nbrgc.Trainer is Trainer
    summary = nbrgc.train(cfg, nbrgc.TrainConfig(mode="rgc-async", steps=4, batch=4, n_stages=2,
                                                 eval_every=2, threads=1),
                          data="default", out=str(tmp_path / "run"), progress=False)
    assert summary["summary"] and summary["steps"] == 4 and np.isfinite(summary["val_bpb"])
    assert summary["checkpoint"].endswith("ckpt-000000004.nbrgc")
