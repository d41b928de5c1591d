"""The pipeline's stage rule: what stage k does at step t under the objective of :mod:`nbrgc.horizon`
with its gradients arriving as late as an asynchronous pipeline delivers them. Two schedules run it:
:class:`~nbrgc.schemes.pipe_sync.PipeSync` (every stage in turn, in the calling thread) and
:class:`~nbrgc.schemes.pipe_async.PipeAsync` (each stage on a worker thread); they compute the same
bits because every value a stage reads is fixed by the rule, never by timing.

Per step t, every stage k (blocks lo..hi-1, its own optimizer and clipping, as in rgc-sync):

1. **forward and own loss** (:meth:`PipeRule._forward_own`). Stage k runs micro-batch t on its input
   (the embeddings for stage 0, the output of stage k-1 otherwise) and reads its loss L_k through the
   decoder version max(0, t - S) (``--max-staleness S``, as rgc-async). The gradient of a_k * L_k
   (a_k = aux_weight, 1 for the last stage) goes through its own blocks at once, and its decoder
   gradient into the consensus slot.
2. **late gradient** (:meth:`PipeRule._late`, horizon > 0). Stage k < K-1 also applies the gradient
   that stage k+1 sent back for the boundary of micro-batch s = t - D_k: it recomputes its forward on
   s from the input it kept (features replay: only the input is stored, B*T*d floats a step in
   flight, and the replay uses the current weights), and backpropagates the message through its
   blocks.
3. **message down.** With ``horizon all`` the message stage k sends down for micro-batch s is the
   gradient at its input of everything above it (its late part plus its own loss's part, which it
   computed at step s and kept); with a horizon of one stage it is its own loss's part alone, sent
   at step s (the loss reaches one stage below its input and no further).
4. **update** (:meth:`PipeRule._stage_update`). Each stage clips its gradient (its parameters and its
   decoder contribution) and steps; the decoder steps on the weighted consensus into version t + 1.

Each hop costs ``--boundary-delay d`` steps (1: a message computed at step t is used at t + 1, as in
an asynchronous pipeline where the stages run side by side; 0: the synchronous reference), so
D_k = d (K - 1 - k) for ``horizon all`` and D_k = d for a horizon of one stage. In the order
"every stage's step 1 in stage order, then every stage's steps 2-4 in reverse stage order", each
value is read after it is written, which is what lets a threaded schedule wait only on earlier work.
The rings of kept inputs, own gradients and messages are written into every checkpoint.

A schedule supplies the hand-offs: ``_hand_on(k, t, out)`` (stage k's output for step t goes to
stage k+1) and the message hooks: ``_message_ready`` (wait before a message is read),
``_message_read`` (after), ``_message_free`` (wait before its ring slot is written again) and
``_message_sent`` (after): no-ops when the stages run in turn; waits between threads; sends and
receives between MPI ranks.
"""
import numpy as np

from ..errors import CheckpointError, ConfigError
from ..horizon import check_aux_weight, check_coverage, decoder_weights, loss_weights, resolve_horizon
from ..local import stage_sumsq
from ..optim import clip_scale


def stage_horizon(horizon, stages):
    """The horizon in stages a scheme supports: 0 (none), 1 (one stage back) or "all"."""
    L = stages[-1][1]
    per = stages[0][1] - stages[0][0]
    H = resolve_horizon(horizon, L, len(stages))
    if H == 0:
        return 0
    if H >= L - per:  # reaches block 0 from the last stage's input
        return "all"
    if H == per:
        return 1
    raise ConfigError(f"horizon {horizon} is not 0, one stage ({per} blocks) or all: the training "
                      "schemes send gradients a whole stage at a time (any horizon: "
                      "nbrgc.local_loss_and_grad)")


def delays(n_stages, hops, d):
    """D_k: how many steps late stage k's gradient from the boundary above arrives."""
    if hops == 0:
        return [0] * n_stages
    if hops == "all":
        return [d * (n_stages - 1 - k) for k in range(n_stages)]
    return [d] * (n_stages - 1) + [0]


