"""AdamW over slices of the flat buffers, gradient-norm clipping and the learning-rate schedule.

The moments live in two flat arrays shaped like the parameters, so the optimizer state of every mode
is the same two arrays in a checkpoint. A :class:`AdamW` updates one contiguous slice [lo, hi): BP
uses one over everything; RGC uses one per stage plus one for the shared decoder, each with its own
step count (asynchronous stages advance independently).
"""
import math

from .kernels.adamw import adamw_update


class AdamW:
    def __init__(self, P, G, M, V, decay_mask, lo, hi, beta1=0.9, beta2=0.95, eps=1e-8,
                 weight_decay=0.1):
        self.P, self.G, self.M, self.V = P[lo:hi], G[lo:hi], M[lo:hi], V[lo:hi]
        self.mask = decay_mask[lo:hi]
        self.lo, self.hi = lo, hi
        self.beta1, self.beta2, self.eps, self.wd = beta1, beta2, eps, weight_decay
        self.t = 0

    def step(self, lr, gscale=1.0, P=None, G=None):
        """One update of P (default: this slice of the model) with gradients G scaled by gscale."""
        self.t += 1
        adamw_update(self.P if P is None else P, self.G if G is None else G, self.M, self.V,
                     self.mask, lr, self.beta1, self.beta2, self.eps, self.wd, self.t, gscale)


MUON_MATRICES = ("attn.wqkv", "attn.wo", "mlp.w1", "mlp.w2")  # the blocks' hidden matrices
MUON_BETA = 0.95  # Muon's usual momentum (TrainConfig.muon_momentum's default)


class Muon(AdamW):
    """Muon on the blocks' hidden matrices inside [lo, hi) (:data:`MUON_MATRICES`), AdamW on the rest
    (embeddings, LayerNorms, biases, the decoder), as Muon is used in practice. The momentum lives
    in M (V stays zero on the matrices), so a checkpoint holds the same two arrays as AdamW's."""

    def __init__(self, P, G, M, V, decay_mask, lo, hi, layout, momentum=MUON_BETA, **kw):
        super().__init__(P, G, M, V, decay_mask, lo, hi, **kw)
        self.momentum = momentum
        mats = []
        for name, shape in layout.shapes.items():
            off = layout.offsets[name]
            if name.split(".", 2)[-1] in MUON_MATRICES and name.startswith("h.") and lo <= off < hi:
                mats.append((off - lo, off - lo + int(shape[0] * shape[1]), shape))
        self.matrices = mats
        self.segments, at = [], 0  # the AdamW parts between the matrices, relative to lo
        for a, b, _ in mats:
            if a > at:
                self.segments.append((at, a))
            at = b
        if hi - lo > at:
            self.segments.append((at, hi - lo))

    def step(self, lr, gscale=1.0, P=None, G=None):
        from .kernels.muon import NS_STEPS, muon_update
        self.t += 1
        P = self.P if P is None else P
        G = self.G if G is None else G
        for a, b in self.segments:
            adamw_update(P[a:b], G[a:b], self.M[a:b], self.V[a:b], self.mask[a:b], lr, self.beta1,
                         self.beta2, self.eps, self.wd, self.t, gscale)
        for a, b, shape in self.matrices:
            muon_update(P[a:b].reshape(shape), G[a:b].reshape(shape), self.M[a:b].reshape(shape),
                        lr, self.momentum, self.wd, gscale, NS_STEPS)


def make_optimizer(kind, P, G, M, V, decay_mask, lo, hi, layout, muon_momentum=MUON_BETA, **kw):
    """``adamw`` or ``muon`` (:class:`Muon`) over the slice [lo, hi) of the flat buffers."""
    if kind == "muon":
        return Muon(P, G, M, V, decay_mask, lo, hi, layout, momentum=muon_momentum, **kw)
    return AdamW(P, G, M, V, decay_mask, lo, hi, **kw)


def clip_scale(sq, max_norm):
    """Scale factor for a gradient with squared norm ``sq`` (1 when clipping is off or not needed)."""
    norm = math.sqrt(sq)
    if max_norm > 0 and norm > max_norm:
        return max_norm / (norm + 1e-6), norm
    return 1.0, norm


def lr_at(step, tc):
    """Linear warm-up over ``tc.warmup`` steps, then cosine decay to ``lr * min_lr_frac`` at
    ``tc.steps`` (0-based step)."""
    if tc.warmup and step < tc.warmup:
        return tc.lr * (step + 1) / tc.warmup
    span = max(1, tc.steps - tc.warmup)
    progress = min(1.0, (step - tc.warmup) / span)
    floor = tc.lr * tc.min_lr_frac
    return floor + 0.5 * (tc.lr - floor) * (1.0 + math.cos(math.pi * progress))

