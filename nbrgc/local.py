"""Bounded-horizon local training: the stage split, the Readout-Gradient-Consensus (RGC) buffer and the
reference ``local_loss_and_grad``.

Stage k owns a contiguous run of blocks (stage 0 also the embeddings). Its input is a constant (no
gradient crosses a stage boundary); it learns only from its own loss L_k = CE(head(lnf(h_k)), y)
read out through the ONE decoder all stages share. Each stage's gradient of that decoder is posted
into the RGC buffer; the decoder is updated with their average once all K have posted.

Three variants aim at what locality costs, and keep what RGC is for (no gradient across a boundary,
stages asynchronous, no extra memory):

* ``consensus="depth"``: the average weighs stage k by k + 1. What is evaluated is the last stage's
  readout, so the decoder leans towards the deeper stages' features instead of serving the
  shallowest as much as the deepest.
* ``consensus="last"``: the decoder learns from the last stage alone, as BP's does; the earlier
  stages still read out through it and learn from their own loss, but no longer pull the one
  readout towards the features of a shallower network.
* ``stage_init="identity"``: every block of stages 1..K-1 starts with zero residual output
  projections (attention output and MLP down, weights and biases), so a later stage starts as the
  identity of its input: its loss starts at the previous stage's and it can only add to it, instead
  of first spending its updates undoing random residual branches on an input that is itself moving.
"""
import numpy as np

from .errors import ConfigError
from .kernels.adamw import sumsq


def split_stages(n_layer, n_stages):
    """[(lo, hi), ...] block ranges of K equal contiguous stages."""
    if isinstance(n_stages, bool) or not isinstance(n_stages, (int, np.integer)) or n_stages < 1:
        raise ConfigError(f"n_stages must be a positive integer, got {n_stages!r}")
    if n_layer % n_stages:
        raise ConfigError(f"n_stages ({n_stages}) must divide n_layer ({n_layer})")
    per = n_layer // n_stages
    return [(k * per, (k + 1) * per) for k in range(n_stages)]


def stage_param_ranges(layout, stages):
    """Flat (start, stop) of each stage's parameters: its blocks, and for stage 0 the embeddings."""
    ranges = []
    for k, (lo, hi) in enumerate(stages):
        start, stop = layout.block_range(lo, hi)
        ranges.append((0 if k == 0 else start, stop))
    return ranges


def consensus_weights(tc_or_name, n_stages=None):
    """The RGC average's weight of each stage: ``uniform`` (None: a plain mean), ``depth`` (stage k
    weighs k + 1, normalised to sum to 1) or ``last`` (1 for the last stage, 0 for the others: the
    weighted sum is then the last stage's gradient, bit for bit). Takes a TrainConfig or a consensus
    name and a stage count."""
    name = getattr(tc_or_name, "consensus", tc_or_name)
    K = getattr(tc_or_name, "n_stages", n_stages) if n_stages is None else n_stages
    if name == "uniform":
        return None
    if name == "depth":
        w = np.arange(1, K + 1, dtype=np.float64)
        return w / w.sum()
    if name == "last":
        w = np.zeros(K, np.float64)
        w[-1] = 1.0
        return w
    raise ConfigError(f"consensus must be uniform, depth or last, got {name!r}")


def identity_init(model, stages):
    """Zero the residual output projections of every block of stages 1..K-1 (see the module
    docstring). Stage 0 keeps its initialisation: it is the one stage whose input is not a
    representation already read out by the decoder."""
    p = model.params
    for lo, hi in stages[1:]:
        for i in range(lo, hi):
            for name in ("attn.wo", "attn.bo", "mlp.w2", "mlp.b2"):
                p[f"h.{i}.{name}"][...] = 0.0


