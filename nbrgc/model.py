"""The byte-level decoder-only Transformer: parameter layout over one flat buffer, workspaces, and
the entry points every training scheme uses (embed, a range of blocks, the shared decoder).

Flat layout, in order: wte, wpe, blocks 0..L-1 (each contiguous, BLOCK_PARAMS order), then the decoder
lnf.w, lnf.b, head.w, head.b (contiguous, so an RGC slot or the decoder's optimizer is one slice).
"""
import numba
import numpy as np

from .config import ModelConfig, check_attention
from .errors import ConfigError
from .kernels.blocks import (BLOCK_PARAMS, BLOCKS_BWD, BLOCKS_FWD, BlockActivations, BlockScratch,
                             decoder_fwd_bwd)
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


def workspace_shapes(cfg, B, T, n, decoder=True, attention="store", nt=1):
    """The arrays a :class:`Workspace` for ``n`` blocks owns, by name: ({name: shape} in the model's
    float dtype, {name: shape} in int32). Every other Workspace buffer is a view of these; the
    memory estimate (:mod:`nbrgc.memory`) sums this table, so it cannot drift from the allocation."""
    d, H, V, N = cfg.d_model, cfg.n_head, cfg.vocab, B * T
    k = 1 if n else 0  # scratch is only needed when there are blocks
    chunks = k * min(nt, B * H)  # the attention kernels' parallel chunks, one (T, T) each
    store = attention == "store"
    shapes = {
        "resid": (n + 1, N, d), "ln1_mean": (n, N), "ln1_rstd": (n, N), "qkv": (n, N, 3 * d),
        "probs": (n, B, H, T, T) if store else (n, 0, 0, 0, 0),
        "att_out": (n, N, d), "mid": (n, N, d), "ln2_mean": (n, N), "ln2_rstd": (n, N),
        "mlp_pre": (n, N, 4 * d),
        "ln_out": (N, d),
        "act_scratch": (N * max(4 * d * k, V if decoder else 0),),
        "grad_scratch": (N * 4 * d * k,),
        "dprobs": (chunks, T, T), "probs_scratch": (0, T, T) if store else (chunks, T, T),
        "ln_partials": (nt, 2, d), "dresid": (N, d)}
    ints = {"tokens": (B, T)}
    if decoder:
        shapes.update(lnf_mean=(N,), lnf_rstd=(N,), losses=(N,))
        ints["targets"] = (N,)
    return shapes, ints


class Workspace:
    """Preallocated activations for blocks lo..hi-1 at batch B, length T (reused every step), plus
    the backward scratch and, optionally, the decoder's buffers. One per concurrent user (a stage
    worker owns its own).

    ``acts`` (:class:`~nbrgc.kernels.blocks.BlockActivations`) is what the backward reads; ``scratch``
    (:class:`~nbrgc.kernels.blocks.BlockScratch`) is reused by every block; ``dresid`` carries the
    gradient of the residual stream down the blocks. The decoder's buffers: ``lnf_out``,
    ``lnf_mean``, ``lnf_rstd``, ``logits``, ``losses``, ``targets``, and ``dh`` (dL/dh, written
    straight into ``dresid``).
    """

    def __init__(self, cfg, B, T, lo, hi, dtype, decoder=True, attention="store"):
        n, N, d, V = hi - lo, B * T, cfg.d_model, cfg.vocab
        self.B, self.T, self.lo, self.hi = B, T, lo, hi
        self.attention = check_attention(attention)
        shapes, int_shapes = workspace_shapes(cfg, B, T, n, decoder, attention,
                                              max(1, numba.config.NUMBA_NUM_THREADS))
        buf = {k: np.zeros(s, dtype) for k, s in shapes.items()}
        buf.update({k: np.zeros(s, np.int32) for k, s in int_shapes.items()})
        self.acts = BlockActivations(**{k: buf[k] for k in BlockActivations._fields})
        # Scratch is aliased wherever lifetimes do not overlap (one block's backward at a time, and
        # the decoder runs between forward and backward): `ln_out` also serves as the
        # attention-output gradient and the decoder's LayerNorm output; one flat buffer holds the
        # GELU output, the qkv gradient and the logits; the decoder writes dL/dh straight into
        # `dresid`. A second buffer takes the GELU gradient, then the LN1-output gradient, so that
        # no backward product writes over its own input and the weight and data gradients can run
        # side by side; the LN2-output gradient goes over the GELU output, dead by then.
        wide_a, wide_g, ln_out = buf["act_scratch"], buf["grad_scratch"], buf["ln_out"]
        view = lambda flat, cols: (flat[:N * cols].reshape(N, cols) if n  # noqa: E731
                                   else np.zeros((0, cols), dtype))
        self.scratch = BlockScratch(
            ln_out=ln_out, gelu_out=view(wide_a, 4 * d), datt=ln_out, dqkv=view(wide_a, 3 * d),
            dgelu=view(wide_g, 4 * d), dln1=view(wide_g, d), dln2=view(wide_a, d),
            dprobs=buf["dprobs"], probs_scratch=buf["probs_scratch"], ln_partials=buf["ln_partials"])
        self.dresid = buf["dresid"]
        self.tokens = buf["tokens"]
        if decoder:
            self.lnf_out, self.lnf_mean, self.lnf_rstd = ln_out, buf["lnf_mean"], buf["lnf_rstd"]
            self.logits = wide_a[:N * V].reshape(N, V)
            self.losses, self.dh = buf["losses"], self.dresid
            self.targets = buf["targets"]

    @property
    def resid(self):
        """(n+1, N, d): the input of block lo, then each block's output."""
        return self.acts.resid

    def nbytes(self):
        """Bytes owned: each buffer once, however many views alias it."""
        arrays = [v for v in vars(self).values() if isinstance(v, np.ndarray)]
        arrays += list(self.acts) + list(self.scratch)
        owned = {id(o): o for o in (v if v.base is None else v.base for v in arrays)}
        return sum(v.nbytes for v in owned.values())


