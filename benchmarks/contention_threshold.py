"""Idle per-call time of single kernels around the size where a 2-thread region starts to pay, with
the calling thread's Numba group at 2 and at 1 (the same kernel and split, nt=2): the measurement
behind nbrgc.kernels.serial.SERIAL_WORK.

    python3 benchmarks/contention_threshold.py SECONDS_PER_CELL OUT.json

With the serial switch in place, every case below the threshold runs serially in both columns; run
it on a checkout without the switch to see the 2-thread side (PYTHONPATH=that checkout).
"""
import sys, time, json
import numpy as np, numba
import nbrgc
from nbrgc.threads import limit_blas
from nbrgc.kernels.layernorm import layernorm_fwd, layernorm_bwd
from nbrgc.kernels.gemm import matmul, add_bias, linear_bwd
from nbrgc.kernels.mlp import bias_gelu_fwd, gelu_bwd
from nbrgc.kernels.adamw import adamw_update, sumsq
from nbrgc.kernels.attention import attention_fwd
from nbrgc.kernels.loss import xent_fwd_bwd
limit_blas(1)
f32 = np.float32
rng = np.random.default_rng(0)
def R(*s): return rng.standard_normal(s).astype(f32)
cases = []
d = 64
for N in (32, 64, 128, 256, 512, 1024):
    X, w, b, Y, m, r = R(N, d), R(d), R(d), R(N, d), R(N), R(N)
    cases.append((f"layernorm_fwd N={N} d={d}", N * d, lambda X=X,w=w,b=b,Y=Y,m=m,r=r: layernorm_fwd(X, w, b, Y, m, r)))
    dY, dX, dw, db, part = R(N, d), R(N, d), R(d), R(d), R(2, 2, d)
    cases.append((f"layernorm_bwd N={N} d={d}", N * d, lambda X=X,w=w,m=m,r=r,dY=dY,dX=dX,dw=dw,db=db,part=part: layernorm_bwd(dY, X, w, m, r, dX, dw, db, part, 2, 0.0)))
for N in (8, 16, 32, 64, 128, 256):
    P, b, O = R(N, 4 * d), R(4 * d), R(N, 4 * d)
    cases.append((f"bias_gelu_fwd N={N}x{4*d}", N * 4 * d, lambda P=P,b=b,O=O: bias_gelu_fwd(P, b, O)))
    cases.append((f"gelu_bwd N={N}x{4*d}", N * 4 * d, lambda P=P,O=O: gelu_bwd(P, O)))
    cases.append((f"add_bias N={N}x{4*d}", N * 4 * d, lambda P=P,b=b: add_bias(P, b)))
for N in (16, 32, 64, 128, 256):
    L, t, l = R(N, 256), rng.integers(0, 256, N), R(N)
    cases.append((f"xent N={N}x256", N * 256, lambda L=L,t=t,l=l: xent_fwd_bwd(L, t, l, 1.0)))
for N in (16, 32, 64, 128, 256, 512):
    A, W, C = R(N, d), R(d, 4 * d), R(N, 4 * d)
    cases.append((f"matmul {N}x{d}x{4*d}", N * d * 4 * d, lambda A=A,W=W,C=C: matmul(A, W, C, 0.0, 2)))
for n in (4096, 8192, 16384, 32768, 65536):
    P, G, M, V = R(n), R(n) * 0, np.zeros(n, f32), np.zeros(n, f32)
    mask = np.ones(n, np.uint8)
    cases.append((f"adamw n={n}", n, lambda P=P,G=G,M=M,V=V,mask=mask: adamw_update(P, G, M, V, mask, 1e-4, 0.9, 0.95, 1e-8, 0.1, 1, 1.0)))
    cases.append((f"sumsq n={n}", n, lambda G=G: sumsq(G)))
for B, H, T, dd in ((1, 2, 16, 32), (2, 2, 16, 32), (4, 2, 16, 32), (4, 4, 32, 64), (8, 4, 64, 64)):
    qkv, probs, y = R(B * T, 3 * dd) * 0.1, R(B, H, T, T), R(B * T, dd)
    cases.append((f"attention_fwd B{B} H{H} T{T} d{dd}", B * H * T * T * (dd // H), lambda qkv=qkv,probs=probs,y=y,B=B,H=H,T=T: attention_fwd(qkv, B, T, H, probs, y)))
def per_call(fn, secs):
    fn(); fn()
    best = []
    for _ in range(3):
        n = 0; t0 = time.perf_counter()
        while True:
            fn(); n += 1
            t = time.perf_counter() - t0
            if t > secs and n >= 5: break
        best.append(t / n)
    return min(best)
secs = float(sys.argv[1])
res = []
for name, work, fn in cases:
    row = {"case": name, "work": work}
    for nt in (2, 1):
        numba.set_num_threads(nt)
        row[f"t{nt}"] = per_call(fn, secs)
    numba.set_num_threads(2)
    res.append(row)
    print(f"{name:36s} work {work:9d}  2thr {row['t2']*1e6:8.1f} us  1thr {row['t1']*1e6:8.1f} us  1thr/2thr {row['t1']/row['t2']:.2f}", flush=True)
json.dump(res, open(sys.argv[2], "w"), indent=1)
