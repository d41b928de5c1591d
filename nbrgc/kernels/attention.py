"""Causal multi-head self-attention over a fused [q | k | v] projection (heads contiguous in each).

One (batch, head) pair per ``prange`` iteration; each runs its small GEMMs single-threaded on strided
views of ``qkv`` (no head transposes are materialised). The probabilities are kept for the backward.
Softmax subtracts the row maximum and only visits the causal prefix; the masked upper triangle is
stored as exact zeros so the P@V GEMM ignores it.
"""
import numpy as np
from numba import njit, prange

from .fastmath import FLAGS, fexp
from .gemm import gemm


@njit(parallel=True, nogil=True, cache=True, fastmath=FLAGS)
def attention_fwd(qkv, B, T, H, probs, y):
    """qkv (B*T, 3d) -> probs (B, H, T, T), y (B*T, d)."""
    d = qkv.shape[1] // 3
    hd = d // H
    scale = 1.0 / np.sqrt(hd)
    for bh in prange(B * H):
        b = bh // H
        h = bh % H
        rows = qkv[b * T:(b + 1) * T]
        q = rows[:, h * hd:(h + 1) * hd]
        k = rows[:, d + h * hd:d + (h + 1) * hd]
        v = rows[:, 2 * d + h * hd:2 * d + (h + 1) * hd]
        P = probs[b, h]
        gemm(False, True, scale, q, k, 0.0, P)
        for i in range(T):
            m = P[i, 0]
            for j in range(1, i + 1):
                if P[i, j] > m:
                    m = P[i, j]
            s = 0.0
            for j in range(i + 1):
                e = fexp(P[i, j] - m)
                P[i, j] = e
                s += e
            inv = 1.0 / s
            for j in range(i + 1):
                P[i, j] *= inv
            for j in range(i + 1, T):
                P[i, j] = 0.0
        gemm(False, False, 1.0, P, v, 0.0, y[b * T:(b + 1) * T, h * hd:(h + 1) * hd])


@njit(parallel=True, nogil=True, cache=True, fastmath=FLAGS)
def attention_bwd(dy, qkv, B, T, H, probs, scratch, dqkv):
    """dy (B*T, d) -> dqkv (B*T, 3d) (overwritten). ``probs`` is consumed (overwritten by the score
    gradients); ``scratch`` (>= 1, T, T) gives each parallel chunk its own dP buffer."""
    d = qkv.shape[1] // 3
    hd = d // H
    scale = 1.0 / np.sqrt(hd)
    nb = max(1, min(scratch.shape[0], B * H))
    step = (B * H + nb - 1) // nb
    for blk in prange(nb):
        G = scratch[blk]
        for bh in range(blk * step, min(B * H, (blk + 1) * step)):
            b = bh // H
            h = bh % H
            rows = qkv[b * T:(b + 1) * T]
            q = rows[:, h * hd:(h + 1) * hd]
            k = rows[:, d + h * hd:d + (h + 1) * hd]
            v = rows[:, 2 * d + h * hd:2 * d + (h + 1) * hd]
            drows = dqkv[b * T:(b + 1) * T]
            dq = drows[:, h * hd:(h + 1) * hd]
            dk = drows[:, d + h * hd:d + (h + 1) * hd]
            dv = drows[:, 2 * d + h * hd:2 * d + (h + 1) * hd]
            dyh = dy[b * T:(b + 1) * T, h * hd:(h + 1) * hd]
            P = probs[b, h]
            gemm(False, True, 1.0, dyh, v, 0.0, G)
            gemm(True, False, 1.0, P, dyh, 0.0, dv)
            # softmax backward, dS = P * (dP - sum_j dP*P), written over P (no longer needed)
            for i in range(T):
                s = 0.0
                for j in range(i + 1):
                    s += G[i, j] * P[i, j]
                for j in range(i + 1):
                    P[i, j] = P[i, j] * (G[i, j] - s)
            gemm(False, False, scale, P, k, 0.0, dq)
            gemm(True, False, scale, P, q, 0.0, dk)
