"""One objective for every scheme between RGC and backprop, and its reference gradient.

The blocks are cut into K stages; L_k is stage k's next-byte loss read out through the shared decoder
(the last, L_{K-1}, is the full network's). Training minimises

    J = L_{K-1} + aux_weight * sum_{k < K-1} L_k

where the gradient of L_k flows back through stage k's own blocks and through ``horizon`` more blocks
below its input, and no further (a loss whose gradient reaches block 0 also reaches the embeddings).
The shared decoder's gradient is dJ/d(decoder) / (1 + aux_weight * (K - 1)): a weighted average of the
stages' decoder gradients, as RGC's consensus is. Two corners are the schemes nbrgc started from,
exactly: horizon 0 with aux_weight 1 is RGC with its uniform consensus, horizon ``all`` with
aux_weight 0 is backprop.

``--consensus`` combines with the weights as a second factor: the decoder gradient is
sum_k c_k dL_k/d(decoder) with c_k proportional to a_k * w_k, where a_k is L_k's weight in J (1 for
the last stage, aux_weight for the others) and w_k the consensus weight (uniform: 1; depth: k + 1);
``last`` is the last stage's gradient alone whatever the weights. So uniform is the plain weighted
average of J, and depth tilts it further towards the deeper stages.

:func:`objective_loss_and_grad` is the reference: block by block, with every loss's gradient kept as
its own stream until it reaches its horizon, so it holds for any horizon (not only whole stages).
The training schemes compute the same gradients stage by stage (``nbrgc.schemes.pipe_sync``).
"""
import numpy as np

from .errors import ConfigError


def resolve_horizon(horizon, n_layer, n_stages=None):
    """``horizon`` (an int >= 0, a digit string, ``"stage"`` or ``"all"``) -> blocks: ``all`` ->
    n_layer, ``stage`` -> the blocks of one stage (n_layer / n_stages: one stage back)."""
    if isinstance(horizon, str):
        text = horizon.strip().lower()
        if text == "all":
            return n_layer
        if text == "stage":
            if not n_stages:
                raise ConfigError("horizon 'stage' needs the number of stages")
            return n_layer // n_stages
        if not text.isdigit():
            raise ConfigError(f"horizon must be a number of blocks, 'stage' or 'all', got {horizon!r}")
        horizon = int(text)
    if isinstance(horizon, bool) or not isinstance(horizon, (int, np.integer)) or horizon < 0:
        raise ConfigError(f"horizon must be a number of blocks >= 0, 'stage' or 'all', got {horizon!r}")
    return min(int(horizon), n_layer)


def check_aux_weight(aux_weight):
    """``aux_weight`` as a float, or a one-line ConfigError: a finite number >= 0."""
    from .config import _float
    return _float("aux_weight", aux_weight, 0.0)


def loss_weights(n_stages, aux_weight):
    """a_k, the weight of L_k in J: aux_weight for every stage but the last, 1 for the last."""
    return [float(aux_weight)] * (n_stages - 1) + [1.0]


def cutoffs(stages, horizon):
    """The lowest block each stage's loss reaches: max(0, lo_k - horizon)."""
    return [max(0, lo - horizon) for lo, _ in stages]


def decoder_weights(consensus, n_stages, aux_weight):
    """The c_k of the module docstring, or None for the plain mean (uniform consensus, aux_weight 1:
    RGC's own average, kept as a mean so that it is RGC's to the last bit)."""
    from .local import consensus_weights
    a = np.asarray(loss_weights(n_stages, aux_weight), np.float64)
    if consensus == "last" or not a[:-1].any():
        return consensus_weights("last", n_stages)
    if consensus == "uniform" and np.all(a == 1.0):
        return None
    w = consensus_weights(consensus, n_stages)
    w = np.ones(n_stages) if w is None else w
    c = a * w
    return c / c.sum()


def check_coverage(n_layer, stages, horizon, aux_weight):
    """A one-line ConfigError when some block would get no gradient at all: with aux_weight 0 only the
    last stage's loss trains, and it reaches down to its own cutoff only."""
    if aux_weight > 0:
        return
    low = cutoffs(stages, horizon)[-1]
    if low > 0:
        raise ConfigError(
            f"aux_weight 0 with horizon {horizon} trains only blocks {low}..{n_layer - 1}: blocks "
            f"0..{low - 1} and the embeddings would get no gradient (use horizon all or at least "
            f"{stages[-1][0]}, or an aux_weight > 0)")


def objective_loss_and_grad(model, x, y, n_stages, horizon=0, aux_weight=1.0, consensus="uniform"):
    """(losses, grads) of J (module docstring) on one batch: ``losses[k]`` is L_k in nats, ``grads``
    the views of ``model.grad_flat``, overwritten. The reference: slow (a workspace per block) and
    general (any horizon), checked against finite differences in tests/test_horizon.py."""
    from .local import RGCBuffer, split_stages
    x, y = model.check_batch(x, y)
    L = model.cfg.n_layer
    stages = split_stages(L, n_stages)
    K = len(stages)
    H = resolve_horizon(horizon, L, len(stages))
    lam = check_aux_weight(aux_weight)
    check_coverage(L, stages, H, lam)
    a, cut = loss_weights(K, lam), cutoffs(stages, H)
    cw = decoder_weights(consensus, K, lam)
    B, T = x.shape
    lo_d, hi_d = model.layout.decoder_range
    rgc = RGCBuffer(K, hi_d - lo_d, model.dtype, weights=cw)
    G = model.grad_flat
    G[...] = 0.0
    # forward, one workspace per block so that any block's backward can run from any stream
    ws = [model.workspace(B, T, i, i + 1, decoder=False) for i in range(L)]
    wdec = model.workspace(B, T, 0, 0)
    h = model.embed(x, ws[0])
    losses, entering = [], {}
    for k, (lo, hi) in enumerate(stages):
        for i in range(lo, hi):
            h = model.forward_blocks(h, i, i + 1, ws[i])
        gets_grad = a[k] != 0.0 or (cw is None or cw[k] != 0.0)
        if gets_grad:
            loss, dh = model.decoder_loss_and_grad(h, y, wdec, gdec=rgc.slot(0, k))
            if a[k] != 0.0:
                entering[hi - 1] = (cut[k], dh.copy() if a[k] == 1.0 else dh * dh.dtype.type(a[k]))
        else:
            loss = model.decoder_loss(h, y, wdec)
        losses.append(float(loss))
    # backward: streams keyed by cutoff; a loss joins the stream that stops where it stops
    streams = {}
    for i in range(L - 1, -1, -1):
        if i in entering:
            c, dh = entering[i]
            if c in streams:
                streams[c] += dh
            else:
                streams[c] = dh
        for c in sorted(streams):
            streams[c][...] = model.backward_blocks(streams[c], i, i + 1, ws[i])
        if i in streams:  # these streams have reached their horizon
            dx = streams.pop(i)
            if i == 0:
                model.embed_backward(ws[0], dx)
    G[lo_d:hi_d] = rgc.close(0)
    return losses, model.grads
