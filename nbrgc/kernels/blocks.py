"""A range of Transformer blocks, forward and backward, as single nogil calls over the flat buffers.

Parameters are addressed through ``offs`` (n_layer, 12) — the flat-buffer offset of each block tensor in
:data:`BLOCK_PARAMS` order — so a whole stage is one Numba call: a stage worker thread never needs the
GIL between kernels.

What is kept per block for the backward: the block input, both LayerNorm statistics, qkv, the attention
probabilities, the attention output, the mid-block residual and the MLP pre-activation. LayerNorm
outputs and the GELU output are recomputed (one cheap elementwise pass each) instead of stored.
With ``attention="recompute"`` (``probs`` of size 0) the probabilities are not kept either: the
backward recomputes them, one head at a time, into ``probs_scratch``. Each way has its own entry
points (:data:`BLOCKS_FWD`, :data:`BLOCKS_BWD`), chosen in Python, so a run compiles only the
attention kernels it uses.

The block bodies call every kernel through a module-level alias (:data:`KERNELS`); compiled, that is
the plain call, and run as Python they are the profile's replay (:func:`replay`,
:mod:`nbrgc.profile`): one sequence of kernels for both.
"""
from collections import namedtuple
from contextlib import contextmanager

from numba import njit

from .attention import attention_bwd, attention_bwd_lean, attention_fwd, attention_fwd_lean
from .gemm import linear_bwd, linear_fwd, matmul
from .layernorm import layernorm_apply, layernorm_bwd, layernorm_fwd
from .loss import xent_fwd, xent_fwd_bwd
from .mlp import bias_gelu_fwd, gelu_bwd, gelu_fwd

BLOCK_PARAMS = ("ln1.w", "ln1.b", "attn.wqkv", "attn.bqkv", "attn.wo", "attn.bo",
                "ln2.w", "ln2.b", "mlp.w1", "mlp.b1", "mlp.w2", "mlp.b2")
# Column of each tensor in a row of ``offs`` (BLOCK_PARAMS order); Numba folds these constants.
(LN1_W, LN1_B, QKV_W, QKV_B, PROJ_W, PROJ_B,
 LN2_W, LN2_B, UP_W, UP_B, DOWN_W, DOWN_B) = range(len(BLOCK_PARAMS))

# What one block range keeps from its forward for its backward, one entry per block
# (``resid`` has one more: the range's output).
BlockActivations = namedtuple("BlockActivations", (
    "resid",                  # (n+1, N, d) the residual stream: block inputs, then the output
    "ln1_mean", "ln1_rstd",   # (n, N) LayerNorm 1 statistics
    "qkv",                    # (n, N, 3d)
    "probs",                  # (n, B, H, T, T), or (n, 0, 0, 0, 0) when recomputed
    "att_out",                # (n, N, d) attention output before its projection
    "mid",                    # (n, N, d) the residual stream between attention and MLP
    "ln2_mean", "ln2_rstd",   # (n, N)
    "mlp_pre",                # (n, N, 4d) MLP pre-activation (GELU input)
))
# Buffers reused by every block, forward and backward (aliasing: see nbrgc.model.Workspace).
BlockScratch = namedtuple("BlockScratch", (
    "ln_out",         # (N, d) LayerNorm output (recomputed in the backward)
    "gelu_out",       # (N, 4d) GELU output (recomputed in the backward)
    "datt",           # (N, d) gradient of the attention output
    "dqkv",           # (N, 3d)
    "dgelu",          # (N, 4d) gradient of the GELU output, then of its input
    "dln1", "dln2",   # (N, d) gradients of the LayerNorm outputs
    "dprobs",         # (chunks, T, T) per-chunk attention-probability gradient
    "probs_scratch",  # (chunks, T, T) recomputed probabilities, or (0, T, T) when stored
    "ln_partials",    # (threads, 2, d) per-thread LayerNorm weight-gradient partial sums
))


# Serial, like the embedding (nbrgc.kernels.embedding): one light pass over N*d elements, serial
# below SERIAL_WORK anyway, and a parallel region would cost a cold start about 2 s of compiling.
@njit(nogil=True, cache=True, error_model="numpy")
def _copy_add_bias(x, b, out):
    for i in range(x.shape[0]):
        for j in range(x.shape[1]):
            out[i, j] = x[i, j] + b[j]


@njit(nogil=True, cache=True, inline="always", error_model="numpy")
def _vec(P, o, n):
    return P[o:o + n]


@njit(nogil=True, cache=True, inline="always", error_model="numpy")
def _mat(P, o, r, c):
    return P[o:o + r * c].reshape((r, c))


