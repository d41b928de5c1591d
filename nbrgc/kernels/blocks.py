"""A range of Transformer blocks, forward and backward, as single nogil calls over the flat buffers.

Parameters are addressed through ``offs`` (n_layer, 12) — the flat-buffer offset of each block tensor in
:data:`BLOCK_PARAMS` order — so a whole stage is one Numba call: a stage worker thread never needs the
GIL between kernels.

What is kept per block for the backward: the block input, both LayerNorm statistics, qkv, the attention
probabilities, the attention output, the mid-block residual and the MLP pre-activation. LayerNorm
outputs and the GELU output are recomputed (one cheap elementwise pass each) instead of stored.
With ``probs`` of size 0 (``attention="recompute"``) the probabilities are not kept either: the
backward recomputes them, one head at a time, into ``pscr``.
"""
from numba import njit, prange

from .attention import attention_bwd, attention_bwd_lean, attention_fwd, attention_fwd_lean
from .gemm import linear_bwd, linear_fwd, matmul
from .layernorm import layernorm_apply, layernorm_bwd, layernorm_fwd
from .loss import xent_fwd, xent_fwd_bwd
from .mlp import bias_gelu_fwd, gelu_bwd, gelu_fwd

BLOCK_PARAMS = ("ln1.w", "ln1.b", "attn.wqkv", "attn.bqkv", "attn.wo", "attn.bo",
                "ln2.w", "ln2.b", "mlp.w1", "mlp.b1", "mlp.w2", "mlp.b2")


@njit(parallel=True, nogil=True, cache=True, error_model="numpy")
def _copy_add_bias(x, b, out):
    for i in prange(x.shape[0]):
        for j in range(x.shape[1]):
            out[i, j] = x[i, j] + b[j]


@njit(nogil=True, cache=True, error_model="numpy")
def _vec(P, o, n):
    return P[o:o + n]


@njit(nogil=True, cache=True, error_model="numpy")
def _mat(P, o, r, c):
    return P[o:o + r * c].reshape((r, c))


@njit(nogil=True, cache=True, error_model="numpy")
def blocks_fwd(P, offs, lo, hi, B, T, H, res, m1, r1, qkv, probs, atty, x2, m2, r2, pre, ln, g, nt,
               pscr):
    """res[0] is the input of block ``lo``; fills res[1..hi-lo] and the saved activations."""
    d = res.shape[2]
    keep = probs.shape[1] > 0
    for l in range(lo, hi):
        i = l - lo
        o = offs[l]
        layernorm_fwd(res[i], _vec(P, o[0], d), _vec(P, o[1], d), ln, m1[i], r1[i])
        linear_fwd(ln, _mat(P, o[2], d, 3 * d), _vec(P, o[3], 3 * d), qkv[i], nt)
        if keep:
            attention_fwd(qkv[i], B, T, H, probs[i], atty[i])
        else:
            attention_fwd_lean(qkv[i], B, T, H, pscr, atty[i])
        _copy_add_bias(res[i], _vec(P, o[5], d), x2[i])
        matmul(atty[i], _mat(P, o[4], d, d), x2[i], 1.0, nt)
        layernorm_fwd(x2[i], _vec(P, o[6], d), _vec(P, o[7], d), ln, m2[i], r2[i])
        matmul(ln, _mat(P, o[8], d, 4 * d), pre[i], 0.0, nt)
        bias_gelu_fwd(pre[i], _vec(P, o[9], 4 * d), g)
        _copy_add_bias(x2[i], _vec(P, o[11], d), res[i + 1])
        matmul(g, _mat(P, o[10], 4 * d, d), res[i + 1], 1.0, nt)