def ring_shapes(n_stages, hops, aux_weights, d, B, T, d_model, stash_sizes=None, predict=False):
    """{name: (shape, dtype name)} of the rings a step in flight needs (every one is checkpointed):
    stage 0's kept tokens, the kept inputs of stages 1..K-2, the messages for stages 0..K-2,
    with ``horizon all`` the own-loss input gradients stages 1..K-2 keep until their late part,
    with ``stash_sizes`` (parameters per stage) the stashed weights of stages 0..K-2, and with
    ``predict`` also their weights before their last update."""
    if not hops:
        return {}
    K, N, D = n_stages, B * T, delays(n_stages, hops, d)
    out = {"tokens": ((D[0] + 1, B, T), "int32")}
    out.update({f"input{k}": ((D[k] + 1, N, d_model), None) for k in range(1, K - 1)})
    out.update({f"message{k}": ((d + 1, N, d_model), None) for k in range(K - 1)})
    if hops == "all":
        out.update({f"own{k}": ((D[k] + 1, N, d_model), None) for k in range(1, K - 1)
                    if aux_weights[k]})
    if stash_sizes is not None:
        out.update({f"weights{k}": ((D[k] + 1, stash_sizes[k]), None) for k in range(K - 1)})
        if predict:  # the weights before each stage's last update
            out.update({f"prev{k}": ((stash_sizes[k],), None) for k in range(K - 1)})
    return out


