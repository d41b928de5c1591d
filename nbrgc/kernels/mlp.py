"""Bias + GELU (tanh approximation), fused; the backward recomputes tanh instead of storing it."""
import numpy as np
from numba import njit, prange

_C = np.sqrt(2.0 / np.pi)
_A = 0.044715


@njit(parallel=True, nogil=True, cache=True)
def bias_gelu_fwd(pre, b, out):
    """pre += b (kept for the backward), out = gelu(pre)."""
    N, M = pre.shape
    for i in prange(N):
        for j in range(M):
            x = pre[i, j] + b[j]
            pre[i, j] = x
            out[i, j] = 0.5 * x * (1.0 + np.tanh(_C * (x + _A * x * x * x)))


@njit(parallel=True, nogil=True, cache=True)
def gelu_fwd(pre, out):
    N, M = pre.shape
    for i in prange(N):
        for j in range(M):
            x = pre[i, j]
            out[i, j] = 0.5 * x * (1.0 + np.tanh(_C * (x + _A * x * x * x)))


@njit(parallel=True, nogil=True, cache=True)
def gelu_bwd(pre, dg):
    """dg <- dg * gelu'(pre), in place."""
    N, M = pre.shape
    for i in prange(N):
        for j in range(M):
            x = pre[i, j]
            t = np.tanh(_C * (x + _A * x * x * x))
            dg[i, j] *= 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * _C * (1.0 + 3.0 * _A * x * x)