@njit(nogil=True, cache=True, error_model="numpy")
def blocks_bwd(P, G, offs, lo, hi, B, T, H, res, m1, r1, qkv, probs, atty, x2, m2, r2, pre,
               ln, g, datt, dqkv, dP, partial, dcur, nt, plan, dg, dln, dln2, pscr):
    """``dcur`` holds dL/d(output of block hi-1) and is turned, in place, into dL/d(input of block lo).

    ``plan`` (nbrgc.gemm_plan) holds the thread split of each backward GEMM (weight, data) for the
    MLP-down, MLP-up, attention-output and qkv products, then the head's. Parameter gradients are
    accumulated (+=) into ``G`` at the same offsets as in ``P``. Reads the saved activations
    without changing them (a second backward of the same forward gives the same gradients). No
    product writes its data gradient over its own input, so the weight and data gradients may run
    side by side (plan value TASKS): the GELU gradient goes to ``dg`` (N, 4d), the LN2-output
    gradient to ``dln2`` (N, d; a view of the GELU buffer ``g``, dead by then) and the LN1-output
    gradient to ``dln`` (a view of ``dg``, dead by then).
    """
    d = res.shape[2]
    keep = probs.shape[1] > 0
    for l in range(hi - 1, lo - 1, -1):
        i = l - lo
        o = offs[l]
        # MLP: out = x2 + gelu(ln2(x2) @ w1 + b1) @ w2 + b2
        gelu_fwd(pre[i], g)
        linear_bwd(g, _mat(P, o[10], 4 * d, d), dcur, dg, _mat(G, o[10], 4 * d, d),
                   _vec(G, o[11], d), nt, 0.0, plan[0], plan[1])
        gelu_bwd(pre[i], dg)
        layernorm_apply(x2[i], _vec(P, o[6], d), _vec(P, o[7], d), m2[i], r2[i], ln)
        linear_bwd(ln, _mat(P, o[8], d, 4 * d), dg, dln2, _mat(G, o[8], d, 4 * d),
                   _vec(G, o[9], 4 * d), nt, 0.0, plan[2], plan[3])
        layernorm_bwd(dln2, x2[i], _vec(P, o[6], d), m2[i], r2[i], dcur, _vec(G, o[6], d),
                      _vec(G, o[7], d), partial, nt, 1.0)
        # attention: x2 = x + attn(ln1(x)) @ wo + bo
        linear_bwd(atty[i], _mat(P, o[4], d, d), dcur, datt, _mat(G, o[4], d, d),
                   _vec(G, o[5], d), nt, 0.0, plan[4], plan[5])
        if keep:
            attention_bwd(datt, qkv[i], B, T, H, probs[i], dP, dqkv)
        else:
            attention_bwd_lean(datt, qkv[i], B, T, H, pscr, dP, dqkv)
        layernorm_apply(res[i], _vec(P, o[0], d), _vec(P, o[1], d), m1[i], r1[i], ln)
        linear_bwd(ln, _mat(P, o[2], d, 3 * d), dqkv, dln, _mat(G, o[2], d, 3 * d),
                   _vec(G, o[3], 3 * d), nt, 0.0, plan[6], plan[7])
        layernorm_bwd(dln, res[i], _vec(P, o[0], d), m1[i], r1[i], dcur, _vec(G, o[0], d),
                      _vec(G, o[1], d), partial, nt, 1.0)


@njit(nogil=True, cache=True, error_model="numpy")
def decoder_fwd_bwd(Pdec, Gdec, h, targets, lnf, mf, rf, logits, losses, dh, partial, scale, nt,
                    plan):
    """Shared decoder (final LN + head) on ``h``: returns the summed loss, sets dh = scale * dL/dh,
    accumulates decoder gradients into ``Gdec`` (flat: lnf.w, lnf.b, head.w, head.b)."""
    d = h.shape[1]
    V = logits.shape[1]
    layernorm_fwd(h, Pdec[0:d], Pdec[d:2 * d], lnf, mf, rf)
    hw = Pdec[2 * d:2 * d + d * V].reshape((d, V))
    linear_fwd(lnf, hw, Pdec[2 * d + d * V:2 * d + d * V + V], logits, nt)
    tot = xent_fwd_bwd(logits, targets, losses, scale)
    linear_bwd(lnf, hw, logits, lnf, Gdec[2 * d:2 * d + d * V].reshape((d, V)),
               Gdec[2 * d + d * V:2 * d + d * V + V], nt, 0.0, plan[8], plan[9])
    layernorm_bwd(lnf, h, Pdec[0:d], mf, rf, dh, Gdec[0:d], Gdec[d:2 * d], partial, nt, 0.0)
    return tot


@njit(nogil=True, cache=True, error_model="numpy")
def decoder_fwd(Pdec, h, targets, lnf, mf, rf, logits, losses, nt):
    """Summed loss only; ``logits`` keep the raw logits."""
    d = h.shape[1]
    V = logits.shape[1]
    layernorm_fwd(h, Pdec[0:d], Pdec[d:2 * d], lnf, mf, rf)
    linear_fwd(lnf, Pdec[2 * d:2 * d + d * V].reshape((d, V)),
               Pdec[2 * d + d * V:2 * d + d * V + V], logits, nt)
    return xent_fwd(logits, targets, losses)


@njit(nogil=True, cache=True, error_model="numpy")
def decoder_logits(Pdec, h, lnf, mf, rf, logits, nt):
    d = h.shape[1]
    V = logits.shape[1]
    layernorm_fwd(h, Pdec[0:d], Pdec[d:2 * d], lnf, mf, rf)
    linear_fwd(lnf, Pdec[2 * d:2 * d + d * V].reshape((d, V)),
               Pdec[2 * d + d * V:2 * d + d * V + V], logits, nt)


