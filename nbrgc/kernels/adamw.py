"""AdamW over one flat buffer: one pass for the gradient norm, one fused pass for clip + update.

Decoupled weight decay (PyTorch order: p *= 1 - lr*wd, then the Adam step), applied only where
``decay_mask`` is 1 (matrices); bias-corrected moments.
"""
import numpy as np
from numba import njit, prange

from .fastmath import FLAGS

_CHUNK = 1 << 14


@njit(parallel=True, nogil=True, cache=True, fastmath=FLAGS, error_model="numpy")
def sumsq(G):
    n = G.shape[0]
    nchunks = (n + _CHUNK - 1) // _CHUNK
    part = np.zeros(nchunks)
    for c in prange(nchunks):
        s = 0.0
        for i in range(c * _CHUNK, min(n, (c + 1) * _CHUNK)):
            s += np.float64(G[i]) * G[i]
        part[c] = s
    return part.sum()


@njit(parallel=True, nogil=True, cache=True, error_model="numpy")
def all_finite(G):
    n = G.shape[0]
    nchunks = (n + _CHUNK - 1) // _CHUNK
    bad = np.zeros(nchunks, np.uint8)
    for c in prange(nchunks):
        for i in range(c * _CHUNK, min(n, (c + 1) * _CHUNK)):
            if not np.isfinite(G[i]):
                bad[c] = 1
                break
    return bad.sum() == 0


@njit(parallel=True, nogil=True, cache=True, fastmath=FLAGS, error_model="numpy")
def adamw_update(P, G, M, V, decay_mask, lr, beta1, beta2, eps, wd, step, gscale):
    """One AdamW step at 1-based ``step``; gradients are multiplied by ``gscale`` (clipping) first."""
    bc1 = 1.0 - beta1 ** step
    bc2 = 1.0 - beta2 ** step
    n = P.shape[0]
    nchunks = (n + _CHUNK - 1) // _CHUNK
    for c in prange(nchunks):
        for i in range(c * _CHUNK, min(n, (c + 1) * _CHUNK)):
            g = G[i] * gscale
            m = beta1 * M[i] + (1.0 - beta1) * g
            v = beta2 * V[i] + (1.0 - beta2) * g * g
            M[i] = m
            V[i] = v
            p = P[i]
            if decay_mask[i]:
                p *= 1.0 - lr * wd
            P[i] = p - lr * (m / bc1) / (np.sqrt(v / bc2) + eps)


@njit(parallel=True, nogil=True, cache=True, error_model="numpy")
def fill(X, value):
    n = X.shape[0]
    nchunks = (n + _CHUNK - 1) // _CHUNK
    for c in prange(nchunks):
        for i in range(c * _CHUNK, min(n, (c + 1) * _CHUNK)):
            X[i] = value
