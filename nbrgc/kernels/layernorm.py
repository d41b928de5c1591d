"""LayerNorm over the last axis (eps 1e-5), rows in parallel; backward reduces dw/db per thread block.

Row statistics accumulate in float64; reassociation (FLAGS) lets those sums vectorise instead of
waiting on one add chain.
"""
import numpy as np
from numba import njit, prange

from .fastmath import FLAGS
from .serial import restore_threads, serial_below

EPS = 1e-5
# The branch flag as a runtime value: a literal True/False would compile the kernel once per value
# (see the constants in nbrgc.kernels.gemm), which is what one kernel for both was to save.
_YES, _NO = np.bool_(True), np.bool_(False)


@njit(parallel=True, nogil=True, cache=True, fastmath=FLAGS, error_model="numpy")
def layernorm_rows(X, w, b, Y, mean, rstd, stats):
    """The forward (``stats``: computes and stores the row statistics) and its recompute from the
    stored ones (the backward needs the output; storing it costs memory), one parallel kernel for
    both: each parallel kernel costs a cold start about 2 s of compiling. Each branch is its own
    loop, as the two kernels were: the forward normalises with its float64 statistics, the
    recompute with the stored float32 ones."""
    N, D = X.shape
    prev = serial_below(N * D)
    for i in prange(N):
        if stats:
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
        else:
            ms = mean[i]
            rs = rstd[i]
            for j in range(D):
                Y[i, j] = (X[i, j] - ms) * rs * w[j] + b[j]
    restore_threads(prev)


@njit(nogil=True, cache=True, inline="always", error_model="numpy")
def layernorm_fwd(X, w, b, Y, mean, rstd):
    layernorm_rows(X, w, b, Y, mean, rstd, _YES)


@njit(nogil=True, cache=True, inline="always", error_model="numpy")
def layernorm_apply(X, w, b, mean, rstd, Y):
    """Recompute the forward output from saved statistics."""
    layernorm_rows(X, w, b, Y, mean, rstd, _NO)


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
