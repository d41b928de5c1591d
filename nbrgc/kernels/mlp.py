"""Bias + GELU (tanh approximation), fused; the backward recomputes the activation instead of storing it.

0.5 x (1 + tanh(u)) is evaluated as x * sigmoid(2u), the same function, with the vectorisable
:func:`~nbrgc.kernels.fastmath.fexp` (libm's tanh and exp are scalar calls). The argument is clamped
where sigmoid is already 0 or 1 to the last bit.
"""
import numpy as np
from numba import njit, prange

from .fastmath import FLAGS, fexp
from .serial import restore_threads, serial_below

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
    prev = serial_below(N * M)
    for i in prange(N):
        p = pre[i]
        o = out[i]
        for j in range(M):
            x = p[j] + b[j]
            p[j] = x
            o[j] = x * _sig2u(x)
    restore_threads(prev)


@njit(parallel=True, nogil=True, fastmath=FLAGS, cache=True, error_model="numpy")
def gelu_fwd(pre, out):
    N, M = pre.shape
    prev = serial_below(N * M)
    for i in prange(N):
        p = pre[i]
        o = out[i]
        for j in range(M):
            x = p[j]
            o[j] = x * _sig2u(x)
    restore_threads(prev)


@njit(parallel=True, nogil=True, fastmath=FLAGS, cache=True, error_model="numpy")
def gelu_bwd(pre, dg):
    """dg <- dg * gelu'(pre), in place."""
    N, M = pre.shape
    prev = serial_below(N * M)
    for i in prange(N):
        p = pre[i]
        g = dg[i]
        for j in range(M):
            x = p[j]
            s = _sig2u(x)
            g[j] *= s + x * s * (_ONE - s) * _C2 * (_ONE + _A3 * x * x)
    restore_threads(prev)
