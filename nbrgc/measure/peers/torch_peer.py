"""The PyTorch peer: nbrgc's architecture and optimizer in eager PyTorch (fp32, CPU).

Byte embedding + learned positions, pre-LN blocks (LayerNorm eps 1e-5, fused QKV with bias,
``F.scaled_dot_product_attention(is_causal=True)``, output projection, GELU-tanh MLP 4d), final
LayerNorm, untied head with bias; AdamW(betas (0.9, 0.95), eps 1e-8, weight decay on matrices only,
i.e. on every 2-D tensor as in nbrgc), global-norm clipping, nbrgc's learning-rate schedule.

PyTorch is imported only inside these functions; nothing else in nbrgc needs it.

    peer = TorchPeer(mcfg, tc, threads=2, seed=0)   # weights copied from nbrgc.Model(mcfg, seed)
    loss = peer.step(x, y, lr)                       # one optimizer step on int32 (B, T) arrays
"""
from ...errors import NbrgcError


def _torch():
    try:
        import torch
    except ImportError:
        raise NbrgcError("PyTorch is not installed (pip install torch): the torch peer cannot run") from None
    return torch


_CLASSES = None


def _classes():
    global _CLASSES
    if _CLASSES is not None:
        return _CLASSES
    torch = _torch()
    nn, F = torch.nn, torch.nn.functional

    class Block(nn.Module):
        def __init__(self, d, n_head):
            super().__init__()
            self.n_head = n_head
            self.ln1 = nn.LayerNorm(d, eps=1e-5)
            self.qkv = nn.Linear(d, 3 * d)
            self.proj = nn.Linear(d, d)
            self.ln2 = nn.LayerNorm(d, eps=1e-5)
            self.fc1 = nn.Linear(d, 4 * d)
            self.fc2 = nn.Linear(4 * d, d)

        def forward(self, x):
            B, T, d = x.shape
            H = self.n_head
            q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
            q = q.view(B, T, H, d // H).transpose(1, 2)
            k = k.view(B, T, H, d // H).transpose(1, 2)
            v = v.view(B, T, H, d // H).transpose(1, 2)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(y.transpose(1, 2).reshape(B, T, d))
            return x + self.fc2(F.gelu(self.fc1(self.ln2(x)), approximate="tanh"))

    class ByteGPT(nn.Module):
        def __init__(self, cfg):
            super().__init__()
            self.wte = nn.Embedding(cfg.vocab, cfg.d_model)
            self.wpe = nn.Embedding(cfg.ctx, cfg.d_model)
            self.blocks = nn.ModuleList(Block(cfg.d_model, cfg.n_head) for _ in range(cfg.n_layer))
            self.lnf = nn.LayerNorm(cfg.d_model, eps=1e-5)
            self.head = nn.Linear(cfg.d_model, cfg.vocab)

        def forward(self, idx):
            T = idx.shape[1]
            pos = torch.arange(T, device=idx.device)
            h = self.wte(idx) + self.wpe(pos)[None]
            for blk in self.blocks:
                h = blk(h)
            return self.head(self.lnf(h))

    _CLASSES = (ByteGPT,)
    return _CLASSES


def build_model(mcfg, seed=0):
    """A ``ByteGPT`` holding exactly the weights of ``nbrgc.Model(mcfg, seed)`` (fp32)."""
    torch = _torch()
    import numpy as np
    from ...model import Model
    (ByteGPT,) = _classes()
    src = Model(mcfg, seed=seed).params  # numpy init only; no kernel runs
    net = ByteGPT(mcfg).float()
    t = lambda a: torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32))  # noqa: E731
    with torch.no_grad():
        net.wte.weight.copy_(t(src["wte"]))
        net.wpe.weight.copy_(t(src["wpe"]))
        for i, blk in enumerate(net.blocks):
            p = lambda n: src[f"h.{i}.{n}"]  # noqa: E731
            blk.ln1.weight.copy_(t(p("ln1.w")))
            blk.ln1.bias.copy_(t(p("ln1.b")))
            blk.qkv.weight.copy_(t(p("attn.wqkv").T))   # nbrgc computes x @ W; torch x @ W^T
            blk.qkv.bias.copy_(t(p("attn.bqkv")))
            blk.proj.weight.copy_(t(p("attn.wo").T))
            blk.proj.bias.copy_(t(p("attn.bo")))
            blk.ln2.weight.copy_(t(p("ln2.w")))
            blk.ln2.bias.copy_(t(p("ln2.b")))
            blk.fc1.weight.copy_(t(p("mlp.w1").T))
            blk.fc1.bias.copy_(t(p("mlp.b1")))
            blk.fc2.weight.copy_(t(p("mlp.w2").T))
            blk.fc2.bias.copy_(t(p("mlp.b2")))
        net.lnf.weight.copy_(t(src["lnf.w"]))
        net.lnf.bias.copy_(t(src["lnf.b"]))
        net.head.weight.copy_(t(src["head.w"].T))
        net.head.bias.copy_(t(src["head.b"]))
    return net


def set_threads(threads):
    """Intra-op threads = the budget; one inter-op thread (eager training has no inter-op work)."""
    torch = _torch()
    torch.set_num_threads(int(threads))
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:  # already set, or parallel work already ran in this process
        pass
    return torch.get_num_threads()


class TorchPeer:
    """One eager PyTorch training step at a time, mirroring nbrgc's BP step."""

    def __init__(self, mcfg, tc, threads=None, seed=0, fused=None):
        torch = self.torch = _torch()
        if threads:
            set_threads(threads)
        self.cfg, self.tc = mcfg, tc
        self.net = build_model(mcfg, seed)
        decay = [p for p in self.net.parameters() if p.dim() == 2]
        no_decay = [p for p in self.net.parameters() if p.dim() != 2]
        groups = [{"params": decay, "weight_decay": tc.weight_decay},
                  {"params": no_decay, "weight_decay": 0.0}]
        kw = dict(lr=tc.lr, betas=(tc.beta1, tc.beta2), eps=tc.eps)
        self.fused = False
        if fused is not False:  # the fused CPU AdamW (torch >= 2.4) is PyTorch's fastest eager path
            try:
                self.opt = torch.optim.AdamW(groups, fused=True, **kw)
                self.fused = True
            except (TypeError, RuntimeError, ValueError):
                if fused:
                    raise
        if not self.fused:
            self.opt = torch.optim.AdamW(groups, **kw)
        self.n_params = sum(p.numel() for p in self.net.parameters())

    def _tensors(self, x, y=None):
        torch = self.torch
        xt = torch.from_numpy(x.astype("int64", copy=False))
        return xt, (None if y is None else torch.from_numpy(y.astype("int64", copy=False)))

    def loss(self, x, y):
        """Mean next-byte cross-entropy (nats) without updating."""
        torch = self.torch
        xt, yt = self._tensors(x, y)
        with torch.no_grad():
            logits = self.net(xt)
            return float(torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                           yt.reshape(-1)))

    def step(self, x, y, lr):
        """Forward, backward, clip, AdamW at ``lr``; returns the loss (nats)."""
        torch = self.torch
        xt, yt = self._tensors(x, y)
        for g in self.opt.param_groups:
            g["lr"] = lr
        logits = self.net(xt)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), yt.reshape(-1))
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        if self.tc.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(self.net.parameters(), self.tc.grad_clip)
        self.opt.step()
        return float(loss.detach())
