"""Per-call time of single kernels at several sizes with the calling thread's Numba group at 2 and at 1
(the same kernel and the same split, nt=2, only run serially), idle and with 2 busy processes.

    python3 benchmarks/contention_kernels.py SECONDS_PER_CELL OUT.json
"""
import sys, time, subprocess, json
import numpy as np, numba
import nbrgc
from nbrgc.threads import limit_blas
from nbrgc.kernels.layernorm import layernorm_fwd, layernorm_bwd
from nbrgc.kernels.gemm import matmul, linear_bwd
from nbrgc.kernels.mlp import bias_gelu_fwd
from nbrgc.kernels.adamw import adamw_update
from nbrgc.kernels.attention import attention_fwd
limit_blas(1)
f32 = np.float32
rng = np.random.default_rng(0)
def R(*s): return rng.standard_normal(s).astype(f32)
cases = []
d = 64
for N in (64, 256, 1024, 4096, 16384):
    X, w, b, Y, m, r = R(N, d), R(d), R(d), R(N, d), R(N), R(N)
    cases.append((f"layernorm_fwd N={N} d={d}", N * d, lambda X=X,w=w,b=b,Y=Y,m=m,r=r: layernorm_fwd(X, w, b, Y, m, r)))
for N in (64, 256, 1024, 4096):
    A, W, C = R(N, d), R(d, 4 * d), R(N, 4 * d)
    cases.append((f"matmul {N}x{d}x{4*d}", N * d * 4 * d, lambda A=A,W=W,C=C: matmul(A, W, C, 0.0, 2)))
for N in (64, 256, 1024, 4096):
    P, b, O = R(N, 4 * d), R(4 * d), R(N, 4 * d)
    cases.append((f"bias_gelu_fwd N={N}x{4*d}", N * 4 * d, lambda P=P,b=b,O=O: bias_gelu_fwd(P, b, O)))
for n in (16384, 65536, 262144, 1048576):
    P, G, M, V = R(n), R(n) * 0, np.zeros(n, f32), np.zeros(n, f32)
    mask = np.ones(n, np.uint8)
    cases.append((f"adamw n={n}", n, lambda P=P,G=G,M=M,V=V,mask=mask: adamw_update(P, G, M, V, mask, 1e-4, 0.9, 0.95, 1e-8, 0.1, 1, 1.0)))
for B, H, T, dd in ((4, 2, 16, 32), (16, 4, 64, 64), (16, 4, 128, 128)):
    qkv, probs, y = R(B * T, 3 * dd) * 0.1, R(B, H, T, T), R(B * T, dd)
    cases.append((f"attention_fwd B{B} H{H} T{T} d{dd}", B * H * T * T * (dd // H), lambda qkv=qkv,probs=probs,y=y,B=B,H=H,T=T: attention_fwd(qkv, B, T, H, probs, y)))
def per_call(fn, secs):
    fn(); fn()
    n = 0; t0 = time.perf_counter()
    while True:
        fn(); n += 1
        t = time.perf_counter() - t0
        if t > secs and n >= 5: return t / n
res = []
secs = float(sys.argv[1]) if len(sys.argv) > 1 else 0.3
for busy in (0, 2):
    procs = [subprocess.Popen([sys.executable, "-c", "while 1: pass"]) for _ in range(busy)]
    time.sleep(0.2)
    try:
        for name, work, fn in cases:
            row = {"case": name, "work": work, "busy": busy}
            for nt in (2, 1):
                numba.set_num_threads(nt)
                row[f"t{nt}"] = per_call(fn, secs)
            numba.set_num_threads(2)
            res.append(row)
            print(f"busy {busy} {name:40s} 2thr {row['t2']*1e6:9.1f} us  1thr {row['t1']*1e6:9.1f} us  speedup {row['t1']/row['t2']:.2f}", flush=True)
    finally:
        for p in procs: p.kill(); p.wait()
json.dump(res, open(sys.argv[2], "w"), indent=1)