# Every kernel a block calls, by the name the profile reports it under (nbrgc.profile), and the
# module-level alias the block bodies call it through. Compiled, an alias is the kernel itself,
# resolved at compile time: no wrapper function of its own to compile (a wrapper per call site
# was 17 more functions for LLVM to optimise and emit, a tenth of the first run's compile). Run as
# Python (the bodies' ``py_func``, see :func:`replay`), the aliases are rebound to wrappers that
# hand each call to the hook, which is how the profile times the production sequence kernel by
# kernel.
ln_fwd = layernorm_fwd
qkv_fwd = linear_fwd
attn_fwd = attention_fwd
attn_fwd_lean = attention_fwd_lean
add_resid_bias = _copy_add_bias
proj_fwd = matmul
up_fwd = matmul
bias_gelu = bias_gelu_fwd
down_fwd = matmul
gelu_again = gelu_fwd
down_bwd = linear_bwd
gelu_back = gelu_bwd
ln_again = layernorm_apply
up_bwd = linear_bwd
ln_bwd = layernorm_bwd
proj_bwd = linear_bwd
attn_bwd = attention_bwd
attn_bwd_lean = attention_bwd_lean
qkv_bwd = linear_bwd
KERNELS = {
    "layernorm fwd": "ln_fwd", "qkv gemm fwd": "qkv_fwd", "attention fwd": "attn_fwd",
    "attention fwd (keeps no probabilities)": "attn_fwd_lean", "residual+bias": "add_resid_bias",
    "attn-out gemm fwd": "proj_fwd", "mlp-up gemm fwd": "up_fwd", "bias+gelu fwd": "bias_gelu",
    "mlp-down gemm fwd": "down_fwd",
    "gelu recompute": "gelu_again", "mlp-down gemm bwd": "down_bwd", "gelu bwd": "gelu_back",
    "layernorm recompute": "ln_again", "mlp-up gemm bwd": "up_bwd", "layernorm bwd": "ln_bwd",
    "attn-out gemm bwd": "proj_bwd", "attention bwd": "attn_bwd",
    "attention bwd (recomputes probabilities)": "attn_bwd_lean", "qkv gemm bwd": "qkv_bwd",
}


def _handing_to(hook, label, kernel):
    return lambda *args: hook(label, kernel, *args)


@contextmanager
def replay(hook):
    """Within this, the Python forms of the block bodies hand every kernel call to ``hook(label,
    kernel, *args)``."""
    here = globals()
    kernels = {alias: here[alias] for alias in KERNELS.values()}
    here.update({alias: _handing_to(hook, label, kernels[alias]) for label, alias in KERNELS.items()})
    try:
        yield
    finally:
        here.update(kernels)


# The attention forward and backward of each ``attention`` handling ("store" keeps ``probs``;
# "recompute" keeps none and uses only the scratch), one signature for both. An entry point passes
# its pair to the inlined block body, so it compiles only the attention kernels its run uses and
# calls them directly. (An ``@overload`` choosing on a string literal did the same, but Numba
# compiles an inlined overload in full before inlining it and throws that away: two such
# functions cost a cold start about 3 s of compiling for nothing.) Run as Python (replay), the
# same functions' ``py_func`` call the rebound aliases.
@njit(nogil=True, cache=True, inline="always", error_model="numpy")
def _fwd_store(qkv, B, T, H, probs, probs_scratch, y):
    attn_fwd(qkv, B, T, H, probs, y)


@njit(nogil=True, cache=True, inline="always", error_model="numpy")
def _fwd_recompute(qkv, B, T, H, probs, probs_scratch, y):
    attn_fwd_lean(qkv, B, T, H, probs_scratch, y)


@njit(nogil=True, cache=True, inline="always", error_model="numpy")
def _bwd_store(dy, qkv, B, T, H, probs, probs_scratch, dprobs, dqkv):
    attn_bwd(dy, qkv, B, T, H, probs, dprobs, dqkv)


@njit(nogil=True, cache=True, inline="always", error_model="numpy")
def _bwd_recompute(dy, qkv, B, T, H, probs, probs_scratch, dprobs, dqkv):
    attn_bwd_lean(dy, qkv, B, T, H, probs_scratch, dprobs, dqkv)


_ATTEND_FWD = {"store": _fwd_store, "recompute": _fwd_recompute}
_ATTEND_BWD = {"store": _bwd_store, "recompute": _bwd_recompute}