class PipeRule:
    """Mixin of the stage rule (see the module docstring). Needs ``model``, ``tc``, ``stages``, ``K``,
    ``ranges``, ``opts``, ``opt_dec``, ``rgc`` (the consensus slots) and ``check_finite``."""

    def _init_rule(self, staleness=None, delay=None):
        """The rule's settings. ``staleness``, ``delay``: override tc's (rgc-sync runs the rule with 0
        and 0, and then no delay warm-up or delay rescaling either)."""
        tc, model, K = self.tc, self.model, self.K
        self.hops = stage_horizon(tc.horizon, self.stages)
        lam = check_aux_weight(tc.aux_weight)
        check_coverage(model.cfg.n_layer, self.stages,
                       resolve_horizon(tc.horizon, model.cfg.n_layer, K), lam)
        self.a = loss_weights(K, lam)
        self.S = tc.max_staleness if staleness is None else staleness
        self.d = tc.boundary_delay if delay is None else delay
        self.D = delays(K, self.hops, self.d)
        self.warm = tc.delay_warmup if delay is None else 0  # steps run with no delay
        self.stash = tc.replay_weights in ("stashed", "predicted", "momentum") and any(self.D)
        self.predict = tc.replay_weights == "predicted" and any(self.D)
        self.look_ahead = tc.replay_weights == "momentum" and any(self.D)
        if self.look_ahead and tc.optimizer != "adamw":
            raise ConfigError("--replay-weights momentum extrapolates AdamW's steps: use it with "
                              "--optimizer adamw")
        self.lr_power = tc.delay_lr_power if delay is None else 0.0
        self.cw = decoder_weights(tc.consensus, K, lam)
        self._rings = None
        self.readout, self.ro_opts = None, []
        if tc.readout_blocks and K > 1:
            from .readout import Readout
            self.readout = Readout(model, K, tc.readout_blocks, tc.seed)
            self.ro_opts = self.readout.optimizers(tc)

    def optimizers(self):
        return self.opts + [self.opt_dec] + self.ro_opts

    # ------------------------------------------------------------------ rule state
    def _alloc_rings(self, B, T):
        shapes = ring_shapes(self.K, self.hops, self.a, self.d, B, T, self.model.cfg.d_model,
                             [hi - lo for lo, hi in self.ranges] if self.stash else None,
                             self.predict)
        self._rings = {name: np.zeros(shape, dt or self.model.dtype)
                       for name, (shape, dt) in shapes.items()}
        self._shape = (B, T)
        for k in range(self.K - 1):
            if f"prev{k}" in self._rings:  # no update yet: no extrapolation at the first step
                plo, phi = self.ranges[k]
                self._rings[f"prev{k}"][...] = self.model.flat[plo:phi]

    def _settings(self):
        """What fixes the trajectory besides the TrainConfig fields every mode shares: a resume must
        have the same."""
        return {"horizon": self.hops, "aux_weight": self.a[0] if self.K > 1 else 1.0,
                "max_staleness": self.S, "boundary_delay": self.d, "delay_warmup": self.warm,
                "replay_weights": self._replay_name(),
                "readout_blocks": self.readout.N if self.readout else 0,
                "delay_lr_power": self.lr_power}

    def _replay_name(self):
        if self.look_ahead:
            return "momentum"
        return "predicted" if self.predict else "stashed" if self.stash else "current"

    def _rule_state(self, arrays, meta):
        """Add the rule's state at a step boundary (rings, readout blocks, settings) to a checkpoint's
        arrays and meta; pipe-sync and pipe-async write the same, so each resumes the other's."""
        for name, ring in (self._rings or {}).items():
            arrays[f"pipe_{name}"] = ring
        if self.readout is not None:
            arrays.update(self.readout.state())
        meta.update(pipe=dict(self._settings(),
                              shape=list(self._shape) if self._rings else None))

    def _load_rule(self, arrays, meta):
        saved = meta.get("pipe")
        if saved is None:
            raise CheckpointError("checkpoint has no pipeline state (written by another mode)")
        mine = self._settings()
        for key, value in mine.items():
            if saved.get(key) != value:
                raise CheckpointError(f"checkpoint was written with {key} {saved.get(key)}, this run "
                                      f"has {value} (resume with the same settings)")
        if self.readout is not None:
            self.readout.load_state(arrays)
        if saved.get("shape"):
            self._alloc_rings(*saved["shape"])
            for name, ring in self._rings.items():
                ring[...] = arrays[f"pipe_{name}"]

    # ------------------------------------------------------------------ hand-offs (in turn: none)
    def _message_ready(self, k, s):
        """Wait until the message for stage k's boundary of micro-batch s is written."""

    def _message_read(self, k, s):
        """Stage k is done with the message of micro-batch s."""

    def _message_free(self, k, s):
        """Wait until the slot of the message for stage k of micro-batch s may be written."""

    def _message_sent(self, k, s):
        """The message for stage k of micro-batch s is written into its slot."""

    # ------------------------------------------------------------------ 1. forward and own loss
    def _zero_grad(self, k, t):
        """Clear stage k's gradient, its consensus slot of step t and its readout's gradient."""
        plo, phi = self.ranges[k]
        self.model.grad_flat[plo:phi] = 0.0
        self.rgc.slot(t, k)[...] = 0.0
        if self.readout is not None and k < self.K - 1:
            self.readout.zero_grad(k)

    def _forward_own(self, k, t, h, y, ws, pdec, lr):
        """Stage k's forward on micro-batch t and its own loss's backward; returns the loss. ``h``:
        the tokens for stage 0, else the input activations (in ``ws``). The output goes to stage
        k+1 through ``_hand_on`` before this stage's buffers are reused."""
        current = self._predict(k, t, lr)
        try:
            return self._forward_own_body(k, t, h, y, ws, pdec)
        finally:
            if current is not None:
                plo, phi = self.ranges[k]
                self.model.flat[plo:phi] = current

    def _predict(self, k, t, lr):
        """Stash the weights micro-batch t's forward of stage k uses (with ``predicted``: put the
        extrapolated weights in place, returning the current ones to restore afterwards)."""
        m, r = self.model, self._rings
        current = None
        if self.stash and k < self.K - 1:
            plo, phi = self.ranges[k]
            w = r[f"weights{k}"][t % (self.D[k] + 1)]
            if self.predict and self.D[k] and t >= self.warm:
                # linear weight prediction: the weights extrapolated to step t + D_k, where this
                # micro-batch's gradient will be applied, W + D_k (W - W_prev)
                current = m.flat[plo:phi].copy()
                np.subtract(current, r[f"prev{k}"], out=w)
                w *= w.dtype.type(self.D[k])
                w += current
                m.flat[plo:phi] = w
            elif self.look_ahead and self.D[k] and t >= self.warm and self.opts[k].t:
                # momentum look-ahead (SpecTrain; PipeNAG's Nesterov look-ahead for Adam): the
                # weights D_k of Adam's current steps ahead, W - D_k lr m^/(sqrt(v^) + eps), the
                # smoothed direction instead of the last, noisy difference
                opt = self.opts[k]
                current = m.flat[plo:phi].copy()
                mhat = opt.M / (1.0 - opt.beta1 ** opt.t)
                vhat = opt.V / (1.0 - opt.beta2 ** opt.t)
                w[...] = current - (self.D[k] * lr) * mhat / (np.sqrt(vhat) + opt.eps)
                m.flat[plo:phi] = w
            else:
                w[...] = m.flat[plo:phi]
        return current

    def _forward_own_body(self, k, t, h, y, ws, pdec):
        m, r, a = self.model, self._rings, self.a[k]
        lo, hi = self.stages[k]
        if k == 0:
            if self.hops:
                r["tokens"][t % (self.D[0] + 1)] = h
            h = m.embed(h, ws)
        elif self.hops and k < self.K - 1:
            r[f"input{k}"][t % (self.D[k] + 1)] = h
        out = m.forward_blocks(h, lo, hi, ws)
        if k + 1 < self.K:
            self._hand_on(k, t, out)
        ro = self.readout if k < self.K - 1 else None
        read = out if ro is None else ro.forward(k, out, ws.B, ws.T)  # what the decoder reads
        if a == 0.0 and self.cw is not None and self.cw[k] == 0.0:
            return float(m.decoder_loss(read, y, ws, pdec=pdec))  # reported, not trained on
        loss, dh = self.local_loss(k, t, read, y, ws, pdec)
        if a == 0.0:
            return float(loss)
        if a != 1.0:
            dh *= dh.dtype.type(a)
        if ro is not None:
            dh = ro.backward(k, dh)
        dx = m.backward_blocks(dh, lo, hi, ws)
        if k == 0:
            m.embed_backward(ws, dx)
        elif self.hops == 1 or (self.hops == "all" and k == self.K - 1):
            self._message_free(k - 1, t)
            r[f"message{k - 1}"][t % (self.d + 1)] = dx
            self._message_sent(k - 1, t)
        elif self.hops == "all":
            r[f"own{k}"][t % (self.D[k] + 1)] = dx
        return float(loss)

    def local_loss(self, k, t, h, y, ws, pdec):
        """The stage rule's loss: stage k's loss on ``h`` (its output, or its readout blocks') for
        micro-batch t with targets ``y``, read through the decoder parameters ``pdec``. Returns
        (loss, dL/dh), dL/dh in ``ws.dh``, and adds the loss's decoder gradient into the stage's
        consensus slot ``self.rgc.slot(t, k)``. RGC's: next-byte cross-entropy through the shared
        decoder. Override it to try another local objective (docs/schemes.md)."""
        return self.model.decoder_loss_and_grad(h, y, ws, gdec=self.rgc.slot(t, k), pdec=pdec)

    # ------------------------------------------------------------------ 2-3. late gradient, message
    def _late(self, k, t, ws):
        """Stage k's late part: the message for micro-batch t - D_k, through a replay of its forward.
        During the delay warm-up (t < N) every delay is 0; after it, the micro-batches before N
        have had their late part already."""
        if not self.hops or k == self.K - 1:
            return
        s = t if t < self.warm else t - self.D[k]
        if s < 0 or (t >= self.warm and s < self.warm and self.D[k]):
            return  # nothing has come back yet for this stage
        m, r = self.model, self._rings
        lo, hi = self.stages[k]
        if self.stash:  # replay with the weights micro-batch s's forward used
            plo, phi = self.ranges[k]
            current = m.flat[plo:phi].copy()
            m.flat[plo:phi] = r[f"weights{k}"][s % (self.D[k] + 1)]
        if k == 0:
            h = m.embed(r["tokens"][s % (self.D[0] + 1)], ws)
        else:
            h = ws.resid[0]
            h[...] = r[f"input{k}"][s % (self.D[k] + 1)]
        m.forward_blocks(h, lo, hi, ws)
        self._message_ready(k, s)
        dx = m.backward_blocks(r[f"message{k}"][s % (self.d + 1)], lo, hi, ws)
        self._message_read(k, s)
        if k == 0:
            m.embed_backward(ws, dx)
        elif self.hops == "all":
            self._message_free(k - 1, s)
            down = r[f"message{k - 1}"][s % (self.d + 1)]
            if self.a[k]:
                np.add(dx, r[f"own{k}"][s % (self.D[k] + 1)], out=down)
            else:
                down[...] = dx
            self._message_sent(k - 1, s)
        if self.stash:
            m.flat[plo:phi] = current

    # ------------------------------------------------------------------ 4. update
    def _lr_factor(self, k, t):
        """--delay-lr-power p: a delayed stage steps at lr / (1 + D_k)^p (PipeMare's rescaling by
        the delay; 1 before the delay warm-up ends and for the stages with no delay)."""
        if not self.lr_power or t < self.warm or not self.D[k]:
            return 1.0
        return (1.0 + self.D[k]) ** -self.lr_power

    def _stage_update(self, k, t, lr, loss):
        """Clip and step stage k (and its readout blocks); scale its consensus slot by the same clip
        factor, or zero it when the step is skipped. Returns (norm, skipped)."""
        plo, phi = self.ranges[k]
        slot = self.rgc.slot(t, k)
        sq = stage_sumsq(self.model.grad_flat, plo, phi, slot)
        ro = self.readout is not None and k < self.K - 1
        if ro:
            sq += self.readout.sumsq(k)
        if self.predict and k < self.K - 1:
            self._rings[f"prev{k}"][...] = self.model.flat[plo:phi]
        if not self.check_finite(t, sq, loss, f"stage {k}"):
            slot[...] = 0.0
            return float("nan"), True
        scale, norm = clip_scale(sq, self.tc.grad_clip)
        self.opts[k].step(lr * self._lr_factor(k, t), scale)
        if ro:
            self.ro_opts[k].step(lr, scale)
        if scale != 1.0:
            slot *= scale
        return norm, False
