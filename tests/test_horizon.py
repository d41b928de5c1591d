"""The one objective between RGC and backprop (nbrgc.horizon): J = L_{K-1} + aux * sum_{k<K-1} L_k, each
loss reaching ``horizon`` blocks below its stage's input.

The finite-difference reference, block by block: block i's parameters get the gradient of
f_i = sum over the losses j whose reach [cut_j, hi_j) holds i of a_j L_j, where L_j is the ordinary
loss of the network truncated after stage j (every block between i and stage j's output is inside
the reach, so the derivative is the ordinary one); the embeddings get that of the losses with
cut_j = 0; the decoder that of sum_j c_j L_j. A loss outside a block's reach must NOT enter its
gradient, and the test checks that it would have mattered.
"""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import nbrgc
from nbrgc.errors import ConfigError
from nbrgc.horizon import cutoffs, decoder_weights, loss_weights, resolve_horizon
from nbrgc.local import split_stages
from nbrgc.testing import check_grad, seeds

from conftest import numba_threads
from test_local import _model, stage_losses


@st.composite
def horizon_case(draw):
    n_layer = draw(st.sampled_from([2, 3, 4]), label="n_layer")
    K = draw(st.sampled_from([k for k in (2, 3, 4) if n_layer % k == 0]), label="K")
    horizon = draw(st.sampled_from([0, 1, 2, 3, "all"]), label="horizon")
    aux = draw(st.sampled_from([0.0, 0.5, 1.0, 2.0]), label="aux_weight")
    consensus = draw(st.sampled_from(["uniform", "depth", "last"]), label="consensus")
    B, T = draw(st.integers(1, 2), label="B"), draw(st.integers(1, 5), label="T")
    return n_layer, K, horizon, aux, consensus, B, T, draw(seeds(), label="seed")


@settings(max_examples=30, deadline=None)
@given(horizon_case())
def test_objective_gradients_vs_finite_differences(case):
    n_layer, K, horizon, aux, consensus, B, T, seed = case
    with numba_threads(1):
        _check(n_layer, K, horizon, aux, consensus, B, T, seed)


def _check(n_layer, K, horizon, aux, consensus, B, T, seed):
    model = _model(n_layer, seed % 1000)
    rng = np.random.default_rng(seed)
    x = rng.integers(0, model.cfg.vocab, (B, T)).astype(np.int32)
    y = rng.integers(0, model.cfg.vocab, (B, T)).astype(np.int32)
    stages = split_stages(n_layer, K)
    H = resolve_horizon(horizon, n_layer)
    cut = cutoffs(stages, H)
    if aux == 0 and cut[-1] > 0:
        with pytest.raises(ConfigError, match="no gradient"):
            nbrgc.local_loss_and_grad(model, x, y, K, horizon=horizon, aux_weight=aux)
        return
    losses, _ = nbrgc.local_loss_and_grad(model, x, y, K, consensus=consensus, horizon=horizon,
                                          aux_weight=aux)
    np.testing.assert_allclose(losses, stage_losses(model, x, y, stages), rtol=1e-13)
    G = model.grad_flat.copy()
    a = loss_weights(K, aux)
    all_losses = lambda: stage_losses(model, x, y, stages)  # noqa: E731
    lay = model.layout

    def reach(i):  # the losses whose gradient reaches block i (-1: the embeddings)
        return [j for j, (lo, hi) in enumerate(stages)
                if a[j] != 0 and (cut[j] <= i < hi if i >= 0 else cut[j] == 0)]

    for i in range(-1, n_layer):
        lo, hi = (0, lay.block_range(0, 1)[0]) if i < 0 else lay.block_range(i, i + 1)
        theta = model.flat[lo:hi]
        js = reach(i)
        f = lambda _, js=js: sum(a[j] * all_losses()[j] for j in js)  # noqa: E731
        if not js:
            pytest.fail(f"block {i} gets no gradient, yet no ConfigError was raised")
        check_grad(f, [theta], [G[lo:hi]], n_proj=2, n_coords=3, seed=seed + i + 1)
        # the losses left out do depend on this block (so leaving them out is a real property)
        out = [j for j in range(K) if j not in js and a[j] != 0 and (i < 0 or stages[j][1] > i)]
        if out:
            d = np.random.default_rng(seed).standard_normal(theta.shape)
            saved = theta.copy()
            before = all_losses()
            theta += 1e-3 * d / np.linalg.norm(d)
            after = all_losses()
            theta[...] = saved
            assert any(after[j] != before[j] for j in out)
    c = decoder_weights(consensus, K, aux)
    c = np.full(K, 1.0 / K) if c is None else c
    dlo, dhi = lay.decoder_range
    check_grad(lambda _: float(np.dot(c, all_losses())), [model.flat[dlo:dhi]], [G[dlo:dhi]],
               n_proj=2, n_coords=4, seed=seed + 99)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("n_layer,K", [(4, 2), (4, 4), (3, 3)])
