"""Every Numba kernel: backward vs central finite differences (float64, via nbrgc.testing.check_grad),
forward vs plain NumPy references, float32 vs float64 forward agreement, AdamW vs a NumPy reference.

Shapes and values are drawn by Hypothesis (sequence length 1 included); the ``nt`` arguments are the
number of parallel blocks a kernel splits into, drawn too so the block-splitting and per-block
reductions are exercised whatever the core count.
"""
import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import nbrgc  # noqa: F401  (thread-safe threading layer first)
from nbrgc.kernels.adamw import adamw_update, all_finite, fill, sumsq, _CHUNK
from nbrgc.kernels.attention import attention_bwd, attention_bwd_lean, attention_fwd, attention_fwd_lean
from nbrgc.kernels.embedding import embedding_bwd, embedding_fwd
from nbrgc.kernels.gemm import TASKS, linear_bwd, linear_fwd, matmul, matmul_nt, matmul_tn
from nbrgc.kernels.layernorm import EPS, layernorm_apply, layernorm_bwd, layernorm_fwd
from nbrgc.kernels.loss import xent_fwd, xent_fwd_bwd
from nbrgc.kernels.mlp import bias_gelu_fwd, gelu_bwd, gelu_fwd
from nbrgc.testing import check_grad, float64_arrays, seeds, shapes

SETTINGS = settings(max_examples=20, deadline=None)
FEW = settings(max_examples=10, deadline=None)
dims = st.integers(1, 6)
threads = st.integers(1, 4)


def _normal(seed, *shape):
    return np.random.default_rng(seed).standard_normal(shape)


# ---------------------------------------------------------------------------------------- NumPy references

def np_layernorm(X, w, b):
    m = X.mean(axis=1, keepdims=True)
    v = ((X - m) ** 2).mean(axis=1, keepdims=True)
    return (X - m) / np.sqrt(v + EPS) * w + b


def np_gelu(x):
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x ** 3)))


def np_attention(qkv, B, T, H):
    d = qkv.shape[1] // 3
    hd = d // H
    q, k, v = (qkv[:, i * d:(i + 1) * d].reshape(B, T, H, hd).transpose(0, 2, 1, 3) for i in range(3))
    s = q @ k.transpose(0, 1, 3, 2) / np.sqrt(hd)
    s = np.where(np.tril(np.ones((T, T), bool)), s, -np.inf)
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    y = (p @ v).transpose(0, 2, 1, 3).reshape(B * T, d)
    return p, y


def np_log_softmax(z):
    m = z.max(axis=1, keepdims=True)
    return z - m - np.log(np.exp(z - m).sum(axis=1, keepdims=True))


def np_adamw(P, G, M, V, mask, lr, b1, b2, eps, wd, step, gscale):
    """PyTorch-order AdamW: decoupled decay p *= 1 - lr*wd (masked), then the bias-corrected step."""
    P, M, V = P.astype(np.float64), M.astype(np.float64), V.astype(np.float64)
    g = G.astype(np.float64) * gscale
    M = b1 * M + (1 - b1) * g
    V = b2 * V + (1 - b2) * g * g
    P = np.where(mask.astype(bool), P * (1 - lr * wd), P)
    mhat = M / (1 - b1 ** step)
    vhat = V / (1 - b2 ** step)
    return P - lr * mhat / (np.sqrt(vhat) + eps), M, V


# --------------------------------------------------------------------------------------------------- linear

def _maybe_sliced(a, sliced, pad_seed):
    """``a`` itself, or an equal column-sliced view into a wider buffer (leading dimension > width)."""
    if not sliced:
        return a
    n, m = a.shape
    big = _normal(pad_seed, n, m + 5)
    view = big[:, 2:2 + m]
    view[...] = a
    return view


@SETTINGS
@given(st.data())
def test_linear_grad_vs_finite_differences(data):
    N = data.draw(st.integers(1, 40), label="rows (B*T)")
    K, M = data.draw(dims, label="K"), data.draw(dims, label="M")
    sliced = data.draw(st.booleans(), label="column-sliced views")
    nt = data.draw(threads, label="nt")
    seed = data.draw(seeds())
    X = _maybe_sliced(data.draw(float64_arrays((N, K))), sliced, seed)
    W = _maybe_sliced(data.draw(float64_arrays((K, M))), sliced, seed + 1)
    b = data.draw(float64_arrays((M,)))
    R = _normal(seed, N, M)

    def f(X, W, b):
        Y = _maybe_sliced(np.zeros((N, M)), sliced, seed + 2)
        linear_fwd(X, W, b, Y, nt)
        return float((R * Y).sum())

    dY = _maybe_sliced(R, sliced, seed + 3)
    dX = _maybe_sliced(np.zeros((N, K)), sliced, seed + 4)
    dW, db = _maybe_sliced(np.zeros((K, M)), sliced, seed + 5), np.zeros(M)
    linear_bwd(X, W, dY, dX, dW, db, nt, 0.0)
    np.testing.assert_allclose(dX, R @ W.T, rtol=1e-12, atol=1e-12)
    check_grad(f, [X, W, b], [dX.copy(), dW.copy(), db.copy()], seed=seed)