@njit(nogil=True, cache=True, inline="always", error_model="numpy")
def _blocks_fwd(P, offs, lo, hi, B, T, H, acts, scr, nt, attend_fwd):
    # ``attend_fwd``: the entry point's attention forward (this body is inlined there), see _fwd_store
    d = acts.resid.shape[2]
    for l in range(lo, hi):
        i = l - lo
        o = offs[l]
        x, mid, out = acts.resid[i], acts.mid[i], acts.resid[i + 1]
        ln_fwd(x, _vec(P, o[LN1_W], d), _vec(P, o[LN1_B], d), scr.ln_out,
            acts.ln1_mean[i], acts.ln1_rstd[i])
        qkv_fwd(scr.ln_out, _mat(P, o[QKV_W], d, 3 * d), _vec(P, o[QKV_B], 3 * d),
            acts.qkv[i], nt)
        attend_fwd(acts.qkv[i], B, T, H, acts.probs[i], scr.probs_scratch,
                   acts.att_out[i])
        add_resid_bias(x, _vec(P, o[PROJ_B], d), mid)
        proj_fwd(acts.att_out[i], _mat(P, o[PROJ_W], d, d), mid, 1.0, nt)
        ln_fwd(mid, _vec(P, o[LN2_W], d), _vec(P, o[LN2_B], d), scr.ln_out,
            acts.ln2_mean[i], acts.ln2_rstd[i])
        up_fwd(scr.ln_out, _mat(P, o[UP_W], d, 4 * d), acts.mlp_pre[i], 0.0, nt)
        bias_gelu(acts.mlp_pre[i], _vec(P, o[UP_B], 4 * d), scr.gelu_out)
        add_resid_bias(mid, _vec(P, o[DOWN_B], d), out)
        down_fwd(scr.gelu_out, _mat(P, o[DOWN_W], 4 * d, d), out, 1.0, nt)


@njit(nogil=True, cache=True, inline="always", error_model="numpy")
def _blocks_bwd(P, G, offs, lo, hi, B, T, H, acts, scr, dresid, nt, plan, attend_bwd):
    # ``attend_bwd``: as in _blocks_fwd
    d = acts.resid.shape[2]
    for l in range(hi - 1, lo - 1, -1):
        i = l - lo
        o = offs[l]
        x, mid = acts.resid[i], acts.mid[i]
        # MLP: out = mid + gelu(ln2(mid) @ w1 + b1) @ w2 + b2
        gelu_again(acts.mlp_pre[i], scr.gelu_out)
        down_bwd(scr.gelu_out, _mat(P, o[DOWN_W], 4 * d, d), dresid, scr.dgelu,
            _mat(G, o[DOWN_W], 4 * d, d), _vec(G, o[DOWN_B], d), nt, 0.0, plan[0], plan[1])
        gelu_back(acts.mlp_pre[i], scr.dgelu)
        ln_again(mid, _vec(P, o[LN2_W], d), _vec(P, o[LN2_B], d),
            acts.ln2_mean[i], acts.ln2_rstd[i], scr.ln_out)
        up_bwd(scr.ln_out, _mat(P, o[UP_W], d, 4 * d), scr.dgelu, scr.dln2,
            _mat(G, o[UP_W], d, 4 * d), _vec(G, o[UP_B], 4 * d), nt, 0.0, plan[2], plan[3])
        ln_bwd(scr.dln2, mid, _vec(P, o[LN2_W], d), acts.ln2_mean[i],
            acts.ln2_rstd[i], dresid, _vec(G, o[LN2_W], d), _vec(G, o[LN2_B], d),
            scr.ln_partials, nt, 1.0)
        # attention: mid = x + attn(ln1(x)) @ wo + bo
        proj_bwd(acts.att_out[i], _mat(P, o[PROJ_W], d, d), dresid, scr.datt,
            _mat(G, o[PROJ_W], d, d), _vec(G, o[PROJ_B], d), nt, 0.0, plan[4], plan[5])
        attend_bwd(scr.datt, acts.qkv[i], B, T, H, acts.probs[i], scr.probs_scratch,
                   scr.dprobs, scr.dqkv)
        ln_again(x, _vec(P, o[LN1_W], d), _vec(P, o[LN1_B], d),
            acts.ln1_mean[i], acts.ln1_rstd[i], scr.ln_out)
        qkv_bwd(scr.ln_out, _mat(P, o[QKV_W], d, 3 * d), scr.dqkv, scr.dln1,
            _mat(G, o[QKV_W], d, 3 * d), _vec(G, o[QKV_B], 3 * d), nt, 0.0, plan[6], plan[7])
        ln_bwd(scr.dln1, x, _vec(P, o[LN1_W], d), acts.ln1_mean[i],
            acts.ln1_rstd[i], dresid, _vec(G, o[LN1_W], d), _vec(G, o[LN1_B], d),
            scr.ln_partials, nt, 1.0)


def replay_fwd(hook, P, offs, lo, hi, B, T, H, acts, scr, nt, attention):
    """The blocks' forward body run as Python, every kernel call handed to ``hook(label, kernel,
    *args)``: the production sequence of calls on the production buffers (the profile times it)."""
    with replay(hook):
        _blocks_fwd.py_func(P, offs, lo, hi, B, T, H, acts, scr, nt, _ATTEND_FWD[attention].py_func)


