"""--optimizer muon: the Newton-Schulz orthogonalisation, Muon's step on one matrix against a plain
NumPy reference, the split between Muon (the blocks' matrices) and AdamW (everything else), and a
resume that keeps the optimizer."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import nbrgc  # noqa: F401  (thread-safe threading layer first)
from nbrgc.config import ModelConfig, TrainConfig, preset
from nbrgc.errors import CheckpointError
from nbrgc.kernels.adamw import adamw_update
from nbrgc.kernels.muon import NS_A, NS_B, NS_C, NS_STEPS, muon_update, orthogonalise
from nbrgc.model import Model
from nbrgc.optim import MUON_BETA, MUON_MATRICES, AdamW, Muon

from conftest import numba_threads


def _reference_orth(G, steps=NS_STEPS):
    X = G.T.copy() if G.shape[0] > G.shape[1] else G.copy()
    X /= np.linalg.norm(X) + 1e-7
    for _ in range(steps):
        A = X @ X.T
        X = NS_A * X + (NS_B * A + NS_C * A @ A) @ X
    return X.T if G.shape[0] > G.shape[1] else X


@settings(max_examples=30, deadline=None)
@given(m=st.integers(1, 12), n=st.integers(1, 12), seed=st.integers(0, 2**31 - 1))
def test_orthogonalise_keeps_the_singular_vectors_and_flattens_the_values(m, n, seed):
    """G = U diag(s) V^T (s in [0.2, 1]) -> O = U diag(f(s)) V^T with every f(s) in [0.6, 1.25]:
    the direction of the gradient, every singular value near one."""
    rng = np.random.default_rng(seed)
    k = min(m, n)
    U, _ = np.linalg.qr(rng.standard_normal((m, k)))
    V, _ = np.linalg.qr(rng.standard_normal((n, k)))
    s = rng.uniform(0.2, 1.0, k)
    G = (U * s) @ V.T
    O = orthogonalise(G, NS_STEPS)
    np.testing.assert_allclose(O, _reference_orth(G), rtol=1e-10, atol=1e-12)
    core = U.T @ O @ V  # diagonal when O keeps G's singular vectors
    np.testing.assert_allclose(core, np.diag(np.diag(core)), atol=1e-9)
    assert np.all(np.diag(core) > 0.6) and np.all(np.diag(core) < 1.25), np.diag(core)
    # and nothing outside G's row and column spaces
    np.testing.assert_allclose(U @ core @ V.T, O, atol=1e-9)


@pytest.mark.parametrize("shape", [(8, 24), (24, 8), (5, 5)])
def test_muon_update_matches_a_numpy_reference(shape):
    rng = np.random.default_rng(1)
    P, G, M = (rng.standard_normal(shape) for _ in range(3))
    lr, wd, gscale = 3e-3, 0.1, 0.7
    g = G * gscale
    M_ref = MUON_BETA * M + g
    O = _reference_orth(g + MUON_BETA * M_ref)
    P_ref = P * (1 - lr * wd) - lr * 0.2 * np.sqrt(max(shape)) * O
    P1, M1 = P.copy(), M.copy()
    muon_update(P1, G, M1, lr, MUON_BETA, wd, gscale, NS_STEPS)
    np.testing.assert_allclose(M1, M_ref, rtol=1e-14)
    np.testing.assert_allclose(P1, P_ref, rtol=1e-10, atol=1e-14)


def test_muon_steps_the_block_matrices_and_adamw_the_rest():
    """Over a stage's slice: each of the blocks' matrices by muon_update, every other element exactly
    as AdamW steps it; V stays zero on the matrices (the momentum lives in M)."""
    cfg = ModelConfig(n_layer=3, d_model=8, n_head=2, ctx=4, vocab=16)
    m = Model(cfg, seed=0, dtype=np.float64)
    rng = np.random.default_rng(2)
    m.grad_flat[...] = rng.standard_normal(m.grad_flat.shape)
    lay = m.layout
    lo, hi = lay.block_range(1, 3)
    P0 = m.flat.copy()
    M, V = np.zeros_like(m.flat), np.zeros_like(m.flat)
    opt = Muon(m.flat, m.grad_flat, M, V, m.decay_mask, lo, hi, lay)
    for _ in range(2):
        opt.step(1e-2, 0.5)
    # the same two steps, AdamW everywhere, then Muon by hand on the matrices
    Pa, Ma, Va = P0.copy(), np.zeros_like(P0), np.zeros_like(P0)
    ref = AdamW(Pa, m.grad_flat, Ma, Va, m.decay_mask, lo, hi)
    for _ in range(2):
        ref.step(1e-2, 0.5)
    mats = [(f"h.{i}.{p}") for i in (1, 2) for p in MUON_MATRICES]
    assert len(opt.matrices) == len(mats)
    is_mat = np.zeros(m.flat.size, bool)
    Pm, Mm = P0.copy(), np.zeros_like(P0)
    for name in mats:
        a = lay.offsets[name]
        b = a + int(np.prod(lay.shapes[name]))
        is_mat[a:b] = True
        for _ in range(2):
            muon_update(Pm[a:b].reshape(lay.shapes[name]), m.grad_flat[a:b].reshape(lay.shapes[name]),
                        Mm[a:b].reshape(lay.shapes[name]), 1e-2, MUON_BETA, 0.1, 0.5, NS_STEPS)
    inside = np.zeros(m.flat.size, bool)
    inside[lo:hi] = True
    np.testing.assert_allclose(m.flat[inside & ~is_mat], Pa[inside & ~is_mat], rtol=1e-13)
    np.testing.assert_allclose(M[inside & ~is_mat], Ma[inside & ~is_mat], rtol=1e-13)
    np.testing.assert_array_equal(m.flat[is_mat], Pm[is_mat])
    np.testing.assert_array_equal(M[is_mat], Mm[is_mat])
    assert not V[is_mat].any()
    np.testing.assert_array_equal(m.flat[~inside], P0[~inside])  # nothing outside the slice


def test_decoder_slice_is_plain_adamw():
    """The decoder (and the embeddings) hold no block matrix: Muon over them is AdamW, bit for bit,
    also when stepping a decoder version (P, G given)."""
    cfg = ModelConfig(n_layer=1, d_model=8, n_head=2, ctx=4, vocab=16)
    m = Model(cfg, seed=0, dtype=np.float32)
    lo, hi = m.layout.decoder_range
    G = np.random.default_rng(3).standard_normal(hi - lo).astype(np.float32)
    outs = []
    for cls, extra in ((Muon, (m.layout,)), (AdamW, ())):
        P = m.flat[lo:hi].copy()
        M, V = np.zeros_like(m.flat), np.zeros_like(m.flat)
        opt = cls(m.flat, m.grad_flat, M, V, m.decay_mask, lo, hi, *extra)
        opt.step(1e-3, 1.0, P=P, G=G)
        outs.append(P)
    assert not Muon(m.flat, m.grad_flat, M, V, m.decay_mask, lo, hi, m.layout).matrices
    np.testing.assert_array_equal(*outs)


def test_resume_with_another_optimizer_is_refused(tmp_path):
    from nbrgc.data import load_dataset
    from nbrgc.trainer import Trainer
    data = load_dataset("default", log=None)
    mcfg = preset("tiny")

    def run(opt, resume):
        tc = TrainConfig(steps=4, batch=2, eval_every=0, threads=1, optimizer=opt)
        return Trainer(mcfg, tc, data, tmp_path / "run", resume=resume, progress=False,
                       log=lambda m: None, data_spec="default").run()

    with numba_threads(1):
        run("muon", False)
        with pytest.raises(CheckpointError, match="--optimizer muon"):
            run("adamw", True)


def test_momentum_look_ahead_needs_adamw():
    from nbrgc.errors import ConfigError
    from nbrgc.schemes import make_scheme
    tc = TrainConfig(mode="pipe-sync", steps=2, batch=2, n_stages=2, replay_weights="momentum",
                     optimizer="muon")
    with pytest.raises(ConfigError, match="momentum extrapolates AdamW"):
        make_scheme(Model(preset("tiny"), seed=0), tc)
