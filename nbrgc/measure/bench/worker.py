"""What runs inside one bench child process (``python -m nbrgc.measure.bench --worker SPEC``): a timed
training loop, a GEMM peak, or a kernel profile; one JSON result line on stdout."""
import json
import math
import statistics
import sys
import time

from ...errors import NbrgcError


def _proc_status_mib(field, pid="self"):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1024.0
    except (OSError, ValueError, IndexError):
        pass
    return None


def _train_worker(spec):
    from ...config import ModelConfig, TrainConfig
    from ...data import Batches, load_dataset
    from ...optim import lr_at
    mcfg = ModelConfig.from_dict(spec["model"])
    tc = TrainConfig.from_dict(spec["train"])
    seq = tc.validate_for(mcfg)
    mode, threads = spec["mode"], int(spec["threads"])
    W, M = int(spec["warmup_steps"]), int(spec["steps"])
    ds = load_dataset(spec["data"], data_dir=spec.get("data_dir"), log=None, download=False,
                      progress=False)
    batches = Batches(ds.train, tc.batch, seq, seed=tc.seed)
    rss_base = _proc_status_mib("VmRSS")
    out = {"mode": mode, "threads": threads}
    if mode == "torch":
        from ..peers.torch_peer import TorchPeer
        peer = TorchPeer(mcfg, tc, threads=threads, seed=tc.seed)
        out.update(torch_threads=peer.torch.get_num_threads(), torch_version=peer.torch.__version__,
                   torch_fused_adamw=peer.fused)
        losses = []

        def submit(i, x, y, lr):
            losses.append(peer.step(x, y, lr))

        def collect(drain):
            n = len(losses)
            losses.clear()
            return n
        close = lambda: None  # noqa: E731
    else:
        from ...memory import estimate
        from ...model import Model
        from ...schemes import make_scheme
        from ...threads import limit_blas, set_threads
        limit_blas(1)
        nt = set_threads(threads)
        model = Model(mcfg, seed=tc.seed, attention=tc.attention)
        sc = make_scheme(model, tc)
        out["numba_threads"] = nt
        out["expected_mib"] = estimate(mcfg, tc, tc.batch, seq, nt)["total"] / 2**20
        submit = sc.submit

        def collect(drain):
            res = sc.poll() + (sc.drain() if drain else [])
            bad = [r.step for r in res if not math.isfinite(r.loss)]
            if bad:
                raise NbrgcError(f"{mode}: non-finite loss at step {bad[0]}")
            return len(res)
        close = sc.close
    try:
        for i in range(W):
            x, y = batches.next()
            submit(i, x, y, lr_at(i, tc))
            collect(False)
        collect(True)
        done_at = []
        t0 = time.perf_counter()
        for i in range(W, W + M):
            x, y = batches.next()
            submit(i, x, y, lr_at(i, tc))
            n = collect(False)
            if n:
                done_at += [time.perf_counter() - t0] * n
        n = collect(True)
        wall = time.perf_counter() - t0
        done_at += [wall] * n
    finally:
        close()
    if tc.threaded:  # resolved (autotuned for "auto") when the workers first started
        groups = getattr(sc, "groups", None)
        out["stage_threads"] = list(groups) if groups is not None else None
        out["stage_workers"] = sc.W
        out["stage_profile"] = sc.stage_profile()  # the timed steps only (the warm-up was drained)
    if len(done_at) != M:
        raise NbrgcError(f"{mode}: {len(done_at)} of {M} timed steps completed")
    tokens = M * tc.batch * seq
    out.update(steps=M, warmup_steps=W, batch=tc.batch, seq=seq, tokens=tokens, wall_s=wall,
               tokens_per_s=tokens / wall, ms_per_step=1000.0 * wall / M,
               step_done_s=[round(t, 6) for t in done_at],
               self_maxrss_mib=_maxrss_self(), vmhwm_mib=_proc_status_mib("VmHWM"),
               rss_before_model_mib=rss_base)
    return out


def _maxrss_self():
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _time_best(fn, min_time=0.3, min_reps=3, max_reps=200):
    fn()
    fn()
    times = []
    start = time.perf_counter()
    while len(times) < min_reps or (time.perf_counter() - start < min_time and len(times) < max_reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return times


def _gemm_worker(spec):
    """fp32 GEMM GFLOP/s at one shape: nbrgc's Numba path (BLAS pinned to 1 thread, rows split over
    the Numba group) and np.dot (NumPy's BLAS with ``threads`` threads)."""
    import numpy as np
    from threadpoolctl import threadpool_limits
    from ...kernels.gemm import matmul
    from ...threads import limit_blas, set_threads
    M, K, N = spec["shape"]
    threads = int(spec["threads"])
    rng = np.random.default_rng(0)
    A = rng.standard_normal((M, K), dtype=np.float32)
    B = rng.standard_normal((K, N), dtype=np.float32)
    C = np.zeros((M, N), np.float32)
    flops = 2.0 * M * K * N
    limit_blas(1)
    nt = set_threads(threads)
    t_nb = _time_best(lambda: matmul(A, B, C, 0.0, nt))
    ok = np.allclose(C, A @ B, rtol=1e-3, atol=1e-3)
    with threadpool_limits(limits=threads, user_api="blas"):
        t_np = _time_best(lambda: np.dot(A, B, out=C))
    g = lambda ts: flops / min(ts) / 1e9  # noqa: E731
    return {"kind": "gemm", "shape": [M, K, N], "threads": threads, "numba_matmul_correct": bool(ok),
            "numba_gflops": g(t_nb), "numba_gflops_median": flops / statistics.median(t_nb) / 1e9,
            "npdot_gflops": g(t_np), "npdot_gflops_median": flops / statistics.median(t_np) / 1e9,
            "numba_times_s": t_nb, "npdot_times_s": t_np}


def _profile_worker(spec):
    """Per-kernel time of one BP step (:mod:`nbrgc.profile`: the production kernels replayed one call
    at a time, the gradients bitwise those of the production path)."""
    from ...config import ModelConfig
    from ...profile import measure
    attention = spec.get("attention", "store")
    per, wall, nt = measure(ModelConfig.from_dict(spec["model"]), int(spec["batch"]),
                            int(spec["seq"]), int(spec["threads"]), attention,
                            int(spec["repeats"]), int(spec.get("seed", 0)))
    return {"kind": "profile", "threads": nt, "attention": attention, "step_s": wall,
            "kernels_s": per}


_WORKERS = {"gemm": _gemm_worker, "profile": _profile_worker}


def worker_main(argv):
    """``python -m nbrgc.measure.bench --worker SPEC_JSON``: one JSON result line on stdout."""
    if len(argv) != 2 or argv[0] != "--worker":
        print("usage: python -m nbrgc.measure.bench --worker SPEC_JSON (internal; see nbrgc-bench)",
              file=sys.stderr)
        return 2
    spec = json.loads(argv[1])
    try:
        res = _WORKERS.get(spec.get("kind"), _train_worker)(spec)
    except NbrgcError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 3
    sys.stdout.write(json.dumps(res) + "\n")
    sys.stdout.flush()
    return 0