def replay_bwd(hook, P, G, offs, lo, hi, B, T, H, acts, scr, dresid, nt, plan, attention):
    """The blocks' backward body, as :func:`replay_fwd`."""
    with replay(hook):
        _blocks_bwd.py_func(P, G, offs, lo, hi, B, T, H, acts, scr, dresid, nt, plan,
                            _ATTEND_BWD[attention].py_func)


@njit(nogil=True, cache=True, error_model="numpy")
def blocks_fwd_store(P, offs, lo, hi, B, T, H, acts, scr, nt):
    """``acts.resid[0]`` is the input of block ``lo``; fills ``acts.resid[1..hi-lo]`` and the other
    saved activations (:class:`BlockActivations`), the attention probabilities included, using
    ``scr`` (:class:`BlockScratch`)."""
    _blocks_fwd(P, offs, lo, hi, B, T, H, acts, scr, nt, _fwd_store)


@njit(nogil=True, cache=True, error_model="numpy")
def blocks_fwd_recompute(P, offs, lo, hi, B, T, H, acts, scr, nt):
    """:func:`blocks_fwd_store` keeping no attention probabilities (``acts.probs`` has size 0)."""
    _blocks_fwd(P, offs, lo, hi, B, T, H, acts, scr, nt, _fwd_recompute)


@njit(nogil=True, cache=True, error_model="numpy")
def blocks_bwd_store(P, G, offs, lo, hi, B, T, H, acts, scr, dresid, nt, plan):
    """``dresid`` holds dL/d(output of block hi-1) and is turned, in place, into dL/d(input of lo).

    ``plan`` (nbrgc.kernels.gemm_plan) holds the thread split of each backward GEMM (weight, data) for the
    MLP-down, MLP-up, attention-output and qkv products, then the head's. Parameter gradients are
    accumulated (+=) into ``G`` at the same offsets as in ``P``. Reads the saved activations
    without changing them (a second backward of the same forward gives the same gradients). No
    product writes its data gradient over its own input, so the weight and data gradients may run
    side by side (plan value TASKS); see :class:`nbrgc.model.Workspace` for which scratch buffers
    share memory and why that is safe.
    """
    _blocks_bwd(P, G, offs, lo, hi, B, T, H, acts, scr, dresid, nt, plan, _bwd_store)


@njit(nogil=True, cache=True, error_model="numpy")
def blocks_bwd_recompute(P, G, offs, lo, hi, B, T, H, acts, scr, dresid, nt, plan):
    """:func:`blocks_bwd_store` after :func:`blocks_fwd_recompute`: recomputes each block's
    attention probabilities, one head at a time, into ``scr.probs_scratch``."""
    _blocks_bwd(P, G, offs, lo, hi, B, T, H, acts, scr, dresid, nt, plan, _bwd_recompute)


# The entry points for each way of handling the attention probabilities (ModelConfig's attention).
BLOCKS_FWD = {"store": blocks_fwd_store, "recompute": blocks_fwd_recompute}
BLOCKS_BWD = {"store": blocks_bwd_store, "recompute": blocks_bwd_recompute}


# One entry point for the decoder's loss with and without its backward (``backward`` a runtime
# flag): an entry point links, re-optimises and re-emits every kernel it calls, so a second one for
# the loss alone cost a cold start about 3 s of compiling; the branch costs nothing at run time.
@njit(nogil=True, cache=True, error_model="numpy")
def decoder_fwd_bwd(Pdec, Gdec, h, targets, lnf, mf, rf, logits, losses, dh, partial, scale, nt,
                    plan, backward):
    """Shared decoder (final LN + head) on ``h``: returns the summed loss. With ``backward``, sets
    dh = scale * dL/dh and accumulates decoder gradients into ``Gdec`` (flat: lnf.w, lnf.b, head.w,
    head.b), and ``logits`` end as their gradient; without, it reads neither ``Gdec`` nor ``dh``,
    and ``logits`` keep the raw logits."""
    d = h.shape[1]
    V = logits.shape[1]
    layernorm_fwd(h, Pdec[0:d], Pdec[d:2 * d], lnf, mf, rf)
    hw = Pdec[2 * d:2 * d + d * V].reshape((d, V))
    linear_fwd(lnf, hw, Pdec[2 * d + d * V:2 * d + d * V + V], logits, nt)
    if not backward:
        return xent_fwd(logits, targets, losses)
    tot = xent_fwd_bwd(logits, targets, losses, scale)
    linear_bwd(lnf, hw, logits, lnf, Gdec[2 * d:2 * d + d * V].reshape((d, V)),
               Gdec[2 * d + d * V:2 * d + d * V + V], nt, 0.0, plan[8], plan[9])
    layernorm_bwd(lnf, h, Pdec[0:d], mf, rf, dh, Gdec[0:d], Gdec[d:2 * d], partial, nt, 0.0)
    return tot
