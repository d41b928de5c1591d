"""Muon's update of one weight matrix: momentum, then the momentum's orthogonalisation by a Newton-Schulz
iteration (Keller Jordan's Muon, 2024), scaled to AdamW's update size (Moonlight, 2025) so that it
runs at AdamW's learning rate and weight decay.

Why it is here: a gradient a few steps late wrecks AdamW (pipelined backprop, benchmarks/README.md)
and Muon is reported robust to it ("One-step gradient delay is not a barrier for large-scale
asynchronous pipeline parallel LLM pretraining", 2026). Its update has every singular value near
one whatever the gradient's scale, so a stale gradient moves the weights by a bounded, well spread
amount instead of along a few coordinates Adam has blown up.

Serial (one BLAS thread, like every GEMM call here): the matrices of one stage are small, and a
stage worker calls it in its own thread. The bits depend only on the BLAS kernel, as the GEMMs do.
"""
import numpy as np
from numba import njit

from .fastmath import cast_like

# The quintic's coefficients (Keller Jordan's Muon): five steps take every singular value of a
# normalised matrix into about [0.7, 1.2], which is all the update needs.
NS_A, NS_B, NS_C = 3.4445, -4.7750, 2.0315
NS_STEPS = 5


@njit(nogil=True, cache=True, error_model="numpy")
def orthogonalise(G, steps):
    """~U V^T of G = U S V^T: the Newton-Schulz quintic on G / ||G||_F, on the wide orientation
    (rows <= columns), so X X^T is the smaller Gram matrix."""
    m, n = G.shape
    X = np.ascontiguousarray(G.T) if m > n else G.copy()
    norm = np.sqrt(np.sum(X.astype(np.float64) ** 2))
    X *= cast_like(1.0 / (norm + 1e-7), X)
    a, b, c = cast_like(NS_A, X), cast_like(NS_B, X), cast_like(NS_C, X)
    for _ in range(steps):
        A = X @ X.T
        Bm = b * A + c * (A @ A)
        X = a * X + Bm @ X
    return np.ascontiguousarray(X.T) if m > n else X


@njit(nogil=True, cache=True, error_model="numpy")
def muon_update(P, G, M, lr, beta, wd, gscale, steps):
    """One Muon step of the matrix P (2-D views of the flat buffers): M = beta M + g,
    P = P (1 - lr wd) - lr * 0.2 sqrt(max(rows, cols)) * orth(g + beta M) (Nesterov momentum; the
    factor gives the update AdamW's typical RMS of 0.2)."""
    rows, cols = P.shape
    gs, b = cast_like(gscale, P), cast_like(beta, P)
    g = G * gs
    for i in range(rows):
        for j in range(cols):
            M[i, j] = b * M[i, j] + g[i, j]
    O = orthogonalise(g + b * M, steps)
    shrink = cast_like(1.0 - lr * wd, P)
    step = cast_like(lr * 0.2 * np.sqrt(max(rows, cols)), P)
    for i in range(rows):
        for j in range(cols):
            P[i, j] = P[i, j] * shrink - step * O[i, j]
