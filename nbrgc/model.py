"""The byte-level decoder-only Transformer: parameter layout over one flat buffer, workspaces, and
the entry points every training scheme uses (embed, a range of blocks, the shared decoder).

Flat layout, in order: wte, wpe, blocks 0..L-1 (each contiguous, BLOCK_PARAMS order), then the decoder
lnf.w, lnf.b, head.w, head.b (contiguous, so an RGC slot or the decoder's optimizer is one slice).
"""
import numba
import numpy as np

from .config import ModelConfig, check_attention
from .errors import ConfigError
from .kernels.blocks import (BLOCK_PARAMS, blocks_bwd, blocks_fwd, decoder_fwd, decoder_fwd_bwd,
                             decoder_logits)
from .kernels.embedding import embedding_bwd, embedding_fwd

DECODER_PARAMS = ("lnf.w", "lnf.b", "head.w", "head.b")


def param_shapes(cfg):
    d, V = cfg.d_model, cfg.vocab
    shapes = [("wte", (V, d)), ("wpe", (cfg.ctx, d))]
    per_block = {"ln1.w": (d,), "ln1.b": (d,), "attn.wqkv": (d, 3 * d), "attn.bqkv": (3 * d,),
                 "attn.wo": (d, d), "attn.bo": (d,), "ln2.w": (d,), "ln2.b": (d,),
                 "mlp.w1": (d, 4 * d), "mlp.b1": (4 * d,), "mlp.w2": (4 * d, d), "mlp.b2": (d,)}
    for i in range(cfg.n_layer):
        shapes += [(f"h.{i}.{p}", per_block[p]) for p in BLOCK_PARAMS]
    shapes += [("lnf.w", (d,)), ("lnf.b", (d,)), ("head.w", (d, V)), ("head.b", (V,))]
    return shapes


class Layout:
    """Names, shapes and offsets of every tensor in the flat buffer."""

    def __init__(self, cfg):
        self.cfg = cfg
        self.shapes = dict(param_shapes(cfg))
        self.names = list(self.shapes)
        self.offsets, off = {}, 0
        for name in self.names:
            self.offsets[name] = off
            off += int(np.prod(self.shapes[name]))
        self.size = off
        self.block_offs = np.array([[self.offsets[f"h.{i}.{p}"] for p in BLOCK_PARAMS]
                                    for i in range(cfg.n_layer)], dtype=np.int64).reshape(-1, 12)
        self.embed_range = (0, self.offsets["h.0.ln1.w"] if cfg.n_layer else self.offsets["lnf.w"])
        self.decoder_range = (self.offsets["lnf.w"], self.size)

    def block_range(self, lo, hi):
        """Flat slice (start, stop) holding blocks lo..hi-1."""
        start = self.offsets[f"h.{lo}.ln1.w"]
        stop = self.offsets[f"h.{hi}.ln1.w"] if hi < self.cfg.n_layer else self.decoder_range[0]
        return start, stop

    def views(self, flat):
        return {n: flat[self.offsets[n]:self.offsets[n] + int(np.prod(s))].reshape(s)
                for n, s in self.shapes.items()}

    def decay_mask(self):
        """1 on matrices (decayed by AdamW), 0 on biases and LayerNorm parameters."""
        mask = np.zeros(self.size, np.uint8)
        for n, s in self.shapes.items():
            if len(s) == 2:
                mask[self.offsets[n]:self.offsets[n] + int(np.prod(s))] = 1
        return mask


