"""Causal multi-head self-attention over a fused [q | k | v] projection (heads contiguous in each).

One (batch, head) pair per ``prange`` iteration; each runs its small GEMMs single-threaded on strided
views of ``qkv`` (no head transposes are materialised). Queries are taken in blocks of ``QB`` rows,
and each block only meets the keys at or before its last row, which skips most of the masked upper
triangle (62% of the dense work at T = 256). Softmax subtracts the row maximum and only visits the
causal prefix; the masked entries inside a block are exact zeros.

Two ways to get the probabilities to the backward:

* ``attention_fwd`` keeps them (B, H, T, T) and ``attention_bwd`` only reads them: the fastest, and
  at T = 256 the largest activation of a block (40% of a paper block's memory; it grows with T^2).
  The score gradients go to a small per-chunk buffer that stays in cache rather than over the
  probabilities, which would dirty them and cost a write-back to memory (16 MiB per paper layer).
* ``attention_fwd_lean`` keeps nothing but the output, and ``attention_bwd_lean`` recomputes each
  query block's probabilities with the same calls on the same shapes, so the gradients are the same
  to the last bit; the cost is the score product and the softmax once more.
"""
import numpy as np
from numba import njit, prange

from .fastmath import FLAGS, fexp, fmax
from .gemm import _F, _T, gemm
from .serial import restore_threads, serial_below

QB = 64
_ZERO = np.float32(0.0)  # float32 literals keep float32 rows in float32 (and vectorised)
_ONE = np.float32(1.0)
_LOW = np.float32(-3.0e38)  # finite: stands for a masked score in the row maximum


@njit(nogil=True, cache=True, error_model="numpy")
def _qblock(T):
    return QB if T > QB else T


@njit(nogil=True, cache=True, inline="always", error_model="numpy")
def _work(B, T, H, hd):
    """A forward's work (see nbrgc.kernels.serial): about 0.3 ns serially per (query, key,
    head-dim) triple at tiny's shape (10.6 µs at B 4, H 2, T 16, head 16), where the overhead of
    its small per-head products dominates, so half a unit each."""
    return B * H * T * T * hd // 2


@njit(nogil=True, cache=True, inline="always", error_model="numpy")
def _heads(rows, H, h):
    """Head h's q, k, v (T, hd) as strided views of fused [q | k | v] rows (T, 3d)."""
    d = rows.shape[1] // 3
    hd = d // H
    return (rows[:, h * hd:(h + 1) * hd], rows[:, d + h * hd:d + (h + 1) * hd],
            rows[:, 2 * d + h * hd:2 * d + (h + 1) * hd])


@njit(nogil=True, cache=True, fastmath=FLAGS, error_model="numpy")
def _softmax_causal(P, i0, i1):
    """Row softmax of the block of scores P[i0:i1, 0:i1] over each row's keys j <= i.

    Every loop runs over the whole block width with the mask as a select, not over j <= i: the
    trip count is then the same for all rows (a multiple of the vector width when the block is), so
    no row ends in a scalar remainder loop. Masked entries become exact zeros. Rows are taken from
    the whole (C-contiguous) matrix: a row of a column-sliced view has unknown stride and does not
    vectorise."""
    w = i1
    for i in range(i0, i1):
        row = P[i]
        m = _LOW
        for j in range(w):
            m = fmax(m, row[j] if j <= i else _LOW)
        s = _ZERO
        for j in range(w):
            e = fexp(row[j] - m)  # fexp clamps its argument: masked entries cannot overflow
            e = e if j <= i else _ZERO
            row[j] = e
            s += e
        inv = _ONE / s
        for j in range(w):
            row[j] *= inv


