"""Bias + GELU (tanh approximation), fused; the backward recomputes the activation instead of storing it.

The backward evaluates the sigmoid once per element: :func:`gelu_slope` recomputes the activation
(the input of the MLP-down weight gradient) and, in the same pass, overwrites the kept pre-activation
with the GELU derivative, which is all the backward still needs of it. Once the MLP-down data gradient
exists, :func:`slope_colsum` multiplies it by that derivative and forms the MLP-up bias gradient in
one pass over it (its read by the bias column sum was a pass of its own).

0.5 x (1 + tanh(u)) is evaluated as x * sigmoid(2u), the same function, with the vectorisable
:func:`~nbrgc.kernels.fastmath.fexp` (libm's tanh and exp are scalar calls). The argument is clamped
where sigmoid is already 0 or 1 to the last bit.
"""
import numpy as np
from numba import njit, prange

from .fastmath import FLAGS, fexp

_C2 = np.float32(2.0 * np.sqrt(2.0 / np.pi))
_A = np.float32(0.044715)
_A3 = np.float32(3.0 * 0.044715)
_LIM = np.float32(40.0)
# float32 literals: a float64 literal would promote every float32 element to float64 (half the
# vector width, and the scalar float64 exp). They are exact, so float64 inputs lose nothing.
_ONE = np.float32(1.0)


@njit(nogil=True, inline="always", cache=True, error_model="numpy")
def _sig2u(x):
    u = _C2 * (x + _A * x * x * x)
    u = min(max(u, -_LIM), _LIM)
    return _ONE / (_ONE + fexp(-u))


@njit(parallel=True, nogil=True, fastmath=FLAGS, cache=True, error_model="numpy")
def bias_gelu_fwd(pre, b, out):
    """pre += b (kept for the backward), out = gelu(pre)."""
    N, M = pre.shape
    for i in prange(N):
        p = pre[i]
        o = out[i]
        for j in range(M):
            x = p[j] + b[j]
            p[j] = x
            o[j] = x * _sig2u(x)


@njit(parallel=True, nogil=True, fastmath=FLAGS, cache=True, error_model="numpy")
def gelu_slope(pre, out):
    """out = gelu(pre), then pre <- gelu'(pre) in place (the pre-activation is consumed)."""
    N, M = pre.shape
    for i in prange(N):
        p = pre[i]
        o = out[i]
        for j in range(M):
            x = p[j]
            s = _sig2u(x)
            o[j] = x * s
            p[j] = s + x * s * (_ONE - s) * _C2 * (_ONE + _A3 * x * x)


@njit(nogil=True, cache=True, error_model="numpy")  # no contraction: db sums the stored dg exactly
def _slope_colsum_cols(dg, slope, db, s, e):
    """Columns s..e-1: dg *= slope, db += column sums of the result, rows in order (the same bits
    however the columns are cut). Views indexed from 0 so the inner loop vectorises."""
    acc = db[s:e]
    for r in range(dg.shape[0]):
        row = dg[r, s:e]
        srow = slope[r, s:e]
        for j in range(e - s):
            v = row[j] * srow[j]
            row[j] = v
            acc[j] += v


@njit(parallel=True, nogil=True, cache=True, error_model="numpy")
def slope_colsum(dg, slope, db, nt):
    """dg <- dg * slope (the gradient through GELU), db += column sums of it; split over column
    blocks, so there are no write races and every thread count gives the same bits."""
    M = dg.shape[1]
    nb = max(1, min(nt, M // 16))
    step = (M + nb - 1) // nb
    for i in prange(nb):
        s = i * step
        _slope_colsum_cols(dg, slope, db, s, min(M, s + step))
