"""Held-out bits per byte, stage by stage (each stage boundary read out through the shared decoder).

Runs on a workspace sized for one stage, reused stage after stage, so evaluation adds no memory to an
RGC run; for BP (one stage) it reuses the training workspace.

:func:`sliding_bpb` is the final, full-split measure (``nbrgc-eval``): a full-context sliding window
that predicts every byte once with as much context as the model's window allows.
"""
import math

import numpy as np

LN2 = math.log(2.0)


def stage_losses(model, x, y, stages, ws, params=None):
    """Mean loss (nats) at the output of every stage for one batch; ``params``: a flat parameter
    buffer to read instead of the model's (a snapshot of a running pipeline)."""
    x, y = model.check_batch(x, y)
    h = model.embed(x, ws, params)
    pdec = None
    if params is not None:
        lo, hi = model.layout.decoder_range
        pdec = params[lo:hi]
    out = []
    for lo, hi in stages:
        h = model.forward_blocks(h, lo, hi, ws, params)  # copies h into the reused workspace's input
        out.append(float(model.decoder_loss(h, y, ws, pdec)))
    return out


def evaluate(model, batches, stages, ws, params=None):
    """{'val_loss', 'val_bpb', 'val_stage_bpb'} averaged over ``batches`` (a list of (x, y)),
    of the model's parameters or of the flat buffer ``params``."""
    if not batches:
        return {}
    tot = np.zeros(len(stages))
    for x, y in batches:
        tot += stage_losses(model, x, y, stages, ws, params)
    tot /= len(batches)
    return {"val_loss": float(tot[-1]), "val_bpb": float(tot[-1] / LN2),
            "val_stage_bpb": [float(v / LN2) for v in tot]}


# ---------------------------------------------------------------------- full-context sliding window
def sliding_windows(n, ctx, stride=None):
    """The windows that score every byte of an ``n``-byte sequence after the first exactly once.

    Returns ``(L, [(start, first), ...])``: each window reads inputs ``data[start:start + L]`` and
    targets ``data[start + 1:start + L + 1]`` (``L = min(ctx, n - 1)``) and scores its targets from
    position ``first`` of the window on (0 for the first window, which scores all of them). Windows
    advance by ``stride`` (default ``ctx // 2``); the last one is moved to end exactly at byte ``n - 1``.
    So the first ``L`` bytes are predicted from all the bytes before them, and every later byte from
    at least ``L - stride`` bytes of context (``stride=1``: always the full ``ctx``).
    """
    n, ctx = int(n), int(ctx)
    if ctx < 1:
        raise ValueError(f"ctx must be >= 1, got {ctx}")
    if n < 2:
        return 0, []
    L = min(ctx, n - 1)
    stride = max(1, L // 2) if stride is None else int(stride)
    if not 1 <= stride <= L:
        raise ValueError(f"stride must be in 1..{L}, got {stride}")
    last = n - 1 - L
    starts = list(range(0, last + 1, stride))
    if starts[-1] != last:
        starts.append(last)
    out, scored_to = [], 0  # targets data[1..scored_to] are scored
    for s in starts:
        first = scored_to - s  # target data[s + 1 + i] is new when s + 1 + i > scored_to
        out.append((s, max(0, first)))
        scored_to = s + L
    return L, out


def sliding_bpb(model, data, ctx=None, batch=16, n_bytes=None, progress=False, stride=None):
    """Bits per byte of ``model`` on ``data`` (1-D uint8) with the full-context sliding window.

    ``n_bytes`` limits the evaluation to the first ``n_bytes`` bytes of ``data``; every byte of them
    after the first is predicted once (see :func:`sliding_windows` for the windows and ``stride``).
    ``ctx`` defaults to the model's. Windows go through the full network (for RGC models the last
    stage's prediction) ``batch`` at a time. Returns ``{"bpb", "bytes_scored", "windows", "stride",
    "ctx"}`` (``ctx``: the window length used, ``min(ctx, n - 1)``).
    """
    from .errors import ConfigError
    data = np.asarray(data)
    if data.ndim != 1:
        raise ConfigError(f"data must be 1-D, got shape {data.shape}")
    ctx = model.cfg.ctx if ctx is None else int(ctx)
    if not 1 <= ctx <= model.cfg.ctx:
        raise ConfigError(f"ctx must be in 1..{model.cfg.ctx} (the model's), got {ctx}")
    batch = int(batch)
    if batch < 1:
        raise ConfigError(f"batch must be >= 1, got {batch}")
    n = len(data) if n_bytes is None else min(int(n_bytes), len(data))
    if n_bytes is not None and int(n_bytes) < 2:
        raise ConfigError(f"bytes must be >= 2 (the first byte has no context), got {n_bytes}")
    if n < 2:
        raise ConfigError(f"need at least 2 bytes to evaluate, got {n}")
    try:
        L, wins = sliding_windows(n, ctx, stride)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    B = min(batch, len(wins))
    ws = model.cached_workspace(B, L)
    x = np.zeros((B, L), np.int32)
    y = np.zeros((B, L), np.int32)
    total, scored = 0.0, 0
    bar = None
    if progress:
        from tqdm import tqdm
        bar = tqdm(total=n - 1, unit="B", unit_scale=True, desc="eval", disable=None)
    for b0 in range(0, len(wins), B):
        chunk = wins[b0:b0 + B]
        for i in range(B):
            s = chunk[min(i, len(chunk) - 1)][0]  # a short last batch repeats its last window
            w = data[s:s + L + 1]
            x[i] = w[:-1]
            y[i] = w[1:]
        h = model.forward_blocks(model.embed(x, ws), 0, model.cfg.n_layer, ws)
        model.decoder_loss(h, y, ws)
        losses = ws.losses.reshape(B, L)
        got = 0
        for i, (_, first) in enumerate(chunk):
            total += float(np.sum(losses[i, first:], dtype=np.float64))
            got += L - first
        scored += got
        if bar is not None:
            bar.update(got)
    if bar is not None:
        bar.close()
    if not math.isfinite(total):
        from .errors import DivergenceError
        raise DivergenceError("non-finite loss in evaluation")
    return {"bpb": total / scored / LN2, "bytes_scored": scored, "windows": len(wins),
            "stride": max(1, L // 2) if stride is None else int(stride), "ctx": L}