@njit(nogil=True, cache=True, fastmath=FLAGS, error_model="numpy")
def _softmax_causal_bwd(P, dP, i0, i1):
    """dP <- dS = P * (dP - sum_j dP*P) over rows i0..i1-1, keys 0..i1-1 (P is only read). Masked
    entries of P are exact zeros, so they give zeros and the loops run over the whole block width
    (see _softmax_causal)."""
    w = i1
    for i in range(i0, i1):
        prow = P[i]
        grow = dP[i]
        s = _ZERO
        for j in range(w):
            s += grow[j] * prow[j]
        for j in range(w):
            grow[j] = prow[j] * (grow[j] - s)


@njit(nogil=True, cache=True, fastmath=FLAGS, error_model="numpy")
def _scores(q, k, P, i0, i1, scale):
    """Query block i0..i1-1's causal probabilities into P[i0:i1, 0:i1]."""
    gemm(_F, _T, scale, q[i0:i1], k[0:i1], 0.0, P[i0:i1, 0:i1])
    _softmax_causal(P, i0, i1)


@njit(nogil=True, cache=True, fastmath=FLAGS, error_model="numpy")
def _head_bwd(q, k, v, dq, dk, dv, dyh, P, G, T, hd, scale, qb, recompute):
    """One head's backward, query block by query block; P holds the probabilities (or, with
    ``recompute``, is scratch they are recomputed into) and is only read; G takes the
    probability gradients, then the score gradients."""
    for i0 in range(0, T, qb):
        i1 = min(T, i0 + qb)
        if recompute:
            _scores(q, k, P, i0, i1, scale)
        Pb = P[i0:i1, 0:i1]
        Gb = G[i0:i1, 0:i1]
        beta = 0.0 if i0 == 0 else 1.0  # dk, dv gather over query blocks
        # keys i0..i1-1 are first met by this block: the accumulating products below read
        # them, so clear them (the beta=0 call clears 0..i1-1 on the first block)
        if i0 > 0:
            for i in range(i0, i1):
                for j in range(hd):
                    dk[i, j] = 0.0
                    dv[i, j] = 0.0
        gemm(_F, _T, 1.0, dyh[i0:i1], v[0:i1], 0.0, Gb)
        gemm(_T, _F, 1.0, Pb, dyh[i0:i1], beta, dv[0:i1])
        _softmax_causal_bwd(P, G, i0, i1)
        gemm(_F, _F, scale, Gb, k[0:i1], 0.0, dq[i0:i1])
        gemm(_T, _F, scale, Gb, q[i0:i1], beta, dk[0:i1])


@njit(parallel=True, nogil=True, cache=True, fastmath=FLAGS, error_model="numpy")
def _fwd_heads(qkv, B, T, H, probs, pscratch, y):
    """Every (batch, head): probabilities into probs[b, h] or, when ``probs`` has size 0, into the
    calling chunk's pscratch[blk], then y.

    Keeping or not is read from ``probs``, not passed as a flag: a constant flag makes two compiled
    kernels (Numba specialises on a literal bool), each free to round its reductions its own way.
    The buffer a chunk writes is chosen before the parallel loop, so both ways run one loop body:
    the same bits by construction, whatever CPU the code is compiled for."""
    d = qkv.shape[1] // 3
    hd = d // H
    scale = 1.0 / np.sqrt(hd)
    qb = _qblock(T)
    keep = probs.size != 0
    # keeping, each head is a chunk of its own with its own slot of probs
    bufs = probs.reshape((B * H, T, T)) if keep else pscratch
    nb = B * H if keep else max(1, min(pscratch.shape[0], B * H))
    step = (B * H + nb - 1) // nb
    prev = serial_below(_work(B, T, H, hd))
    for blk in prange(nb):
        P = bufs[blk]
        for bh in range(blk * step, min(B * H, (blk + 1) * step)):
            b = bh // H
            h = bh % H
            q, k, v = _heads(qkv[b * T:(b + 1) * T], H, h)
            yh = y[b * T:(b + 1) * T, h * hd:(h + 1) * hd]
            for i0 in range(0, T, qb):
                i1 = min(T, i0 + qb)
                _scores(q, k, P, i0, i1, scale)
                gemm(_F, _F, 1.0, P[i0:i1, 0:i1], v[0:i1], 0.0, yh[i0:i1])
    restore_threads(prev)