class Workspace:
    """Preallocated activations for blocks lo..hi-1 at batch B, length T (reused every step), plus
    the backward scratch and, optionally, the decoder's buffers. One per concurrent user (a stage
    worker owns its own)."""

    def __init__(self, cfg, B, T, lo, hi, dtype, decoder=True, attention="store"):
        check_attention(attention)
        d, H, V, n = cfg.d_model, cfg.n_head, cfg.vocab, hi - lo
        N = B * T
        self.B, self.T, self.lo, self.hi = B, T, lo, hi
        e = lambda *s: np.zeros(s, dtype)  # noqa: E731
        self.res = e(n + 1, N, d)
        self.m1, self.r1, self.m2, self.r2 = e(n, N), e(n, N), e(n, N), e(n, N)
        self.qkv, self.atty, self.x2, self.pre = e(n, N, 3 * d), e(n, N, d), e(n, N, d), e(n, N, 4 * d)
        k = 1 if n else 0  # scratch is only needed when there are blocks
        nt = max(1, numba.config.NUMBA_NUM_THREADS)
        self.attention = attention
        if attention == "store":
            self.probs, self.pscr = e(n, B, H, T, T), e(0, T, T)
        else:  # recomputed in the backward: a buffer per parallel chunk instead
            self.probs, self.pscr = e(n, 0, 0, 0, 0), e(k * min(nt, B * H), T, T)
        # Scratch is aliased wherever lifetimes do not overlap (one block's backward at a time, and
        # the decoder runs between forward and backward): `ln` also serves as the attention-output
        # gradient and the decoder's LayerNorm output; one flat buffer holds the GELU activations,
        # the qkv gradient and the logits; the decoder writes dL/dh straight into `dcur`. A second
        # wide buffer takes the GELU gradient, then the LN1-output gradient, so that no backward
        # product writes over its own input and the weight and data gradients can run side by side.
        self.ln = e(N, d)
        wide = max(4 * d if n else 0, V if decoder else 0, 3 * d if n else 0)
        self._wide = e(N * wide)
        self.g = self._wide[:N * 4 * d].reshape(N, 4 * d) if n else e(0, 4 * d)
        self.dqkv = self._wide[:N * 3 * d].reshape(N, 3 * d) if n else e(0, 3 * d)
        self.datt = self.ln
        self._wide2 = e(N * 4 * d if n else 0)
        self.dg = self._wide2.reshape(N, 4 * d) if n else e(0, 4 * d)
        self.dln = self._wide2[:N * d].reshape(N, d) if n else e(0, d)  # LN1-output gradient
        self.dln2 = self._wide[:N * d].reshape(N, d) if n else e(0, d)  # LN2's, over dead `g`
        self.dP = e(k * min(nt, B * H), T, T)
        self.dcur = e(N, d)
        self.partial = e(nt, 2, d)
        self.tokens = np.zeros((B, T), np.int32)
        if decoder:
            self.lnf, self.mf, self.rf = self.ln, e(N), e(N)
            self.logits = self._wide[:N * V].reshape(N, V)
            self.losses, self.dh = e(N), self.dcur
            self.targets = np.zeros(N, np.int32)

    def nbytes(self):
        """Bytes owned (aliased views counted once)."""
        owned = {id(v): v for v in vars(self).values() if isinstance(v, np.ndarray) and v.base is None}
        return sum(v.nbytes for v in owned.values())


def _threads():
    return numba.get_num_threads()


def _plan():
    from .gemm_plan import plan_for
    return plan_for()