def test_the_corners_are_rgc_and_backprop_exactly(dtype, n_layer, K):
    model = _model(n_layer, 5)
    model.flat[...] = model.flat.astype(dtype).astype(np.float64)
    m = nbrgc.Model(model.cfg, seed=0, dtype=dtype)
    m.flat[...] = model.flat
    rng = np.random.default_rng(1)
    x = rng.integers(0, 24, (2, 5)).astype(np.int32)
    y = rng.integers(0, 24, (2, 5)).astype(np.int32)
    with numba_threads(1):
        loss, _ = m.loss_and_grad(x, y)
        bp = m.grad_flat.copy()
        losses, _ = nbrgc.local_loss_and_grad(m, x, y, K, horizon="all", aux_weight=0.0)
        assert losses[-1] == loss
        np.testing.assert_array_equal(m.grad_flat, bp)
        for consensus in ("uniform", "depth", "last"):
            from nbrgc.horizon import objective_loss_and_grad
            rgc_losses, _ = nbrgc.local_loss_and_grad(m, x, y, K, consensus=consensus)
            rgc = m.grad_flat.copy()
            ref_losses, _ = objective_loss_and_grad(m, x, y, K, 0, 1.0, consensus)
            assert ref_losses == rgc_losses
            np.testing.assert_array_equal(m.grad_flat, rgc)


def test_bad_horizons_and_weights_are_one_line_errors():
    model = _model(4, 0)
    x = np.zeros((1, 3), np.int32)
    for bad, match in ((-1, "horizon"), ("some", "horizon"), (1.5, "horizon")):
        with pytest.raises(ConfigError, match=match):
            nbrgc.local_loss_and_grad(model, x, x, 2, horizon=bad, aux_weight=0.5)
    for bad in (-0.5, float("nan"), "x"):
        with pytest.raises(ConfigError, match="aux_weight"):
            nbrgc.local_loss_and_grad(model, x, x, 2, horizon=1, aux_weight=bad)
    with pytest.raises(ConfigError, match=r"trains only blocks 1\.\.3: blocks 0\.\.0"):
        nbrgc.local_loss_and_grad(model, x, x, 2, horizon=1, aux_weight=0.0)


def test_decoder_weights():
    assert decoder_weights("uniform", 4, 1.0) is None  # RGC's plain mean
    np.testing.assert_allclose(decoder_weights("uniform", 4, 0.5), [0.2, 0.2, 0.2, 0.4])
    np.testing.assert_array_equal(decoder_weights("uniform", 3, 0.0), [0, 0, 1])
    np.testing.assert_array_equal(decoder_weights("depth", 3, 0.0), [0, 0, 1])
    np.testing.assert_allclose(decoder_weights("depth", 2, 0.5), [0.5 / 2.5, 2 / 2.5])
    from nbrgc.local import consensus_weights
    np.testing.assert_array_equal(decoder_weights("depth", 4, 1.0), consensus_weights("depth", 4))
    np.testing.assert_array_equal(decoder_weights("last", 4, 2.0), [0, 0, 0, 1])
