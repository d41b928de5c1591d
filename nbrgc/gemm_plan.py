"""Which way to split each backward GEMM over a thread group, chosen by measurement.

Splitting the rows or the columns of a weight gradient (X^T dY) or a data gradient (dY W^T) over
threads gives the same result to the bit (each element stays one BLAS dot product), but not the same
speed: on this machine's OpenBLAS a row split of dY W^T ran at half the speed of a column split for
the 256 x 1024 shapes of the ``paper`` preset, and the other way round for ``small``. So the first
step at a new (shape, group size) times both splits of every site and keeps the faster. With an
even group it then times the whole backward of the site (both products and the bias sum) so split,
against the two products side by side on half the group each (``TASKS`` in the weight entry; the data
entry is then unused), and keeps the faster. The head never runs side by side: the decoder writes
its data gradient over the product's input.

Plan entries, in order: MLP-down (weight, data), MLP-up, attention output, qkv, head.
"""
import threading
import time

import numba
import numpy as np

from .kernels.gemm import TASKS, linear_bwd, matmul_nt, matmul_tn

N_SITES = 10
_plans = {}
_lock = threading.Lock()


def _sites(d, V):
    """(K, M) of each linear layer y = x W: x (N, K), W (K, M)."""
    return [(4 * d, d), (d, 4 * d), (d, d), (d, 3 * d), (d, V)]


def _best(fn, a, b, c, nt, reps=3):
    times = []
    for split in (0, 1):
        fn(a, b, c, 0.0, nt, split)
        best = float("inf")
        for _ in range(reps):
            t = time.perf_counter()
            fn(a, b, c, 0.0, nt, split)
            best = min(best, time.perf_counter() - t)
        times.append(best)
    return int(np.argmin(times))


def _tasks_faster(X, W, dY, nt, split_w, split_x, reps=5):
    K, M = W.shape
    dX, dW, db = np.zeros_like(X), np.zeros((K, M), X.dtype), np.zeros(M, X.dtype)
    best = {}
    for _ in range(reps):  # interleaved, so a slow moment of the machine hits both
        for sw, sx in ((split_w, split_x), (TASKS, 0)):
            t = time.perf_counter()
            linear_bwd(X, W, dY, dX, dW, db, nt, 0.0, sw, sx)
            best[sw] = min(best.get(sw, float("inf")), time.perf_counter() - t)
    return best[TASKS] < best[split_w]


def plan_for(d, V, N, dtype=np.float32, nt=None):
    """The split plan (int64, N_SITES) for rows N, width d, vocab V at the calling thread's group size."""
    nt = numba.get_num_threads() if nt is None else nt
    key = (d, V, N, np.dtype(dtype).str, nt)
    plan = _plans.get(key)
    if plan is not None:
        return plan
    with _lock:
        plan = _plans.get(key)
        if plan is None:
            plan = np.zeros(N_SITES, np.int64)
            if nt > 1:
                rng = np.random.default_rng(0)
                for s, (K, M) in enumerate(_sites(d, V)):
                    X = rng.standard_normal((N, K)).astype(dtype)
                    dY = rng.standard_normal((N, M)).astype(dtype)
                    W = rng.standard_normal((K, M)).astype(dtype)
                    plan[2 * s] = _best(matmul_tn, X, dY, np.zeros((K, M), dtype), nt)
                    plan[2 * s + 1] = _best(matmul_nt, dY, W, np.zeros((N, K), dtype), nt)
                    if nt % 2 == 0 and s < 4 and _tasks_faster(X, W, dY, nt, plan[2 * s],
                                                              plan[2 * s + 1]):
                        plan[2 * s] = TASKS
            _plans[key] = plan
    return plan