class RGCBuffer:
    """K decoder-gradient slots per round for ``n_rounds`` rounds in flight, and one int64 counter per
    round, incremented with a hardware fetch-and-add; the poster that brings it to K closes the round.
    Slots (not a running sum) keep the average bitwise independent of the order of arrival.
    ``weights`` (K floats summing to 1; None: the plain mean) weigh the stages in the average."""

    def __init__(self, n_stages, dec_size, dtype, n_rounds=1, weights=None):
        self.K = n_stages
        self.slots = np.zeros((n_rounds, n_stages, dec_size), dtype)
        self.counters = np.zeros(n_rounds, np.int64)
        self.mean = np.zeros(dec_size, dtype)
        if weights is not None:
            weights = np.asarray(weights, np.float64)
            if weights.shape != (n_stages,) or not np.all(weights >= 0) or abs(weights.sum() - 1) > 1e-12:
                raise ConfigError(f"RGC weights must be {n_stages} non-negative numbers summing to 1")
        self.weights = weights

    def slot(self, t, k):
        return self.slots[t % self.slots.shape[0], k]

    def post(self, t, k):
        """Count stage k's post for round t; True for the poster that completes the round."""
        from .kernels.atomics import fetch_add
        return fetch_add(self.counters, t % self.counters.shape[0], 1) == self.K - 1

    def close(self, t):
        """Average the round's slots (in stage order) into ``self.mean`` and reset its counter."""
        from .kernels.atomics import store
        r = t % self.counters.shape[0]
        if self.weights is None:
            _mean_rows(self.slots[r], self.mean)
        else:
            _weighted_rows(self.slots[r], self.weights, self.mean)
        store(self.counters, r, 0)
        return self.mean

    def nbytes(self):
        return self.slots.nbytes + self.counters.nbytes + self.mean.nbytes


def _mean_rows(rows, out):
    K = rows.shape[0]
    out[...] = rows[0]
    for k in range(1, K):
        out += rows[k]
    if K > 1:
        out *= 1.0 / K


def _weighted_rows(rows, weights, out):
    out[...] = rows[0] * rows.dtype.type(weights[0])
    for k in range(1, rows.shape[0]):
        out += rows[k] * rows.dtype.type(weights[k])


def stage_backward(model, ws, k, lo, hi, out, y, gdec, pdec=None):
    """Stage k's own loss on its output ``out`` (blocks lo..hi-1, forward already run on ``ws``)
    through the shared decoder, its decoder gradient into ``gdec`` (the stage's RGC slot), then the
    backward through its own blocks (and the embeddings, for stage 0) and nowhere else: this is the
    bounded horizon. ``pdec`` reads another decoder version (rgc-async). Returns the loss (nats)."""
    loss, dh = model.decoder_loss_and_grad(out, y, ws, gdec=gdec, pdec=pdec)
    dx = model.backward_blocks(dh, lo, hi, ws)
    if k == 0:
        model.embed_backward(ws, dx)
    return float(loss)


def local_loss_and_grad(model, x, y, n_stages=4, consensus="uniform", horizon=0, aux_weight=1.0):
    """Losses of every stage and the bounded-horizon gradients.

    Returns (losses, grads): ``losses[k]`` is stage k's local loss (the last one is the full network's),
    ``grads[name]`` views of ``model.grad_flat``. By default (``horizon=0, aux_weight=1``) this is RGC:
    block and embedding gradients from their own stage's loss only, decoder gradients the RGC average
    over stages (weighted by ``consensus``, see :func:`consensus_weights`); with n_stages=1 it is
    exactly ``model.loss_and_grad``. Otherwise it is the gradient of J = L_{K-1} + aux_weight * sum of
    the other stages' losses, each loss reaching ``horizon`` blocks (an int, or "all") below its
    stage's input: :mod:`nbrgc.horizon`, where ``horizon="all", aux_weight=0`` is backprop.
    """
    if not (isinstance(horizon, (int, np.integer)) and not isinstance(horizon, bool) and horizon == 0
            and aux_weight == 1.0):
        from .horizon import objective_loss_and_grad
        return objective_loss_and_grad(model, x, y, n_stages, horizon, aux_weight, consensus)
    x, y = model.check_batch(x, y)
    stages = split_stages(model.cfg.n_layer, n_stages)
    B, T = x.shape
    per = stages[0][1] - stages[0][0]
    ws = model.workspace(B, T, 0, per)
    lo_d, hi_d = model.layout.decoder_range
    rgc = RGCBuffer(len(stages), hi_d - lo_d, model.dtype,
                    weights=consensus_weights(consensus, len(stages)))
    model.grad_flat[...] = 0.0
    losses = []
    h = model.embed(x, ws)
    for k, (lo, hi) in enumerate(stages):
        out = model.forward_blocks(h, lo, hi, ws)
        # the next stage's input, taken before this stage's buffers are reused
        h = out.copy() if k + 1 < len(stages) else None
        losses.append(stage_backward(model, ws, k, lo, hi, out, y, rgc.slot(0, k)))
    model.grad_flat[lo_d:hi_d] = rgc.close(0)
    return losses, model.grads


def stage_sumsq(G, lo, hi, gdec):
    """Squared norm of one stage's gradient: its parameters plus its own decoder contribution."""
    return float(sumsq(G[lo:hi])) + float(sumsq(gdec))