def _threads():
    return numba.get_num_threads()


def _plan():
    from .kernels.gemm_plan import plan_for
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

    def cached_workspace(self, B, T):
        """The model's own whole-network Workspace for batch (B, T), kept between calls (one shape
        at a time) for the whole-model entry points, evaluation and sampling."""
        key = (B, T, self.attention)
        if key not in self._ws:
            self._ws.clear()  # keep one: a different batch shape replaces the old buffers
            self._ws[key] = self.workspace(B, T)
        return self._ws[key]

    def check_batch(self, x, y=None):
        """(x, y) as arrays, or a one-line ConfigError naming what is wrong with their shape or type."""
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
    def embed(self, x, ws, flat=None):
        """Token + position embedding of ``x`` into ``ws.resid[0]`` (``flat``: read the parameters
        from another copy of the flat buffer, e.g. a snapshot)."""
        p = self.params if flat is None else self.layout.views(flat)
        ws.tokens[...] = x
        embedding_fwd(ws.tokens, p["wte"], p["wpe"], ws.resid[0])
        return ws.resid[0]

    def embed_backward(self, ws, dh, grad_flat=None):
        g = self.grads if grad_flat is None else self.layout.views(grad_flat)
        embedding_bwd(ws.tokens, dh, g["wte"], g["wpe"])

    def forward_blocks(self, h_in, lo, hi, ws, flat=None):
        """Run blocks lo..hi-1 on ``h_in`` (B*T, d), saving activations in ``ws``; returns the output
        (``flat`` as in :meth:`embed`)."""
        if h_in is not ws.resid[0]:
            ws.resid[0][...] = h_in
        BLOCKS_FWD[ws.attention](self.flat if flat is None else flat, self.layout.block_offs, lo, hi,
                                 ws.B, ws.T, self.cfg.n_head, ws.acts, ws.scratch, _threads())
        return ws.resid[hi - lo]

    def backward_blocks(self, dh_out, lo, hi, ws, grad_flat=None):
        """Backward through blocks lo..hi-1 (after forward_blocks on ``ws``); accumulates their
        parameter gradients into ``grad_flat`` (default: model.grad_flat) and returns dL/d(input)."""
        G = self.grad_flat if grad_flat is None else grad_flat
        if dh_out is not ws.dresid:
            ws.dresid[...] = dh_out
        BLOCKS_BWD[ws.attention](self.flat, G, self.layout.block_offs, lo, hi, ws.B, ws.T,
                                 self.cfg.n_head, ws.acts, ws.scratch, ws.dresid, _threads(), _plan())
        return ws.dresid

    def decoder_loss_and_grad(self, h, y, ws, gdec=None, pdec=None):
        """Mean next-byte loss of the shared decoder on ``h``; accumulates decoder gradients into
        ``gdec`` (flat decoder slice; default the model's) and returns (loss, dL/dh in ws.dh).
        ``pdec`` reads the decoder from another copy (the asynchronous pipeline's versions)."""
        lo, hi = self.layout.decoder_range
        gdec = self.grad_flat[lo:hi] if gdec is None else gdec
        pdec = self.flat[lo:hi] if pdec is None else pdec
        ws.targets[...] = np.asarray(y).reshape(-1)
        n = ws.targets.shape[0]
        tot = self._decoder(pdec, gdec, h, ws, True)
        return tot / n, ws.dh

    def decoder_loss(self, h, y, ws, pdec=None):
        lo, hi = self.layout.decoder_range
        pdec = self.flat[lo:hi] if pdec is None else pdec
        ws.targets[...] = np.asarray(y).reshape(-1)
        tot = self._decoder(pdec, self.grad_flat[lo:hi], h, ws, False)
        return tot / ws.targets.shape[0]

    def _decoder(self, pdec, gdec, h, ws, backward):
        # one kernel for the loss with and without its backward (see decoder_fwd_bwd)
        return decoder_fwd_bwd(pdec, gdec, h, ws.targets, ws.lnf_out, ws.lnf_mean, ws.lnf_rstd,
                               ws.logits, ws.losses, ws.dh, ws.scratch.ln_partials,
                               1.0 / ws.targets.shape[0], _threads(), _plan(), backward)

    # ----------------------------------------------------------------- whole model
    def loss(self, x, y):
        """Mean next-byte cross-entropy in nats."""
        x, y = self.check_batch(x, y)
        ws = self.cached_workspace(*x.shape)
        h = self.forward_blocks(self.embed(x, ws), 0, self.cfg.n_layer, ws)
        return float(self.decoder_loss(h, y, ws))

    def loss_and_grad(self, x, y, zero=True):
        """(loss, grads): grads[name] are views of ``model.grad_flat`` (overwritten unless zero=False,
        which accumulates, e.g. over micro-batches)."""
        x, y = self.check_batch(x, y)
        ws = self.cached_workspace(*x.shape)
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
        x, _ = self.check_batch(x)
        ws = self.cached_workspace(*x.shape)
        h = self.forward_blocks(self.embed(x, ws), 0, self.cfg.n_layer, ws)
        lo, hi = self.layout.decoder_range
        ws.targets[...] = 0  # the loss's kernel, which keeps the raw logits: one kernel less to compile
        self._decoder(self.flat[lo:hi], self.grad_flat[lo:hi], h, ws, False)
        return ws.logits.reshape(x.shape[0], x.shape[1], -1).copy()

