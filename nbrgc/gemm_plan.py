"""Which way to split each backward GEMM over a thread group, chosen by measurement.

Splitting the rows or the columns of a weight gradient (X^T dY) or a data gradient (dY W^T) over
threads gives the same result to the bit (each element stays one BLAS dot product), but not the same
speed: on this machine's OpenBLAS a row split of dY W^T ran at half the speed of a column split for
the 256 x 1024 shapes of the ``paper`` preset, and the other way round for ``small``. So the first
step at a new (shape, group size) times both splits of every site and keeps the faster.

Plan entries, in order: MLP-down (weight, data), MLP-up, attention output, qkv, head.
"""
import threading
import time

import numba
import numpy as np

from .kernels.gemm import matmul_nt, matmul_tn

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
            _plans[key] = plan
    return plan
