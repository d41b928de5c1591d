"""LayerNorm over the last axis (eps 1e-5), rows in parallel; backward reduces dw/db per thread block.

Row statistics accumulate in float64; reassociation (FLAGS) lets those sums vectorise instead of
waiting on one add chain.
"""
import numpy as np
from numba import njit, prange

from .fastmath import FLAGS
from .serial import restore_threads, serial_below

EPS = 1e-5


@njit(parallel=True, nogil=True, cache=True, fastmath=FLAGS, error_model="numpy")
def layernorm_fwd(X, w, b, Y, mean, rstd):
    N, D = X.shape
    prev = serial_below(N * D)
    for i in prange(N):
        m = 0.0
        for j in range(D):
            m += X[i, j]
        m /= D
        v = 0.0
        for j in range(D):
            t = X[i, j] - m
            v += t * t
        r = 1.0 / np.sqrt(v / D + EPS)
        mean[i] = m
        rstd[i] = r
        for j in range(D):
            Y[i, j] = (X[i, j] - m) * r * w[j] + b[j]
    restore_threads(prev)


@njit(parallel=True, nogil=True, cache=True, fastmath=FLAGS, error_model="numpy")
def layernorm_apply(X, w, b, mean, rstd, Y):
    """Recompute the forward output from saved statistics (backward needs it; storing it costs memory)."""
    N, D = X.shape
    prev = serial_below(N * D)
    for i in prange(N):
        m = mean[i]
        r = rstd[i]
        for j in range(D):
            Y[i, j] = (X[i, j] - m) * r * w[j] + b[j]
    restore_threads(prev)


@njit(parallel=True, nogil=True, cache=True, fastmath=FLAGS, error_model="numpy")
def layernorm_bwd(dY, X, w, mean, rstd, dX, dw, db, partial, nt, dx_beta):
    """dX = dx_beta * dX + dLN/dX^T dY; dw += sum dY*xhat; db += sum dY.

    ``partial`` (>= nt, 2, D) holds per-block sums so no two threads write the same dw element.
    """
    N, D = X.shape
    nb = max(1, min(nt, partial.shape[0], N))
    step = (N + nb - 1) // nb
    prev = serial_below(2 * N * D)  # two passes over each row
    for blk in prange(nb):
        pw = partial[blk, 0]
        pb = partial[blk, 1]
        pw[:] = 0.0
        pb[:] = 0.0
        for i in range(blk * step, min(N, (blk + 1) * step)):
            m = mean[i]
            r = rstd[i]
            s1 = 0.0
            s2 = 0.0
            for j in range(D):
                xh = (X[i, j] - m) * r
                g = dY[i, j] * w[j]
                s1 += g
                s2 += g * xh
                pw[j] += dY[i, j] * xh
                pb[j] += dY[i, j]
            s1 /= D
            s2 /= D
            for j in range(D):
                xh = (X[i, j] - m) * r
                g = dY[i, j] * w[j]
                val = r * (g - s1 - xh * s2)
                if dx_beta == 0.0:
                    dX[i, j] = val
                else:
                    dX[i, j] = dx_beta * dX[i, j] + val
    restore_threads(prev)
    for blk in range(nb):
        for j in range(D):
            dw[j] += partial[blk, 0, j]
            db[j] += partial[blk, 1, j]
