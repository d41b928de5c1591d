"""Peak-memory accounting: what a run will allocate (computed before it starts) and what it used."""
import math
import os
import resource


def peak_rss_mib():
    """This process's peak resident set size, from the OS."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def available_bytes():
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")


def workspace_bytes(cfg, B, T, n_blocks, itemsize, nt, decoder=True, attention="store"):
    """Bytes of one :class:`~nbrgc.model.Workspace`, from the table it allocates from."""
    from .model import workspace_shapes
    shapes, ints = workspace_shapes(cfg, B, T, n_blocks, decoder, attention, nt)
    count = lambda table: sum(math.prod(s) for s in table.values())  # noqa: E731
    return itemsize * count(shapes) + 4 * count(ints)


def estimate(cfg, tc, B, T, nt):
    """Bytes by component for a run of mode ``tc.mode`` (parameters, gradients, AdamW moments,
    activations and, for rgc-async, the hand-off ring and decoder copies)."""
    item = 4
    d, V = cfg.d_model, cfg.vocab
    dec = d * 2 + d * V + V
    P = (V + cfg.ctx) * d + cfg.n_layer * (12 * d * d + 13 * d) + dec  # = Layout(cfg).size, O(1)
    out = {"params": P * item, "grads": P * item, "adamw": 2 * P * item,
           "eval_batches": 2 * 4 * tc.eval_batches * B * T}  # the held-out (x, y) int32 batches
    L = cfg.n_layer
    if tc.mode == "bp":
        out["activations"] = workspace_bytes(cfg, B, T, L, item, nt, attention=tc.attention)
        if tc.grad_delay:  # the weights of the last N steps, and the current ones while they wait
            out["delayed_weights"] = (tc.grad_delay + 1) * P * item
    else:
        K, per = tc.n_stages, L // tc.n_stages
        n_ws = 1
        threaded = tc.threaded
        pipe_rule = tc.pipe_rule
        delayed = tc.base_mode != "rgc-sync"  # rgc-sync runs the rule with no staleness or delay
        if threaded:  # one workspace per worker (stages sharing a worker share it)
            from .config import resolve_stage_workers
            from .threads import cpu_count
            n_ws = resolve_stage_workers(tc, tc.threads or cpu_count())
        out["activations"] = n_ws * workspace_bytes(cfg, B, T, per, item, nt, attention=tc.attention)
        S = tc.max_staleness if delayed else 0
        out["rgc"] = (S + 1) * K * dec * item + dec * item
        if pipe_rule:
            from .horizon import loss_weights
            from .local import split_stages
            from .schemes.pipe_sync import ring_shapes, stage_horizon
            hops = stage_horizon(tc.horizon, split_stages(L, K))
            d_ = tc.boundary_delay if delayed else 0
            stash = None
            if delayed and tc.replay_weights != "current":
                blocks = per * (12 * d * d + 13 * d)
                stash = [blocks + (V + cfg.ctx) * d * (k == 0) for k in range(K)]
            rings = ring_shapes(K, hops, loss_weights(K, tc.aux_weight), d_, B, T, d, stash,
                                tc.replay_weights == "predicted")
            out["pipe_rings"] = sum((4 if dt else item) * math.prod(shape)
                                    for shape, dt in rings.values())
            out["decoder_versions"] = (S + 2) * dec * item
        if tc.readout_blocks and K > 1:
            n = tc.readout_blocks * (K - 1)
            # params, grads, AdamW moments of a model of n blocks, and one workspace of N blocks
            out["readout"] = 4 * item * (n * (12 * d * d + 13 * d) + (V + cfg.ctx) * d + dec) + \
                n_ws * workspace_bytes(cfg, B, T, tc.readout_blocks, item, nt, decoder=False,
                                attention=tc.attention)
        if threaded:
            out["ring"] = max(K - 1, 1) * (S + 1) * B * T * cfg.d_model * item
            out["decoder_versions"] = (S + 2) * dec * item
            snapshots = not pipe_rule  # pipe-async drains instead
            if snapshots and (tc.ckpt_every or tc.eval_every):  # they read a copy (nbrgc.boundary)
                out["checkpoint_snapshot"] = 3 * P * item + (S + 2) * dec * item
    out["total"] = int(sum(out.values()))
    return out


def fmt_mib(nbytes):
    return f"{nbytes / 2**20:,.1f} MiB"


