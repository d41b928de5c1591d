"""rgc-async's start-up autotune: the thread group of each stage, from timed steps of one stage."""
import time

import numpy as np

from ..threads import set_threads


def autotune_groups(model, stages, budget, B, T, log=None, reps=2):
    """Thread groups that balance the pipeline: time one stage's forward+backward at each group size
    (all stages run the same number of blocks), then hand threads one by one to the stage whose
    step is slowest. With no more threads than stages there is nothing to choose."""
    K = len(stages)
    if budget <= K:
        return [1] * K
    lo, hi = stages[0]
    ws = model.workspace(B, T, 0, hi - lo)
    x = np.zeros((B, T), np.int32)
    y = np.zeros((B, T), np.int32)
    G = np.zeros_like(model.grad_flat)
    gdec = np.zeros(model.layout.decoder_range[1] - model.layout.decoder_range[0], model.dtype)

    def one_step():
        out = model.forward_blocks(model.embed(x, ws), lo, hi, ws)
        _, dh = model.decoder_loss_and_grad(out, y, ws, gdec=gdec)
        model.backward_blocks(dh, lo, hi, ws, grad_flat=G)

    timings = {}
    prev = set_threads(budget)
    try:
        import numba
        for n in range(1, min(budget - K + 1, numba.config.NUMBA_NUM_THREADS) + 1):
            set_threads(n)
            one_step()
            t0 = time.perf_counter()
            for _ in range(reps):
                one_step()
            timings[n] = (time.perf_counter() - t0) / reps
    finally:
        set_threads(prev)
    groups = [1] * K
    for _ in range(budget - K):
        k = max(range(K), key=lambda i: (timings[groups[i]], -i))
        if groups[k] + 1 not in timings or timings[groups[k] + 1] >= timings[groups[k]]:
            break  # more threads would not make the slowest stage faster
        groups[k] += 1
    if log:
        log("stage-thread autotune: " + ", ".join(f"{n} thr {t * 1e3:.0f} ms" for n, t in
                                                  timings.items()) + f" -> groups {groups}")
    return groups


def stage_groups(model, stages, budget, W, B, T, log=None):
    """--stage-threads auto: the thread group of each stage. Stages that share W < K workers split
    the budget over the workers evenly; a worker per stage is timed (:func:`autotune_groups`)."""
    K = len(stages)
    if W < K:
        per, extra = divmod(budget, W)
        wg = [max(1, per + (w < extra)) for w in range(W)]
        return [wg[k % W] for k in range(K)]
    return autotune_groups(model, stages, budget, B, T, log)
