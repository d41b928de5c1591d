"""Readout blocks (``--readout-blocks N``): N private pre-LN Transformer blocks for each stage k < K-1,
between its output and the shared decoder.

A stage whose loss is read through LayerNorm and one matrix is pushed to make its output linearly
decodable now; a few blocks of its own in front of the decoder let its output stay unfinished for the
stages above it (AugLocal, MAN). The blocks are trained by L_k alone, clipped and stepped with their
stage, saved in checkpoints, and never used by evaluation or sampling: the full network is the last
stage, which has none. Stage k's reported training loss is the loss through its readout blocks;
evaluation's per-stage bpb reads every stage's output through the decoder directly, as for RGC.

The blocks live in a second :class:`~nbrgc.model.Model` of N * (K-1) layers and the same width (its
embeddings and decoder are unused), so the same kernels, gradient tests and AdamW apply to them.
"""
from dataclasses import replace

import numpy as np

from ..kernels.adamw import sumsq
from ..optim import AdamW


class Readout:
    def __init__(self, model, n_stages, n_blocks, seed):
        self.N, self.K = n_blocks, n_stages
        cfg = replace(model.cfg, n_layer=n_blocks * (n_stages - 1))
        # a seed apart from the model's, so that the trunk's initial weights do not change
        self.model = type(model)(cfg, seed=seed + 7919, dtype=model.dtype, attention=model.attention)
        lay = self.model.layout
        self.ranges = [lay.block_range(k * n_blocks, (k + 1) * n_blocks) for k in range(n_stages - 1)]
        self.M = np.zeros(lay.size, model.dtype)
        self.V = np.zeros(lay.size, model.dtype)
        self._ws = {}
        # which workspace stage k uses: one serves stages that run in turn; a threaded scheme
        # sets this to its stage -> worker map, so stages on different workers never share one
        self.ws_key = lambda k: 0

    def optimizers(self, tc):
        m = self.model
        return [AdamW(m.flat, m.grad_flat, self.M, self.V, m.decay_mask, lo, hi, tc.beta1, tc.beta2,
                      tc.eps, tc.weight_decay) for lo, hi in self.ranges]

    def workspace(self, k, B, T):
        key = self.ws_key(k)
        ws = self._ws.get(key)
        if ws is None or (ws.B, ws.T) != (B, T):
            ws = self._ws[key] = self.model.workspace(B, T, 0, self.N, decoder=False)
        return ws

    def zero_grad(self, k):
        lo, hi = self.ranges[k]
        self.model.grad_flat[lo:hi] = 0.0

    def forward(self, k, h, B, T):
        """Stage k's readout blocks on its output ``h`` (micro-batch B x T); returns what the
        decoder reads."""
        return self.model.forward_blocks(h, k * self.N, (k + 1) * self.N, self.workspace(k, B, T))

    def backward(self, k, dh):
        """dL/d(stage output) from dL/d(readout output); the blocks' gradients accumulate."""
        return self.model.backward_blocks(dh, k * self.N, (k + 1) * self.N,
                                          self._ws[self.ws_key(k)])

    def sumsq(self, k):
        lo, hi = self.ranges[k]
        return float(sumsq(self.model.grad_flat[lo:hi]))

    def state(self):
        return {"readout_params": self.model.flat, "readout_adam_m": self.M,
                "readout_adam_v": self.V}

    def load_state(self, arrays):
        from ..errors import CheckpointError
        if "readout_params" not in arrays or arrays["readout_params"].shape != self.model.flat.shape:
            raise CheckpointError(f"checkpoint has no readout blocks of this shape (resume with the "
                                  f"same --readout-blocks {self.N} and --n-stages {self.K})")
        self.model.flat[...] = arrays["readout_params"]
        self.M[...] = arrays["readout_adam_m"]
        self.V[...] = arrays["readout_adam_v"]
