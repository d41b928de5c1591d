"""Per-call time of single kernels with the calling thread's Numba group at 2 and at 1 (the same
kernel and split, nt=2, only run serially), at a grid of sizes, idle or beside busy processes.

    python3 benchmarks/kernel_threads.py --grid threshold OUT.json   # around where 2 threads pay:
                                                                     # behind kernels.serial.SERIAL_WORK
    python3 benchmarks/kernel_threads.py --grid sizes --busy 0,2 OUT.json   # the table in contention.md

With the serial switch in place a case below SERIAL_WORK runs serially in both columns; run it on a
checkout without the switch (PYTHONPATH=that checkout) to see the 2-thread side. Each cell is the
best of --repeats timings of at least --seconds each.
"""
import argparse
import json
import subprocess
import sys
import time

import numba
import numpy as np

import nbrgc  # noqa: F401  (selects the threading layer)
from nbrgc.kernels.adamw import adamw_update, sumsq
from nbrgc.kernels.attention import attention_fwd
from nbrgc.kernels.gemm import add_bias, matmul
from nbrgc.kernels.layernorm import layernorm_bwd, layernorm_fwd
from nbrgc.kernels.loss import xent_fwd_bwd
from nbrgc.kernels.mlp import bias_gelu_fwd, gelu_bwd
from nbrgc.threads import limit_blas

GRIDS = {  # per kernel family, the sizes each grid times
    "threshold": dict(ln=(32, 64, 128, 256, 512, 1024), elementwise=(8, 16, 32, 64, 128, 256),
                      xent=(16, 32, 64, 128, 256), gemm=(16, 32, 64, 128, 256, 512),
                      adamw=(4096, 8192, 16384, 32768, 65536),
                      attention=((1, 2, 16, 32), (2, 2, 16, 32), (4, 2, 16, 32), (4, 4, 32, 64),
                                 (8, 4, 64, 64))),
    "sizes": dict(ln=(64, 256, 1024, 4096, 16384), elementwise=(64, 256, 1024, 4096), xent=(),
                  gemm=(64, 256, 1024, 4096), adamw=(16384, 65536, 262144, 1048576),
                  attention=((4, 2, 16, 32), (16, 4, 64, 64), (16, 4, 128, 128))),
}


def cases(grid, d=64):
    """[(name, work units, call)] for the sizes of ``grid``."""
    rng = np.random.default_rng(0)

    def R(*s):
        return rng.standard_normal(s).astype(np.float32)
    g, out = GRIDS[grid], []
    for N in g["ln"]:
        X, w, b, Y, m, r = R(N, d), R(d), R(d), R(N, d), R(N), R(N)
        dY, dX, dw, db, part = R(N, d), R(N, d), R(d), R(d), R(2, 2, d)
        out.append((f"layernorm_fwd N={N} d={d}", N * d, lambda a=(X, w, b, Y, m, r): layernorm_fwd(*a)))
        out.append((f"layernorm_bwd N={N} d={d}", N * d,
                    lambda a=(dY, X, w, m, r, dX, dw, db, part, 2, 0.0): layernorm_bwd(*a)))
    for N in g["elementwise"]:
        P, b, O = R(N, 4 * d), R(4 * d), R(N, 4 * d)
        out.append((f"bias_gelu_fwd N={N}x{4 * d}", N * 4 * d, lambda a=(P, b, O): bias_gelu_fwd(*a)))
        out.append((f"gelu_bwd N={N}x{4 * d}", N * 4 * d, lambda a=(P, O): gelu_bwd(*a)))
        out.append((f"add_bias N={N}x{4 * d}", N * 4 * d, lambda a=(P, b): add_bias(*a)))
    for N in g["xent"]:
        L, t, loss = R(N, 256), rng.integers(0, 256, N), R(N)
        out.append((f"xent N={N}x256", N * 256, lambda a=(L, t, loss, 1.0): xent_fwd_bwd(*a)))
    for N in g["gemm"]:
        A, W, C = R(N, d), R(d, 4 * d), R(N, 4 * d)
        out.append((f"matmul {N}x{d}x{4 * d}", N * d * 4 * d, lambda a=(A, W, C, 0.0, 2): matmul(*a)))
    for n in g["adamw"]:
        P, G, M, V, mask = R(n), np.zeros(n, np.float32), np.zeros(n, np.float32), \
            np.zeros(n, np.float32), np.ones(n, np.uint8)
        out.append((f"adamw n={n}", n, lambda a=(P, G, M, V, mask, 1e-4, 0.9, 0.95, 1e-8, 0.1, 1, 1.0):
                    adamw_update(*a)))
        out.append((f"sumsq n={n}", n, lambda G=G: sumsq(G)))
    for B, H, T, dd in g["attention"]:
        qkv, probs, y = R(B * T, 3 * dd) * 0.1, R(B, H, T, T), R(B * T, dd)
        out.append((f"attention_fwd B{B} H{H} T{T} d{dd}", B * H * T * T * (dd // H),
                    lambda a=(qkv, B, T, H, probs, y): attention_fwd(*a)))
    return out


def per_call(fn, seconds, repeats):
    fn()
    fn()  # compiled and warm
    best = float("inf")
    for _ in range(repeats):
        n, t0 = 0, time.perf_counter()
        while True:
            fn()
            n += 1
            t = time.perf_counter() - t0
            if t > seconds and n >= 5:
                break
        best = min(best, t / n)
    return best


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--grid", choices=sorted(GRIDS), default="threshold")
    ap.add_argument("--busy", default="0", help="comma list of busy-process counts (default: 0)")
    ap.add_argument("--seconds", type=float, default=0.3, help="per timing (default: 0.3)")
    ap.add_argument("--repeats", type=int, default=3, help="timings per cell, best kept (default: 3)")
    a = ap.parse_args(argv)
    limit_blas(1)
    todo, rows = cases(a.grid), []
    for busy in [int(b) for b in a.busy.split(",")]:
        # busy loops in other processes: the competing load of a shared machine
        procs = [subprocess.Popen([sys.executable, "-c", "while 1: pass"]) for _ in range(busy)]
        time.sleep(0.2)
        try:
            for name, work, fn in todo:
                row = {"case": name, "work": work, "busy": busy}
                for nt in (2, 1):
                    numba.set_num_threads(nt)
                    row[f"t{nt}"] = per_call(fn, a.seconds, a.repeats)
                numba.set_num_threads(2)
                rows.append(row)
                print(f"busy {busy} {name:36s} work {work:9d}  2thr {row['t2'] * 1e6:8.1f} us  "
                      f"1thr {row['t1'] * 1e6:8.1f} us  1thr/2thr {row['t1'] / row['t2']:.2f}", flush=True)
        finally:
            for p in procs:
                p.kill()
                p.wait()
    with open(a.out, "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