@SETTINGS
@given(st.data())
def test_linear_forward_and_accumulation(data):
    N = data.draw(st.integers(1, 40), label="rows")
    K, M = data.draw(dims), data.draw(dims)
    sliced = data.draw(st.booleans(), label="column-sliced views")
    nt = data.draw(threads)
    seed = data.draw(seeds())
    X = _maybe_sliced(_normal(seed, N, K), sliced, seed + 1)
    W = _maybe_sliced(_normal(seed + 2, K, M), sliced, seed + 3)
    b = _normal(seed + 4, M)
    Y = _maybe_sliced(np.full((N, M), np.nan), sliced, seed + 5)
    linear_fwd(X, W, b, Y, nt)
    np.testing.assert_allclose(Y, X @ W + b, rtol=1e-12, atol=1e-12)

    # dx_beta=1 accumulates into dX; dW and db always accumulate
    dY = _normal(seed + 6, N, M)
    dX0, dW0, db0 = _normal(seed + 7, N, K), _normal(seed + 8, K, M), _normal(seed + 9, M)
    dX, dW, db = _maybe_sliced(dX0.copy(), sliced, seed + 10), dW0.copy(), db0.copy()
    split_w = data.draw(st.sampled_from([0, 1, TASKS]), label="weight split (or side by side)")
    linear_bwd(X, W, dY, dX, dW, db, nt, 1.0, split_w, data.draw(st.sampled_from([0, 1])))
    np.testing.assert_allclose(dX, dX0 + dY @ W.T, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(dW, dW0 + X.T @ dY, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(db, db0 + dY.sum(axis=0), rtol=1e-12, atol=1e-12)
    # dx_beta=0 overwrites dX, even when it held NaN
    dX = _maybe_sliced(np.full((N, K), np.nan), sliced, seed + 11)
    linear_bwd(X, W, dY, dX, dW, db, nt, 0.0, split_w)
    np.testing.assert_allclose(dX, dY @ W.T, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(dW, dW0 + 2 * X.T @ dY, rtol=1e-12, atol=1e-12)

    # the building blocks with beta
    C0 = _normal(seed + 12, N, M)
    C = C0.copy()
    matmul(X, W, C, 1.0, nt)
    np.testing.assert_allclose(C, C0 + X @ W, rtol=1e-12, atol=1e-12)
    C = np.empty((K, M))
    matmul_tn(X, dY, C, 0.0, nt)
    np.testing.assert_allclose(C, X.T @ dY, rtol=1e-12, atol=1e-12)
    C = np.empty((N, K))
    matmul_nt(dY, W, C, 0.0, nt)
    np.testing.assert_allclose(C, dY @ W.T, rtol=1e-12, atol=1e-12)


GEMM_SHAPES = ((256, 64, 192), (200, 96, 24), (512, 128, 384), (64, 32, 128), (33, 17, 29))
_U32 = 2.0 ** -24  # unit roundoff of float32


def _gamma(k):
    """Higham's gamma_k = k u / (1 - k u): a float32 sum of k products, in any order and with or
    without fused multiply-adds, is within gamma_k * sum |a_i b_i| of the exact value."""
    return k * _U32 / (1 - k * _U32)


def _linear_bwd_case(X, W, dY, nt, sw, sx):
    N, K = X.shape
    M = W.shape[1]
    dX, dW, db = np.zeros((N, K), np.float32), np.ones((K, M), np.float32), np.ones(M, np.float32)
    linear_bwd(X, W, dY, dX, dW, db, nt, 0.0, sw, sx)
    return dX, dW


def test_gemm_same_cut_same_bits_and_whole_calls_at_one_and_two_threads():
    """What holds on every BLAS kernel, by construction: the same cut of a product gives the same bits
    (two runs, a resume), and the group sizes 1 and 2 run each backward product as one whole BLAS call
    (nbrgc.kernels.gemm_plan: side by side at 2 threads), so they agree to the bit, odd shapes included."""
    from nbrgc.kernels.gemm_plan import plan_for
    rng = np.random.default_rng(3)
    for N, K, M in GEMM_SHAPES:
        X, W = rng.standard_normal((N, K), np.float32), rng.standard_normal((K, M), np.float32)
        dY = rng.standard_normal((N, M), np.float32)
        one = _linear_bwd_case(X, W, dY, 1, *plan_for(1)[:2])
        two = _linear_bwd_case(X, W, dY, 2, *plan_for(2)[:2])
        for a, b in zip(one, two):
            np.testing.assert_array_equal(a, b, err_msg=f"{(N, K, M)}: 1 vs 2 threads")
        for nt in (3, 4):
            for sw, sx in ((0, 0), (1, 1), (TASKS, 0)):
                for a, b in zip(_linear_bwd_case(X, W, dY, nt, sw, sx),
                                _linear_bwd_case(X, W, dY, nt, sw, sx)):
                    np.testing.assert_array_equal(a, b, err_msg=f"{(N, K, M)} nt={nt} plan {sw},{sx}")
        Y1, Y2 = np.empty((N, M), np.float32), np.empty((N, M), np.float32)
        linear_fwd(X, W, np.zeros(M, np.float32), Y1, 3)
        linear_fwd(X, W, np.zeros(M, np.float32), Y2, 3)
        np.testing.assert_array_equal(Y1, Y2)


def test_gemm_every_cut_within_the_float32_dot_product_bound():
    """Different cuts of a product (rows, columns, side by side, 1-4 threads) are different BLAS calls,
    which some kernels round differently (OpenBLAS's Haswell kernels: every cut here; its SkylakeX
    kernels: few). Each result must still be the exact product to within float32 rounding of a
    k-term dot product, gamma_k * sum |a_i b_i| (plus the accumulated 1 in dW: gamma_{k+1}), checked
    against float64; a wrong block, stride or beta would be off by O(1)."""
    rng = np.random.default_rng(3)
    for N, K, M in GEMM_SHAPES:
        X, W = rng.standard_normal((N, K), np.float32), rng.standard_normal((K, M), np.float32)
        dY = rng.standard_normal((N, M), np.float32)
        X64, W64, dY64 = X.astype(np.float64), W.astype(np.float64), dY.astype(np.float64)
        dX_ref, dW_ref = dY64 @ W64.T, 1.0 + X64.T @ dY64
        dX_tol = _gamma(M) * (np.abs(dY64) @ np.abs(W64.T))
        dW_tol = _gamma(N + 1) * (1.0 + np.abs(X64.T) @ np.abs(dY64))
        Y_ref, Y_tol = X64 @ W64, _gamma(K) * (np.abs(X64) @ np.abs(W64))
        for nt in (1, 2, 3, 4):
            for sw, sx in ((0, 0), (1, 1), (0, 1), (TASKS, 0)):
                dX, dW = _linear_bwd_case(X, W, dY, nt, sw, sx)
                what = f"{(N, K, M)} nt={nt} plan {sw},{sx}"
                assert np.all(np.abs(dX - dX_ref) <= dX_tol), what
                assert np.all(np.abs(dW - dW_ref) <= dW_tol), what
            Y = np.full((N, M), np.nan, np.float32)
            linear_fwd(X, W, np.zeros(M, np.float32), Y, nt)
            assert np.all(np.abs(Y - Y_ref) <= Y_tol), f"{(N, K, M)} forward nt={nt}"


def test_gemm_plan_is_a_fixed_rule():
    from nbrgc.kernels.gemm_plan import N_SITES, plan_for
    for nt in (1, 3, 5):
        assert not plan_for(nt=nt).any()
    for nt in (2, 4, 8):
        p = plan_for(nt=nt)
        assert p.shape == (N_SITES,) and list(p[0:8:2]) == [TASKS] * 4 and not p[1:8:2].any()
        assert not p[8:].any()  # the head: the decoder writes dX over X, never side by side
        assert plan_for(nt=nt) is p and not p.flags.writeable


# ------------------------------------------------------------------------------------------------ layernorm

@SETTINGS
@given(st.data())
def test_layernorm_grad_vs_finite_differences(data):
    N = data.draw(st.integers(1, 12), label="rows")
    D = data.draw(st.integers(1, 12), label="width")
    nt = data.draw(threads)
    seed = data.draw(seeds())
    # values in [-2, 2] plus a small seeded jitter so no row is (nearly) constant: a constant row puts
    # LayerNorm at its eps-regularised kink (rstd ~ 316), where central differences lose precision
    X = data.draw(float64_arrays((N, D), scale=2.0)) + 0.1 * _normal(seed, N, D)
    w = data.draw(float64_arrays((D,), scale=2.0))
    b = data.draw(float64_arrays((D,), scale=2.0))
    R = _normal(seed + 1, N, D)

    def f(X, w, b):
        Y = np.empty((N, D))
        layernorm_fwd(X, w, b, Y, np.empty(N), np.empty(N))
        return float((R * Y).sum())

    Y, mean, rstd = np.empty((N, D)), np.empty(N), np.empty(N)
    layernorm_fwd(X, w, b, Y, mean, rstd)
    dX, dw, db = np.full((N, D), np.nan), np.zeros(D), np.zeros(D)
    partial = np.full((4, 2, D), np.nan)  # per-block scratch, zeroed by the kernel
    layernorm_bwd(R, X, w, mean, rstd, dX, dw, db, partial, nt, 0.0)
    check_grad(f, [X, w, b], [dX.copy(), dw.copy(), db.copy()], seed=seed)

    # dx_beta=1 accumulates into dX (the residual stream), dw/db always accumulate
    dX0 = _normal(seed + 2, N, D)
    dX2, dw2, db2 = dX0.copy(), dw.copy(), db.copy()
    layernorm_bwd(R, X, w, mean, rstd, dX2, dw2, db2, partial, nt, 1.0)
    np.testing.assert_allclose(dX2, dX0 + dX, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(dw2, 2 * dw, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(db2, 2 * db, rtol=1e-12, atol=1e-12)


@SETTINGS
@given(st.data())
def test_layernorm_forward_vs_numpy(data):
    N, D = data.draw(st.integers(1, 12)), data.draw(st.integers(1, 16))
    X = data.draw(float64_arrays((N, D), scale=5.0))
    w, b = data.draw(float64_arrays((D,))), data.draw(float64_arrays((D,)))
    Y, mean, rstd = np.empty((N, D)), np.empty(N), np.empty(N)
    layernorm_fwd(X, w, b, Y, mean, rstd)
    np.testing.assert_allclose(Y, np_layernorm(X, w, b), rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(mean, X.mean(axis=1), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(rstd, 1 / np.sqrt(X.var(axis=1) + EPS), rtol=1e-9)
    Y2 = np.empty((N, D))
    layernorm_apply(X, w, b, mean, rstd, Y2)  # the backward's recomputation
    # equal up to fused multiply-add contraction, which LLVM may apply differently in the two loops
    np.testing.assert_allclose(Y2, Y, rtol=1e-14, atol=1e-14)


# ----------------------------------------------------------------------------------------------------- GELU

@SETTINGS
@given(st.data())
def test_bias_gelu_grad_vs_finite_differences(data):
    N, M = data.draw(st.integers(1, 8)), data.draw(st.integers(1, 16))
    seed = data.draw(seeds())
    pre0 = data.draw(float64_arrays((N, M), scale=6.0))
    b = data.draw(float64_arrays((M,), scale=2.0))
    R = _normal(seed, N, M)

    def f(pre0, b):
        pre, out = pre0.copy(), np.empty((N, M))
        bias_gelu_fwd(pre, b, out)
        return float((R * out).sum())

    pre, out = pre0.copy(), np.empty((N, M))
    bias_gelu_fwd(pre, b, out)
    np.testing.assert_array_equal(pre, pre0 + b)  # the biased pre-activation is kept
    dg = R.copy()
    gelu_bwd(pre, dg)
    check_grad(f, [pre0, b], [dg, dg.sum(axis=0)], seed=seed)


@SETTINGS
@given(st.data())
def test_gelu_forward_vs_numpy(data):
    shape = data.draw(shapes(min_dims=2, max_dims=2, max_side=12))
    x = data.draw(float64_arrays(shape, scale=50.0))  # includes the clamped tails
    out = np.empty(shape)
    gelu_fwd(x, out)
    np.testing.assert_allclose(out, np_gelu(x), rtol=1e-6, atol=1e-7)
    pre, out2 = np.zeros(shape), np.empty(shape)
    bias_gelu_fwd(pre, np.zeros(shape[1]), out2)
    np.testing.assert_allclose(out2, np_gelu(pre), rtol=1e-6, atol=1e-7)
    # saturated tails (the sigmoid argument is clamped): finite, gelu(x) = x exactly for large x and
    # ~0 for very negative x, with derivatives 1 and ~0
    big = np.array([[-60.0, -20.0, 0.0, 20.0, 60.0, 1e4]])
    o = np.empty_like(big)
    gelu_fwd(big, o)
    np.testing.assert_array_equal(o[0, 2:], [0.0, 20.0, 60.0, 1e4])
    np.testing.assert_allclose(o[0, :2], 0.0, atol=1e-12)
    d = np.ones_like(big)
    gelu_bwd(big, d)
    np.testing.assert_allclose(d, [[0.0, 0.0, 0.5, 1.0, 1.0, 1.0]], atol=1e-12)


# ------------------------------------------------------------------------------------------------ attention

@st.composite
def attention_case(draw):
    B, T, H = draw(st.integers(1, 3), label="B"), draw(st.integers(1, 6), label="T"), draw(
        st.integers(1, 3), label="H")
    hd = draw(st.integers(1, 4), label="head_dim")
    return B, T, H, hd


@SETTINGS
@given(attention_case(), st.integers(1, 4), st.booleans(), seeds(), st.data())
def test_attention_grad_vs_finite_differences(case, n_scratch, lean, seed, data):
    """Both pairs: probabilities kept for the backward, or (``lean``) recomputed there."""
    B, T, H, hd = case
    d = H * hd
    qkv = data.draw(float64_arrays((B * T, 3 * d), scale=2.0))
    R = _normal(seed, B * T, d)

    def fwd(qkv, probs, y):
        if lean:
            attention_fwd_lean(qkv, B, T, H, np.full((n_scratch, T, T), np.nan), y)
        else:
            attention_fwd(qkv, B, T, H, probs, y)

    def f(qkv):
        y = np.empty((B * T, d))
        fwd(qkv, np.empty((B, H, T, T)), y)
        return float((R * y).sum())

    probs, y = np.full((B, H, T, T), np.nan), np.full((B * T, d), np.nan)
    fwd(qkv, probs, y)
    dqkv = np.full((B * T, 3 * d), np.nan)  # fully overwritten
    scratch = np.full((n_scratch, T, T), np.nan)
    if lean:
        attention_bwd_lean(R, qkv, B, T, H, np.full((n_scratch, T, T), np.nan), scratch, dqkv)
    else:
        attention_bwd(R, qkv, B, T, H, probs, scratch, dqkv)
    check_grad(f, [qkv], [dqkv], seed=seed)


@SETTINGS
@given(attention_case(), st.data())
def test_attention_forward_vs_numpy(case, data):
    B, T, H, hd = case
    d = H * hd
    qkv = data.draw(float64_arrays((B * T, 3 * d), scale=4.0))
    probs, y = np.full((B, H, T, T), np.nan), np.full((B * T, d), np.nan)
    attention_fwd(qkv, B, T, H, probs, y)
    p_ref, y_ref = np_attention(qkv, B, T, H)
    np.testing.assert_allclose(probs, p_ref, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(y, y_ref, rtol=1e-10, atol=1e-10)
    # masked entries are exact zeros, rows sum to one
    assert np.all(probs[..., ~np.tril(np.ones((T, T), bool))] == 0.0)
    np.testing.assert_allclose(probs.sum(axis=-1), 1.0, rtol=1e-12)
    if T == 1:  # a single position attends only to itself: y = v
        np.testing.assert_allclose(y, qkv[:, 2 * d:], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("B,T,H,hd", [(2, 5, 3, 2), (2, 130, 2, 8), (1, 64, 4, 4)])
def test_attention_recompute_is_bitwise_the_stored_path(dtype, B, T, H, hd):
    """Same calls on the same shapes: recomputing the probabilities changes no bit of y or dqkv,
    for one query block and for several (T > QB), with any number of scratch buffers."""
    d = H * hd
    qkv, dy = _normal(0, B * T, 3 * d).astype(dtype), _normal(1, B * T, d).astype(dtype)
    probs, y = np.empty((B, H, T, T), dtype), np.empty((B * T, d), dtype)
    attention_fwd(qkv, B, T, H, probs, y)
    want = np.empty((B * T, 3 * d), dtype)
    attention_bwd(dy, qkv, B, T, H, probs, np.zeros((2, T, T), dtype), want)
    for n_scratch in (1, 3, 2 * B * H + 1):
        y2 = np.full((B * T, d), np.nan, dtype)
        attention_fwd_lean(qkv, B, T, H, np.full((n_scratch, T, T), np.nan, dtype), y2)
        assert np.array_equal(y2, y)
        got = np.full((B * T, 3 * d), np.nan, dtype)
        attention_bwd_lean(dy, qkv, B, T, H, np.full((n_scratch, T, T), np.nan, dtype),
                           np.full((n_scratch, T, T), np.nan, dtype), got)
        assert np.array_equal(got, want), n_scratch


@pytest.mark.parametrize("T", [5, 130])
def test_attention_backward_leaves_probs_alone_and_uses_any_scratch_count(T):
    """The backward only reads the kept probabilities (bit for bit unchanged, so a second backward
    gives the same gradients), for one query block and several, with any number of scratch
    buffers."""
    B, H, hd = 2, 3, 2
    d = H * hd
    qkv, dy = _normal(0, B * T, 3 * d), _normal(1, B * T, d)
    probs, y = np.empty((B, H, T, T)), np.empty((B * T, d))
    attention_fwd(qkv, B, T, H, probs, y)
    kept = probs.copy()
    out = []
    for n_scratch in (1, 2, 6, 9):
        dqkv = np.full((B * T, 3 * d), np.nan)
        attention_bwd(dy, qkv, B, T, H, probs, np.full((n_scratch, T, T), np.nan), dqkv)
        assert np.array_equal(probs, kept, equal_nan=True)  # unwritten entries may be NaN
        out.append(dqkv)
    for o in out[1:]:
        np.testing.assert_array_equal(o, out[0])


# ---------------------------------------------------------------------------------------- cross-entropy

@SETTINGS
@given(st.data())
def test_xent_fwd_bwd(data):
    N, V = data.draw(st.integers(1, 10), label="rows"), data.draw(st.integers(2, 12), label="vocab")
    logits = data.draw(float64_arrays((N, V), scale=20.0))
    targets = np.array(data.draw(st.lists(st.integers(0, V - 1), min_size=N, max_size=N)), np.int32)
    scale = data.draw(st.floats(0.01, 2.0))
    seed = data.draw(seeds())
    ref = -np_log_softmax(logits)[np.arange(N), targets]

    losses_f = np.empty(N)
    tot_f = xent_fwd(logits, targets, losses_f)
    np.testing.assert_allclose(losses_f, ref, rtol=1e-12, atol=1e-12)
    assert math.isclose(tot_f, ref.sum(), rel_tol=1e-12, abs_tol=1e-12)

    g, losses = logits.copy(), np.empty(N)
    tot = xent_fwd_bwd(g, targets, losses, scale)
    # the same row losses as the eval kernel (up to the last bit: the two compile differently)
    np.testing.assert_allclose(losses, losses_f, rtol=1e-14, atol=1e-14)
    assert math.isclose(tot, tot_f, rel_tol=1e-14, abs_tol=1e-13)
    onehot = np.eye(V)[targets]
    np.testing.assert_allclose(g, scale * (np.exp(np_log_softmax(logits)) - onehot), rtol=1e-10,
                               atol=1e-12)

    def f(z):
        return scale * xent_fwd(z, targets, np.empty(N))

    # The loss is log(sum exp(z - m)) + m - z_t: with |z| up to 20 the cancellation m - z_t leaves
    # rounding of ~|z| * 1e-16 in f, i.e. ~|z| * 1e-10 in a central difference at eps 1e-6, which
    # swamps a tiny gradient (a confident row: logits [12, 0] gives 1e-5). atol covers that floor.
    check_grad(f, [logits], [g], seed=seed, atol=float(np.abs(logits).max()) * 5e-10 + 1e-9)


def test_xent_is_stable_for_huge_logits():
    logits = np.array([[1e4, 0.0, -1e4], [-1e4, -1e4, -1e4]])
    t = np.array([0, 2], np.int32)
    losses = np.empty(2)
    xent_fwd_bwd(logits.copy(), t, losses, 1.0)
    np.testing.assert_allclose(losses, [0.0, np.log(3.0)], atol=1e-12)


# ------------------------------------------------------------------------------------------------ embedding

@SETTINGS
@given(st.data())
def test_embedding_grad_with_repeated_tokens(data):
    B, T = data.draw(st.integers(1, 4), label="B"), data.draw(st.integers(1, 6), label="T")
    V = data.draw(st.integers(1, 4), label="vocab")  # small: tokens repeat
    ctx = T + data.draw(st.integers(0, 3), label="extra ctx")
    D = data.draw(st.integers(1, 24), label="width")
    seed = data.draw(seeds())
    tokens = np.array(data.draw(st.lists(st.integers(0, V - 1), min_size=B * T, max_size=B * T)),
                      np.int32).reshape(B, T)
    wte = data.draw(float64_arrays((V, D)))
    wpe = data.draw(float64_arrays((ctx, D)))
    R = _normal(seed, B * T, D)

    out = np.full((B * T, D), np.nan)
    embedding_fwd(tokens, wte, wpe, out)
    np.testing.assert_array_equal(out, wte[tokens.reshape(-1)] + np.tile(wpe[:T], (B, 1)))

    def f(wte, wpe):
        o = np.empty((B * T, D))
        embedding_fwd(tokens, wte, wpe, o)
        return float((R * o).sum())

    dwte, dwpe = np.zeros((V, D)), np.zeros((ctx, D))
    embedding_bwd(tokens, R, dwte, dwpe)
    ref_te, ref_pe = np.zeros((V, D)), np.zeros((ctx, D))
    np.add.at(ref_te, tokens.reshape(-1), R)
    np.add.at(ref_pe, np.tile(np.arange(T), B), R)
    np.testing.assert_allclose(dwte, ref_te, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(dwpe, ref_pe, rtol=1e-12, atol=1e-12)
    assert np.all(dwpe[T:] == 0.0)
    check_grad(f, [wte, wpe], [dwte.copy(), dwpe.copy()], seed=seed)
    # accumulates (+=)
    embedding_bwd(tokens, R, dwte, dwpe)
    np.testing.assert_allclose(dwte, 2 * ref_te, rtol=1e-12, atol=1e-12)


# ---------------------------------------------------------------------------------------------------- AdamW

@FEW
@given(n=st.sampled_from([1, 7, 100, _CHUNK + 3, 2 * _CHUNK + 17]), steps=st.integers(1, 4),
       lr=st.floats(1e-4, 1e-1), wd=st.sampled_from([0.0, 0.1, 0.5]),
       gscale=st.sampled_from([1.0, 0.3]), dtype=st.sampled_from([np.float64, np.float32]),
       seed=seeds())
def test_adamw_update_vs_numpy(n, steps, lr, wd, gscale, dtype, seed):
    rng = np.random.default_rng(seed)
    b1, b2, eps = 0.9, 0.95, 1e-8
    P = rng.standard_normal(n).astype(dtype)
    M, V = np.zeros(n, dtype), np.zeros(n, dtype)
    mask = (rng.random(n) < 0.5).astype(np.uint8)
    rP, rM, rV = P.astype(np.float64), M.astype(np.float64), V.astype(np.float64)
    tol = 1e-12 if dtype == np.float64 else 2e-6
    for step in range(1, steps + 1):
        G = rng.standard_normal(n).astype(dtype)
        adamw_update(P, G, M, V, mask, lr, b1, b2, eps, wd, step, gscale)
        rP, rM, rV = np_adamw(rP, G, rM, rV, mask, lr, b1, b2, eps, wd, step, gscale)
        np.testing.assert_allclose(M, rM, rtol=tol, atol=tol)
        np.testing.assert_allclose(V, rV, rtol=tol, atol=tol)
        np.testing.assert_allclose(P, rP, rtol=tol, atol=tol * 10)
        rP, rM, rV = P.astype(np.float64), M.astype(np.float64), V.astype(np.float64)


def test_adamw_decay_only_where_masked_and_bias_correction():
    n = 6
    P = np.full(n, 2.0)
    G = np.zeros(n)
    M, V = np.zeros(n), np.zeros(n)
    mask = np.array([1, 0, 1, 0, 0, 1], np.uint8)
    lr, wd = 0.1, 0.5
    adamw_update(P, G, M, V, mask, lr, 0.9, 0.95, 1e-8, wd, 1, 1.0)
    # zero gradient: only the decoupled decay moves the parameters, only where mask = 1
    np.testing.assert_array_equal(P, np.where(mask, 2.0 * (1 - lr * wd), 2.0))
    # first step with bias correction: the update is lr * g/|g| (up to eps) whatever g's size
    for g in (1e-3, 5.0):
        P, M, V = np.zeros(3), np.zeros(3), np.zeros(3)
        adamw_update(P, np.array([g, -g, 0.0]), M, V, np.zeros(3, np.uint8), 0.01, 0.9, 0.95, 1e-12,
                     0.0, 1, 1.0)
        np.testing.assert_allclose(P, [-0.01, 0.01, 0.0], rtol=1e-6)
    # gscale scales the gradient entering the moments
    P, M, V = np.zeros(2), np.zeros(2), np.zeros(2)
    adamw_update(P, np.array([2.0, 4.0]), M, V, np.zeros(2, np.uint8), 0.01, 0.9, 0.95, 1e-8, 0.0, 1,
                 0.25)
    np.testing.assert_allclose(M, 0.1 * np.array([0.5, 1.0]))
    np.testing.assert_allclose(V, 0.05 * np.array([0.25, 1.0]))


# --------------------------------------------------------------------------------- reductions and fill

@FEW
@given(n=st.sampled_from([0, 1, 5, _CHUNK - 1, _CHUNK, _CHUNK + 1, 3 * _CHUNK + 11]),
       dtype=st.sampled_from([np.float64, np.float32]), seed=seeds())
def test_sumsq(n, dtype, seed):
    G = (np.random.default_rng(seed).standard_normal(n) * 3).astype(dtype)
    ref = float(np.sum(G.astype(np.float64) ** 2))
    got = float(sumsq(G))
    assert math.isclose(got, ref, rel_tol=1e-12, abs_tol=1e-300), (got, ref)


def test_sumsq_accumulates_float32_in_float64():
    G = np.full(4 * _CHUNK, np.float32(1e-3))
    # a float32 running sum would lose ~1e-4 relative here; float64 keeps it exact to ~1e-12
    assert math.isclose(float(sumsq(G)), 4 * _CHUNK * float(np.float32(1e-3)) ** 2, rel_tol=1e-10)
    big = np.full(10, np.float32(1e20))  # squares overflow float32, not float64
    assert math.isclose(float(sumsq(big)), 10 * float(np.float32(1e20)) ** 2, rel_tol=1e-6)


@FEW
@given(n=st.sampled_from([1, 9, _CHUNK, 2 * _CHUNK + 5]), bad=st.sampled_from([np.nan, np.inf, -np.inf]),
       dtype=st.sampled_from([np.float64, np.float32]), where=st.floats(0.0, 1.0), seed=seeds())
def test_all_finite(n, bad, dtype, where, seed):
    G = np.random.default_rng(seed).standard_normal(n).astype(dtype)
    assert all_finite(G)
    G[min(n - 1, int(where * n))] = bad
    assert not all_finite(G)
    assert all_finite(np.zeros(0, dtype))


def test_fill():
    X = np.empty(2 * _CHUNK + 3)
    fill(X, 1.5)
    assert np.all(X == 1.5)


# ------------------------------------------------------------------------ float32 agrees with float64

@FEW
@given(attention_case(), st.integers(1, 20), seeds())
def test_forward_kernels_float32_match_float64(case, M, seed):
    B, T, H, hd = case
    d, N = H * hd, B * T
    rng = np.random.default_rng(seed)
    f64 = {"X": rng.standard_normal((N, d)), "W": rng.standard_normal((d, M)) * 0.3,
           "b": rng.standard_normal(M), "qkv": rng.standard_normal((N, 3 * d)),
           "w": 1 + 0.1 * rng.standard_normal(d), "lb": 0.1 * rng.standard_normal(d)}
    tokens = rng.integers(0, 5, (B, T)).astype(np.int32)
    wte, wpe = rng.standard_normal((5, d)), rng.standard_normal((T, d))
    targets = rng.integers(0, M, N).astype(np.int32)

    def run(dt):
        a = {k: v.astype(dt) for k, v in f64.items()}
        out = {}
        out["linear"] = np.empty((N, M), dt)
        linear_fwd(a["X"], a["W"], a["b"], out["linear"], 2)
        out["ln"] = np.empty((N, d), dt)
        layernorm_fwd(a["X"], a["w"], a["lb"], out["ln"], np.empty(N, dt), np.empty(N, dt))
        pre, out["gelu"] = out["linear"].copy(), np.empty((N, M), dt)
        bias_gelu_fwd(pre, a["b"], out["gelu"])
        out["attn"] = np.empty((N, d), dt)
        attention_fwd(a["qkv"], B, T, H, np.empty((B, H, T, T), dt), out["attn"])
        out["emb"] = np.empty((N, d), dt)
        embedding_fwd(tokens, wte.astype(dt), wpe.astype(dt), out["emb"])
        out["xent"] = np.empty(N, dt)
        xent_fwd(out["linear"].copy(), targets, out["xent"])
        return out

    o64, o32 = run(np.float64), run(np.float32)
    for k in o64:
        assert o32[k].dtype == np.float32, k
        scale = max(1.0, float(np.abs(o64[k]).max()))
        np.testing.assert_allclose(o32[k], o64[k], rtol=1e-4, atol=1e-5 * scale, err_msg=k)


def _thread_ids_of(work):
    """Which Numba threads ran the iterations of a 64-iteration region bracketed as the kernels do,
    and the calling thread's group after it."""
    import numba
    from numba import njit, prange
    from nbrgc.kernels.serial import restore_threads, serial_below

    @njit(parallel=True, nogil=True)
    def probe(out, work):
        prev = serial_below(work)
        for i in prange(out.shape[0]):
            out[i] = numba.get_thread_id()
        restore_threads(prev)

    out = np.full(64, -1, np.int64)
    probe(out, work)
    return set(out.tolist()), numba.get_num_threads()


def test_small_work_runs_in_the_calling_thread_and_the_group_is_restored():
    import numba
    from nbrgc.kernels.serial import SERIAL_WORK
    if numba.config.NUMBA_NUM_THREADS < 2:
        pytest.skip("one Numba thread: every region is serial")
    old = numba.get_num_threads()
    numba.set_num_threads(2)
    try:
        assert _thread_ids_of(SERIAL_WORK - 1) == ({0}, 2)
        assert _thread_ids_of(SERIAL_WORK) == ({0, 1}, 2)
        numba.set_num_threads(1)
        assert _thread_ids_of(0) == ({0}, 1)
    finally:
        numba.set_num_threads(old)


def _every_parallel_kernel(n_rows, d, seed=0):
    """Every parallel kernel once on rows of width d (the MLP at 4d, the logits at 256), on fresh
    copies of the same inputs; returns every output by name."""
    from nbrgc.kernels.gemm_plan import plan_for
    from nbrgc.kernels.blocks import _copy_add_bias
    rng = np.random.default_rng(seed)
    f = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    B, H = 4, 2
    T = n_rows // B
    X, w, b, W = f(n_rows, d), f(d), f(d), f(d, 4 * d) * 0.2
    dY4, qkv, L = f(n_rows, 4 * d), f(n_rows, 3 * d) * 0.3, f(n_rows, 256)
    tokens = rng.integers(0, 256, (B, T))
    targets = rng.integers(0, 256, n_rows)
    n = 4 * d * d + 1000
    P, G = f(n), f(n)
    out = {}
    o = {k: np.empty((n_rows, d), np.float32) for k in ("ln", "lnA", "dX", "emb", "bias")}
    m, r = np.empty(n_rows, np.float32), np.empty(n_rows, np.float32)
    layernorm_fwd(X, w, b, o["ln"], m, r)
    layernorm_apply(X, w, b, m, r, o["lnA"])
    dw, db = np.zeros(d, np.float32), np.zeros(d, np.float32)
    layernorm_bwd(X * 0.5, X, w, m, r, o["dX"], dw, db, np.zeros((2, 2, d), np.float32), 2, 0.0)
    _copy_add_bias(X, b, o["bias"])
    embedding_fwd(tokens, f(256, d), f(T, d), o["emb"])
    dwte, dwpe = np.zeros((256, d), np.float32), np.zeros((T, d), np.float32)
    embedding_bwd(tokens, X, dwte, dwpe)
    pre, g = X @ W, np.empty((n_rows, 4 * d), np.float32)
    bias_gelu_fwd(pre, f(4 * d), g)
    g2 = np.empty_like(g)
    gelu_fwd(pre, g2)
    dg = dY4.copy()
    gelu_bwd(pre, dg)
    Y = np.empty((n_rows, 4 * d), np.float32)
    linear_fwd(X, W, f(4 * d), Y, 2)
    dXl, dW, dbl = np.empty((n_rows, d), np.float32), np.zeros_like(W), np.zeros(4 * d, np.float32)
    linear_bwd(X, W, dY4, dXl, dW, dbl, 2, 0.0, *plan_for(2)[:2])
    dXs, dWs, dbs = np.empty((n_rows, d), np.float32), np.zeros_like(W), np.zeros(4 * d, np.float32)
    linear_bwd(X, W, dY4, dXs, dWs, dbs, 2, 0.0, 0, 1)
    # zeros: entries above the diagonal past a query block are never written (unspecified)
    probs, att = np.zeros((B, H, T, T), np.float32), np.empty((n_rows, d), np.float32)
    attention_fwd(qkv, B, T, H, probs, att)
    dqkv = np.empty_like(qkv)
    attention_bwd(X, qkv, B, T, H, probs, np.empty((2, T, T), np.float32), dqkv)
    losses, Lg = np.empty(n_rows, np.float32), L.copy()
    out["xent"] = (xent_fwd_bwd(Lg, targets, losses, 0.5), xent_fwd(L, targets, losses.copy()))
    M_, V_ = np.zeros(n, np.float32), np.zeros(n, np.float32)
    adamw_update(P, G, M_, V_, np.ones(n, np.uint8), 1e-3, 0.9, 0.95, 1e-8, 0.1, 1, 0.7)
    out["sums"] = (sumsq(G), all_finite(G))
    Fz = np.empty(n, np.float32)
    fill(Fz, 1.5)
    out.update(o, m=m, r=r, dw=dw, db=db, dwte=dwte, dwpe=dwpe, pre=pre, g=g, g2=g2, dg=dg, Y=Y,
               dXl=dXl, dW=dW, dbl=dbl, dXs=dXs, dWs=dWs, dbs=dbs, probs=probs, att=att,
               dqkv=dqkv, losses=losses, Lg=Lg, P=P, M=M_, V=V_, fill=Fz)
    return out


@pytest.mark.parametrize("n_rows, d", [(16, 16), (64, 32), (1024, 64)])
def test_group_of_one_or_two_gives_the_same_bits(n_rows, d):
    """The serial switch relies on this: with the same ``nt``, a kernel's bits do not depend on the
    calling thread's group, below the threshold (16 rows), across it (64 rows of 32: tiny's shapes)
    and above it (1024 rows of 64: demo's), and every kernel gives the group back as it found it."""
    import numba
    if numba.config.NUMBA_NUM_THREADS < 2:
        pytest.skip("one Numba thread")
    old = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        one = _every_parallel_kernel(n_rows, d)
        assert numba.get_num_threads() == 1
        numba.set_num_threads(2)
        two = _every_parallel_kernel(n_rows, d)
        assert numba.get_num_threads() == 2
    finally:
        numba.set_num_threads(old)
    for k in one:
        np.testing.assert_array_equal(np.asarray(one[k]), np.asarray(two[k]), err_msg=k)