@njit(parallel=True, nogil=True, cache=True, fastmath=FLAGS, error_model="numpy")
def _bwd_heads(dy, qkv, B, T, H, probs, pscratch, scratch, dqkv):
    """Every (batch, head)'s backward on its chunk's score-gradient buffer scratch[blk], with the
    kept probabilities or, when ``probs`` has size 0, recomputing them into pscratch[blk]. One
    compiled kernel for both ways, as :func:`_fwd_heads`: head bh's probabilities are
    bufs[bh // per_buf], both chosen before the parallel loop."""
    d = qkv.shape[1] // 3
    hd = d // H
    scale = 1.0 / np.sqrt(hd)
    qb = _qblock(T)
    keep = probs.size != 0
    nb = max(1, min(scratch.shape[0], B * H))
    if not keep:
        nb = max(1, min(nb, pscratch.shape[0]))
    step = (B * H + nb - 1) // nb
    bufs = probs.reshape((B * H, T, T)) if keep else pscratch
    per_buf = 1 if keep else step  # heads sharing one buffer: a slot each, or a chunk's
    prev = serial_below(2 * _work(B, T, H, hd))
    for blk in prange(nb):
        for bh in range(blk * step, min(B * H, (blk + 1) * step)):
            b = bh // H
            h = bh % H
            q, k, v = _heads(qkv[b * T:(b + 1) * T], H, h)
            dq, dk, dv = _heads(dqkv[b * T:(b + 1) * T], H, h)
            dyh = dy[b * T:(b + 1) * T, h * hd:(h + 1) * hd]
            _head_bwd(q, k, v, dq, dk, dv, dyh, bufs[bh // per_buf], scratch[blk], T, hd, scale, qb,
                      not keep)
    restore_threads(prev)


@njit(nogil=True, cache=True, inline="always", error_model="numpy")
def attention_fwd(qkv, B, T, H, probs, y):
    """qkv (B*T, 3d) -> probs (B, H, T, T) (entries above the diagonal are unspecified), y (B*T, d)."""
    _fwd_heads(qkv, B, T, H, probs, probs[0], y)


@njit(nogil=True, cache=True, inline="always", error_model="numpy")
def attention_bwd(dy, qkv, B, T, H, probs, scratch, dqkv):
    """dy (B*T, d) -> dqkv (B*T, 3d) (overwritten). ``probs`` is only read (a second backward of
    the same forward gives the same result); ``scratch`` (>= 1, T, T) gives each parallel chunk its
    own buffer for the score gradients."""
    _bwd_heads(dy, qkv, B, T, H, probs, scratch, scratch, dqkv)


@njit(nogil=True, cache=True, inline="always", error_model="numpy")
def attention_fwd_lean(qkv, B, T, H, scratch, y):
    """qkv (B*T, 3d) -> y (B*T, d), keeping no probabilities: ``scratch`` (>= 1, T, T) gives each
    parallel chunk a buffer for one head's. Same arithmetic as :func:`attention_fwd`."""
    _fwd_heads(qkv, B, T, H, np.empty((0, 0, 0, 0), y.dtype), scratch, y)


@njit(nogil=True, cache=True, inline="always", error_model="numpy")
def attention_bwd_lean(dy, qkv, B, T, H, pscratch, scratch, dqkv):
    """:func:`attention_bwd` after :func:`attention_fwd_lean`: recomputes the probabilities.
    ``pscratch`` and ``scratch`` (>= 1, T, T): a probabilities and a score-gradient buffer per
    parallel chunk."""
    _bwd_heads(dy, qkv, B, T, H, np.empty((0, 0, 0, 0), dy.dtype), pscratch, scratch, dqkv)