class Model:
    """``Model(cfg, seed=0, dtype=np.float32)``: parameters, gradients and the compute entry points."""

    def __init__(self, cfg, seed=0, dtype=np.float32, attention="store"):
        if not isinstance(cfg, ModelConfig):
            raise ConfigError(f"Model needs a ModelConfig, got {type(cfg).__name__}")
        if np.dtype(dtype) not in (np.dtype(np.float32), np.dtype(np.float64)):
            raise ConfigError(f"dtype must be float32 or float64, got {np.dtype(dtype)}")
        self.cfg, self.dtype = cfg, np.dtype(dtype)
        self.attention = check_attention(attention)
        self.layout = Layout(cfg)
        self.flat = np.zeros(self.layout.size, self.dtype)
        self.grad_flat = np.zeros(self.layout.size, self.dtype)
        self.params = self.layout.views(self.flat)
        self.grads = self.layout.views(self.grad_flat)
        self.decay_mask = self.layout.decay_mask()
        self._ws = {}
        self.init_weights(seed)

    # ----------------------------------------------------------------- set-up
    def init_weights(self, seed):
        """normal(0, 0.02) matrices, residual projections / sqrt(2 L), LN weights 1, biases 0.
        Drawn in float64 so float32 and float64 models of one seed hold the same values."""
        rng = np.random.default_rng(seed)
        resid = 1.0 / np.sqrt(2.0 * self.cfg.n_layer)
        for name in self.layout.names:
            p = self.params[name]
            if name.endswith((".w", ".b")) and ("ln" in name.split(".")[-2]):
                p[...] = 1.0 if name.endswith(".w") else 0.0
            elif p.ndim == 2:
                std = 0.02 * (resid if name.endswith(("attn.wo", "mlp.w2")) else 1.0)
                p[...] = rng.normal(0.0, std, p.shape)
            else:
                p[...] = 0.0

    @property
    def n_params(self):
        return self.layout.size

    def workspace(self, B, T, lo=0, hi=None, decoder=True):
        """A new Workspace for blocks lo..hi-1 (callers running concurrently need one each)."""
        hi = self.cfg.n_layer if hi is None else hi
        return Workspace(self.cfg, B, T, lo, hi, self.dtype, decoder, self.attention)

    def _cached_ws(self, B, T):
        key = (B, T, self.attention)
        if key not in self._ws:
            self._ws.clear()  # keep one: a different batch shape replaces the old buffers
            self._ws[key] = self.workspace(B, T)
        return self._ws[key]

    def _check_xy(self, x, y=None):
        x = np.asarray(x)
        if x.ndim != 2 or x.shape[0] < 1 or x.shape[1] < 1:
            raise ConfigError(f"x must have shape (B, T) with B, T >= 1, got {x.shape}")
        if x.shape[1] > self.cfg.ctx:
            raise ConfigError(f"sequence length {x.shape[1]} exceeds ctx {self.cfg.ctx}")
        if not np.issubdtype(x.dtype, np.integer):
            raise ConfigError(f"x must hold integer byte ids, got {x.dtype}")
        if y is not None:
            y = np.asarray(y)
            if y.shape != x.shape:
                raise ConfigError(f"y shape {y.shape} differs from x shape {x.shape}")
        return x, y

    # ----------------------------------------------------------------- pieces
    def embed(self, x, ws):
        """Token + position embedding of ``x`` into ``ws.res[0]``."""
        ws.tokens[...] = x
        embedding_fwd(ws.tokens, self.params["wte"], self.params["wpe"], ws.res[0])
        return ws.res[0]

    def embed_backward(self, ws, dh, grad_flat=None):
        g = self.grads if grad_flat is None else self.layout.views(grad_flat)
        embedding_bwd(ws.tokens, dh, g["wte"], g["wpe"], _threads())

    def forward_blocks(self, h_in, lo, hi, ws):
        """Run blocks lo..hi-1 on ``h_in`` (B*T, d), saving activations in ``ws``; returns the output."""
        if h_in is not ws.res[0]:
            ws.res[0][...] = h_in
        blocks_fwd(self.flat, self.layout.block_offs, lo, hi, ws.B, ws.T, self.cfg.n_head, ws.res,
                   ws.m1, ws.r1, ws.qkv, ws.probs, ws.atty, ws.x2, ws.m2, ws.r2, ws.pre, ws.ln, ws.g,
                   _threads(), ws.pscr)
        return ws.res[hi - lo]

    def backward_blocks(self, dh_out, lo, hi, ws, grad_flat=None):
        """Backward through blocks lo..hi-1 (after forward_blocks on ``ws``); accumulates their
        parameter gradients into ``grad_flat`` (default: model.grad_flat) and returns dL/d(input)."""
        G = self.grad_flat if grad_flat is None else grad_flat
        if dh_out is not ws.dcur:
            ws.dcur[...] = dh_out
        blocks_bwd(self.flat, G, self.layout.block_offs, lo, hi, ws.B, ws.T, self.cfg.n_head, ws.res,
                   ws.m1, ws.r1, ws.qkv, ws.probs, ws.atty, ws.x2, ws.m2, ws.r2, ws.pre, ws.ln, ws.g,
                   ws.datt, ws.dqkv, ws.dP, ws.partial, ws.dcur, _threads(),
                   _plan(), ws.dg, ws.dln, ws.dln2, ws.pscr)
        return ws.dcur

    def decoder_loss_and_grad(self, h, y, ws, gdec=None, pdec=None):
        """Mean next-byte loss of the shared decoder on ``h``; accumulates decoder gradients into
        ``gdec`` (flat decoder slice; default the model's) and returns (loss, dL/dh in ws.dh).
        ``pdec`` reads the decoder from another copy (the asynchronous pipeline's versions)."""
        lo, hi = self.layout.decoder_range
        gdec = self.grad_flat[lo:hi] if gdec is None else gdec
        pdec = self.flat[lo:hi] if pdec is None else pdec
        ws.targets[...] = np.asarray(y).reshape(-1)
        n = ws.targets.shape[0]
        tot = decoder_fwd_bwd(pdec, gdec, h, ws.targets, ws.lnf, ws.mf, ws.rf, ws.logits,
                              ws.losses, ws.dh, ws.partial, 1.0 / n, _threads(),
                              _plan())
        return tot / n, ws.dh

    def decoder_loss(self, h, y, ws, pdec=None):
        lo, hi = self.layout.decoder_range
        pdec = self.flat[lo:hi] if pdec is None else pdec
        ws.targets[...] = np.asarray(y).reshape(-1)
        tot = decoder_fwd(pdec, h, ws.targets, ws.lnf, ws.mf, ws.rf, ws.logits, ws.losses,
                          _threads())
        return tot / ws.targets.shape[0]

    # ----------------------------------------------------------------- whole model
    def loss(self, x, y):
        """Mean next-byte cross-entropy in nats."""
        x, y = self._check_xy(x, y)
        ws = self._cached_ws(*x.shape)
        h = self.forward_blocks(self.embed(x, ws), 0, self.cfg.n_layer, ws)
        return float(self.decoder_loss(h, y, ws))

    def loss_and_grad(self, x, y, zero=True):
        """(loss, grads): grads[name] are views of ``model.grad_flat`` (overwritten unless zero=False,
        which accumulates, e.g. over micro-batches)."""
        x, y = self._check_xy(x, y)
        ws = self._cached_ws(*x.shape)
        if zero:
            self.grad_flat[...] = 0.0
        L = self.cfg.n_layer
        h = self.forward_blocks(self.embed(x, ws), 0, L, ws)
        loss, dh = self.decoder_loss_and_grad(h, y, ws)
        dx = self.backward_blocks(dh, 0, L, ws)
        self.embed_backward(ws, dx)
        return float(loss), self.grads

    def logits(self, x):
        """Logits (B, T, vocab) for ``x``."""
        x, _ = self._check_xy(x)
        ws = self._cached_ws(*x.shape)
        h = self.forward_blocks(self.embed(x, ws), 0, self.cfg.n_layer, ws)
        lo, hi = self.layout.decoder_range
        decoder_logits(self.flat[lo:hi], h, ws.lnf, ws.mf, ws.rf, ws.logits, _threads())
        return ws.logits.reshape(x.shape[0], x.shape[1], -1).copy()

