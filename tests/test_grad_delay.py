"""``--grad-delay N`` (bp): each gradient is the true gradient of its batch at the weights of N
updates ago (the initial weights for the first N steps), and the update applies it to the current
weights; checked against a reference model and optimizer in float64, with both optimizers, while
the weights really move. The flag is refused outside bp, and a resume with another delay is
refused in one line (tests/test_resume.py resumes a delayed run exactly)."""
import numpy as np
import pytest

import nbrgc  # noqa: F401
from nbrgc.config import TrainConfig
from nbrgc.data import Batches
from nbrgc.errors import CheckpointError, ConfigError
from nbrgc.model import Model
from nbrgc.optim import make_optimizer
from nbrgc.schemes import make_scheme

from conftest import numba_threads
from test_schemes import TINY4, text  # noqa: F401  (text: fixture)


@pytest.mark.parametrize("optimizer,delay", [("adamw", 1), ("adamw", 2), ("muon", 1)])
def test_each_gradient_is_taken_at_the_weights_of_n_steps_ago(text, optimizer, delay):
    tc = TrainConfig(mode="bp", steps=6, batch=2, grad_clip=0.0, lr=3e-3, warmup=1,
                     optimizer=optimizer, grad_delay=delay)
    model = Model(TINY4, seed=4, dtype=np.float64)
    ref = Model(TINY4, seed=4, dtype=np.float64)  # its gradient at the recorded weights
    sc = make_scheme(model, tc)
    M, V = np.zeros_like(ref.flat), np.zeros_like(ref.flat)
    ref_opt = make_optimizer(optimizer, ref.flat, ref.grad_flat, M, V, ref.decay_mask, 0,
                             ref.layout.size, ref.layout, beta1=tc.beta1, beta2=tc.beta2, eps=tc.eps,
                             weight_decay=tc.weight_decay)
    batches = Batches(text, 2, 16, seed=3)
    weights = []
    with numba_threads(1):
        for t in range(6):
            x, y = batches.next()
            weights.append(model.flat.copy())
            sc.submit(t, x, y, 3e-3)
            (res,) = sc.poll()
            ref.flat[...] = weights[max(t - delay, 0)]
            loss, _ = ref.loss_and_grad(x, y)
            assert res.loss == loss
            np.testing.assert_array_equal(model.grad_flat, ref.grad_flat)
            ref.flat[...] = weights[t]  # the step applies to the current weights
            ref_opt.step(3e-3, 1.0)
            np.testing.assert_array_equal(model.flat, ref.flat)
    assert not np.array_equal(weights[-1], weights[-1 - delay])  # the weights did move


def test_grad_delay_is_refused_outside_bp_and_on_resume_with_another_delay():
    with pytest.raises(ConfigError, match="--grad-delay delays backprop's whole gradient"):
        TrainConfig(mode="pipe-sync", steps=4, grad_delay=1)
    with pytest.raises(ConfigError, match="grad_delay must be"):
        TrainConfig(mode="bp", steps=4, grad_delay=-1)
    model = Model(TINY4, seed=0)
    one = make_scheme(model, TrainConfig(mode="bp", steps=4, grad_delay=1))
    arrays, meta = one.state()
    assert arrays["bp_delayed_weights"].shape == (1, model.layout.size)
    two = make_scheme(model, TrainConfig(mode="bp", steps=4, grad_delay=2))
    with pytest.raises(CheckpointError, match="written with --grad-delay 1, this run has 2"):
        two.load_state(arrays, meta)
    plain = make_scheme(model, TrainConfig(mode="bp", steps=4))
    with pytest.raises(CheckpointError, match="written with --grad-delay 1, this run has 0"):
        plain.load_state(arrays, meta)
