"""Speed and memory of the training modes, side by side (the engine of ``nbrgc-bench``).

Method (what the figures mean):

* Every (mode, round) runs in its own fresh Python process (``python -m nbrgc.bench --worker SPEC``),
  so no mode inherits another's heap, page cache of kernels or thread pools. Rounds are interleaved
  (A B C, A B C, ...) so slow drifts of the machine hit every mode alike, and every mode gets the same
  thread budget (``--threads``; rgc-async splits it over its stages unless ``--stage-threads`` says
  otherwise).
* A worker builds the model and scheme through the library (``Model`` + ``make_scheme``, the same
  objects ``nbrgc.train`` drives), runs ``warmup_steps`` steps (kernel loading, first-touch page
  faults) and drains, then times ``steps`` steps: the clock starts before the first timed ``submit``
  and stops after ``drain()`` returns, so for rgc-async the span includes filling and emptying the
  pipeline, and tokens/s = tokens of completed steps / wall time. Batches are drawn inside the timed
  loop, as in training; evaluation and checkpoints are not part of it.
* Peak RSS is the worker process's own high-water mark from the OS: ``ru_maxrss`` of that one child
  from ``wait4`` (reported as ``peak_rss_mib``), with the worker's ``VmHWM`` and the resident size
  before the model was built alongside. It includes the interpreter, NumPy/Numba and the loaded
  kernels, which every mode pays alike.
* Model FLOPs per token are ``6*N + 6*L*T*d`` (:data:`FLOPS_FORMULA`), the same for every mode, so
  achieved GFLOP/s = FLOPs/token x tokens/s is proportional to throughput; RGC's extra work (each
  stage also runs the shared decoder) is reported separately as ``executed_flops_per_token``.
* The ratio of a mode's tokens/s to BP's is taken within each round (the two runs closest in time),
  then summarised over rounds (median, min, max).
"""
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time

from .errors import ConfigError, NbrgcError

BASE = "bp"
NBRGC_MODES = ("bp", "rgc-sync", "rgc-async")
ALL_MODES = NBRGC_MODES + ("torch",)
FLOPS_FORMULA = ("6*N + 6*L*T*d per token: N = non-embedding parameters (all but wte and wpe; the "
                 "untied head counts), L layers, T sequence length, d model width (forward + "
                 "backward; attention scores and mixing as 2*L*T*d forward)")


# ---------------------------------------------------------------------------------------------- FLOPs
def non_embedding_params(mcfg):
    from .model import Layout
    lay = Layout(mcfg)
    return lay.size - mcfg.vocab * mcfg.d_model - mcfg.ctx * mcfg.d_model


def flops_per_token(mcfg, seq):
    """Model FLOPs per trained token: ``6*N + 6*L*T*d`` (see :data:`FLOPS_FORMULA`)."""
    return 6 * non_embedding_params(mcfg) + 6 * mcfg.n_layer * seq * mcfg.d_model


def executed_flops_per_token(mcfg, seq, mode, n_stages=1):
    """FLOPs per token a mode actually executes: RGC runs the decoder (final LN + head) once per
    stage, i.e. ``n_stages - 1`` more times than BP."""
    base = flops_per_token(mcfg, seq)
    if mode in ("rgc-sync", "rgc-async") and n_stages > 1:
        d, V = mcfg.d_model, mcfg.vocab
        base += 6 * (d * V + V + 2 * d) * (n_stages - 1)
    return base


# ---------------------------------------------------------------------------------------------- worker
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
    from .config import ModelConfig, TrainConfig
    from .data import Batches, load_dataset
    from .optim import lr_at
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
        from .peers.torch_peer import TorchPeer
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
        from .memory import estimate
        from .model import Model
        from .schemes import make_scheme
        from .threads import limit_blas, set_threads
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
    if mode == "rgc-async":  # resolved (autotuned for "auto") when the workers first started
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


def gemm_shape_for(mcfg, batch, seq):
    """The relevant GEMM: tokens x d_model times d_model x 4 d_model (the MLP up-projection)."""
    return batch * seq, mcfg.d_model, 4 * mcfg.d_model


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
    from .kernels.gemm import matmul
    from .threads import limit_blas, set_threads
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
    from .config import ModelConfig
    from .profile import measure
    attention = spec.get("attention", "store")
    per, wall, nt = measure(ModelConfig.from_dict(spec["model"]), int(spec["batch"]),
                            int(spec["seq"]), int(spec["threads"]), attention,
                            int(spec["repeats"]), int(spec.get("seed", 0)))
    return {"kind": "profile", "threads": nt, "attention": attention, "step_s": wall,
            "kernels_s": per}


_WORKERS = {"gemm": _gemm_worker, "profile": _profile_worker}


def worker_main(argv):
    """``python -m nbrgc.bench --worker SPEC_JSON``: one JSON result line on stdout."""
    if len(argv) != 2 or argv[0] != "--worker":
        print("usage: python -m nbrgc.bench --worker SPEC_JSON (internal; see nbrgc-bench)",
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


# ---------------------------------------------------------------------------------------------- launching
def _child_env(spec):
    import nbrgc
    env = dict(os.environ)
    root = os.path.dirname(os.path.dirname(os.path.abspath(nbrgc.__file__)))
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    from .threads import cpu_count
    need = max([int(spec.get("threads", 1))] + list(spec.get("groups") or []))
    if spec.get("mode") == "torch":
        env["NUMBA_NUM_THREADS"] = "1"  # nbrgc's Numba pool stays idle beside PyTorch's
    elif need > cpu_count() and "NUMBA_NUM_THREADS" not in os.environ:
        env["NUMBA_NUM_THREADS"] = str(need)  # an oversubscribed sweep point needs that many
    return env


def launch(spec, timeout=None):
    """Run one worker in a fresh process; returns its result dict plus ``peak_rss_mib`` (the child's
    ``ru_maxrss`` from ``wait4``) and ``process_wall_s``. Raises NbrgcError when the worker fails."""
    cmd = [sys.executable, "-m", "nbrgc.bench", "--worker", json.dumps(spec)]
    if spec.get("mode") == "torch":
        # PyTorch loads first: with Numba's OpenMP pool started before it (importing nbrgc does),
        # PyTorch's own OpenMP runtime ran ~10x slower on `paper` here (15 s/step instead of 1.3).
        cmd = [sys.executable, "-c", "import sys, torch; from nbrgc.bench import worker_main; "
               "sys.exit(worker_main(sys.argv[1:]))", "--worker", json.dumps(spec)]
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        p = subprocess.Popen(cmd, stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                             env=_child_env(spec))
        try:
            while True:
                pid, status, ru = os.wait4(p.pid, os.WNOHANG)
                if pid:
                    break
                if timeout is not None and time.perf_counter() - t0 > timeout:
                    p.kill()
                    os.wait4(p.pid, 0)
                    p.returncode = -9
                    raise NbrgcError(f"{_what(spec)} ran past --timeout {timeout:g} s")
                time.sleep(0.02)
        except BaseException:
            if p.returncode is None:
                p.kill()
                try:
                    os.wait4(p.pid, 0)
                except ChildProcessError:
                    pass
                p.returncode = -9
            raise
        p.returncode = rc = os.waitstatus_to_exitcode(status)
        wall = time.perf_counter() - t0
        out.seek(0)
        err.seek(0)
        stdout = out.read().decode(errors="replace")
        stderr = err.read().decode(errors="replace")
    if rc != 0:
        lines = [ln for ln in stderr.strip().splitlines() if ln.strip()]
        last = lines[-1] if lines else f"exit status {rc}"
        if last.startswith("error: "):
            last = last[len("error: "):]
        raise NbrgcError(f"{_what(spec)} failed: {last}")
    lines = [ln for ln in stdout.strip().splitlines() if ln.startswith("{")]
    if not lines:
        raise NbrgcError(f"{_what(spec)} printed no result")
    res = json.loads(lines[-1])
    res["peak_rss_mib"] = ru.ru_maxrss / 1024.0
    res["process_wall_s"] = wall
    return res


def _what(spec):
    if spec.get("kind") == "gemm":
        return f"GEMM peak worker ({spec.get('threads')} threads)"
    if spec.get("kind") == "profile":
        return f"kernel profile worker ({spec.get('threads')} threads, {spec.get('attention')})"
    return f"worker for {spec.get('label', spec.get('mode'))} ({spec.get('threads')} threads, " \
           f"round {spec.get('round', 0) + 1})"


# ---------------------------------------------------------------------------------------------- planning
def parse_int_list(text, what):
    try:
        vals = [int(p) for p in str(text).split(",") if p.strip()]
    except ValueError:
        raise ConfigError(f"{what} must be comma-separated integers, got {text!r}") from None
    if not vals or any(v < 1 for v in vals):
        raise ConfigError(f"{what} must list integers >= 1, got {text!r}")
    return vals


def parse_modes(text):
    modes = [m.strip().lower() for m in str(text).split(",") if m.strip()]
    if not modes:
        raise ConfigError("--modes is empty; choose from " + ", ".join(ALL_MODES))
    bad = [m for m in modes if m not in ALL_MODES]
    if bad:
        raise ConfigError(f"unknown mode {bad[0]!r} in --modes; choose from {', '.join(ALL_MODES)}")
    if len(set(modes)) != len(modes):
        raise ConfigError(f"--modes lists a mode twice: {text!r}")
    return modes


def parse_stage_groups(text, n_stages):
    """``"auto:2,1,1,1:1,1,1,1"`` -> ["auto", "2,1,1,1", "1,1,1,1"] (each checked for ``n_stages``)."""
    from .config import parse_stage_threads
    specs = [s.strip() for s in str(text).split(":") if s.strip()]
    if not specs:
        raise ConfigError(f"--stage-groups is empty: {text!r}")
    out = []
    for s in specs:
        g = parse_stage_threads(s, n_stages)
        out.append("auto" if g is None else ",".join(map(str, g)))
    return out


def default_n_stages(n_layer, want=4):
    for k in range(min(want, n_layer), 0, -1):
        if n_layer % k == 0:
            return k
    return 1


def parse_stage_workers(text):
    """``"auto,2,4"`` -> [0, 2, 4] (0: auto), for the --stage-workers sweep."""
    from .config import parse_stage_workers as one
    out = []
    for p in [p.strip() for p in str(text).split(",") if p.strip()] or ["auto"]:
        try:
            out.append(one(p))
        except ConfigError as exc:
            raise ConfigError(f"--stage-workers entries {exc}") from None
    if len(set(out)) != len(out):
        raise ConfigError(f"--stage-workers lists a value twice: {text!r}")
    return out


def parse_attention(text):
    """``"store,recompute"`` -> ["store", "recompute"] (the --attention sweep)."""
    from .config import check_attention
    out = [check_attention(p.strip()) for p in str(text).split(",") if p.strip()]
    if not out or len(set(out)) != len(out):
        raise ConfigError(f"--attention must list store and/or recompute once each, got {text!r}")
    return out


def plan_variants(modes, stage_groups, stage_workers=(0,), attention=("store",)):
    """[(label, mode, stage_threads, stage_workers, attention)]: every nbrgc mode once per attention
    choice, rgc-async also once per stage-group spec and worker count (0: auto)."""
    out = []
    for m in modes:
        for a in (attention if m != "torch" else ["store"]):
            extra = [] if a == "store" else [f"{a} attention"]
            if m == "rgc-async":
                for g in stage_groups:
                    for w in stage_workers:
                        tags = ([] if g == "auto" else [g]) + ([f"{w} workers"] if w else []) + extra
                        out.append((f"{m}[{'; '.join(tags)}]" if tags else m, m, g, w, a))
            else:
                out.append((f"{m}[{'; '.join(extra)}]" if extra else m, m, "auto", 0, a))
    return out


def interleaved(variants, threads_list, repeats):
    """The run order: for each thread count, rounds of A B C (every variant once per round)."""
    return [(t, r, v) for t in threads_list for r in range(repeats) for v in variants]


# ---------------------------------------------------------------------------------------------- figures
def _stats(vals):
    vals = [v for v in vals if v is not None and math.isfinite(v)]
    if not vals:
        return None
    return {"median": statistics.median(vals), "min": min(vals), "max": max(vals), "n": len(vals)}


def round_ratios(records, base=BASE, key="tokens_per_s"):
    """Per (threads, label): the ratio of ``key`` to the base mode's, taken round by round.

    ``records``: dicts with ``threads``, ``round``, ``label`` and ``key``. Returns
    ``{(threads, label): {"per_round": [...], "median", "min", "max", "n"}}``; rounds without a base
    run are skipped; the base mode itself is left out.
    """
    by_round = {}
    for r in records:
        by_round.setdefault((r["threads"], r["round"]), {})[r["label"]] = r
    out = {}
    for (t, rnd), runs in sorted(by_round.items()):
        b = runs.get(base)
        if b is None or not b.get(key):
            continue
        for label, r in runs.items():
            if label == base or r.get(key) is None:
                continue
            out.setdefault((t, label), []).append((rnd, r[key] / b[key]))
    res = {}
    for k, pairs in out.items():
        vals = [v for _, v in pairs]
        res[k] = dict(_stats(vals), per_round=vals, rounds=[rnd for rnd, _ in pairs])
    return res


def aggregate(records, flops=None, gemm=None, base=BASE):
    """One row per (threads, label) in run order: tokens/s, ms/step, peak RSS, GFLOP/s, ratios."""
    ratios = round_ratios(records, base)
    rss_ratios = round_ratios(records, base, key="peak_rss_mib")
    rows, seen = [], []
    for r in records:
        k = (r["threads"], r["label"])
        if k not in seen:
            seen.append(k)
    for t, label in seen:
        runs = [r for r in records if (r["threads"], r["label"]) == (t, label)]
        tps = _stats([r["tokens_per_s"] for r in runs])
        row = {"threads": t, "label": label, "mode": runs[0]["mode"],
               "stage_threads": runs[0].get("stage_threads"),
               "stage_workers": runs[0].get("stage_workers"), "n": len(runs),
               "tokens_per_s": tps, "ms_per_step": _stats([r["ms_per_step"] for r in runs]),
               "peak_rss_mib": _stats([r.get("peak_rss_mib") for r in runs]),
               "ratio_vs_bp": ratios.get((t, label)), "rss_ratio_vs_bp": rss_ratios.get((t, label))}
        if flops:
            row["flops_per_token"] = flops
            row["gflops"] = _stats([flops * r["tokens_per_s"] / 1e9 for r in runs])
            g = (gemm or {}).get(t)
            if g and row["gflops"]:
                row["gemm_peak_gflops"] = g["numba_gflops"]
                row["fraction_of_gemm_peak"] = row["gflops"]["median"] / g["numba_gflops"]
        profs = [r["stage_profile"]["busy_frac"] for r in runs if r.get("stage_profile")]
        if profs:
            row["stage_busy_frac"] = [statistics.median(p[k] for p in profs if p[k] is not None)
                                      for k in range(len(profs[0]))]
        g, W = row["stage_threads"], row["stage_workers"] or len(row["stage_threads"] or [])
        oversub = g and sum(g[:W]) > t  # stage w runs on worker w: the first W groups are the workers'
        row["oversubscribed"] = bool(oversub)
        rows.append(row)
    return rows


def _fmt(x, nd=0):
    if x is None:
        return "–"
    return f"{x:,.{nd}f}"


def markdown(report):
    s = report["settings"]
    m = s["model"]
    lines = [f"## nbrgc-bench: {s['config']} (L{m['n_layer']} d{m['d_model']} H{m['n_head']} "
             f"ctx{m['ctx']}), batch {s['batch']} x seq {s['seq']}, {s['repeats']} round(s) of "
             f"{s['steps']} timed steps after {s['warmup_steps']} warm-up",
             "", f"Machine: {report['machine_line']}", ""]
    lines.append("| threads | mode | stage threads | tokens/s median (min–max) | ms/step | "
                 "peak RSS MiB | GFLOP/s | of GEMM peak | × BP tokens/s, per round: median (min–max) "
                 "| RSS × BP |")
    lines.append("|---:|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in report["summary"]:
        tps, ratio, rss, rr = r["tokens_per_s"], r["ratio_vs_bp"], r["peak_rss_mib"], r["rss_ratio_vs_bp"]
        groups = ",".join(map(str, r["stage_threads"])) if r["stage_threads"] else ""
        if r.get("stage_workers") and r["stage_threads"] and r["stage_workers"] < len(r["stage_threads"]):
            groups += f" on {r['stage_workers']} worker{'s' if r['stage_workers'] > 1 else ''}"
        if r.get("oversubscribed"):
            groups += " (oversubscribed)"
        lines.append(
            f"| {r['threads']} | {r['label']} | {groups} | {_fmt(tps['median'])} ({_fmt(tps['min'])}–"
            f"{_fmt(tps['max'])}) | {_fmt(r['ms_per_step']['median'], 1)} | "
            f"{_fmt(rss and rss['median'])} | {_fmt((r.get('gflops') or {}).get('median'), 2)} | "
            + (f"{100 * r['fraction_of_gemm_peak']:.0f}%" if r.get("fraction_of_gemm_peak") else "–")
            + " | "
            + (f"{ratio['median']:.3f}× ({ratio['min']:.3f}–{ratio['max']:.3f})" if ratio else
               ("1" if r["label"] == BASE else "–"))
            + " | " + (f"{rr['median']:.3f}×" if rr else ("1" if r["label"] == BASE else "–")) + " |")
    lines.append("")
    lines.append(f"FLOPs/token = {report['flops_per_token']:,} ({FLOPS_FORMULA}).")
    if report.get("gemm_peak"):
        for t, g in sorted(report["gemm_peak"].items(), key=lambda kv: int(kv[0])):
            M, K, N = g["shape"]
            lines.append(f"GEMM peak at {M}×{K}×{N} fp32, {t} thread(s): nbrgc Numba path "
                         f"{g['numba_gflops']:.1f} GFLOP/s, np.dot {g['npdot_gflops']:.1f} GFLOP/s.")
    lines.append("Tokens/s: timed steps only (after warm-up, pipeline fill and drain included); peak "
                 "RSS: the worker process's ru_maxrss from the OS (MiB, median over rounds: a run "
                 "that had to compile kernels first peaks higher, and the JSON keeps every run's).")
    for r in report["summary"]:
        if r.get("stage_busy_frac"):
            lines.append(f"{r['label']} at {r['threads']} thread(s), stage busy (share of each stage "
                         "thread's time not spent waiting on a neighbour, median over rounds): "
                         + ", ".join(f"{100 * b:.0f}%" for b in r["stage_busy_frac"]) + ".")
    for n in report.get("notes", []):
        lines.append(f"Note: {n}")
    for prof in report.get("kernel_profile") or []:
        lines += ["", *profile_table(prof)]
    return "\n".join(lines) + "\n"


def profile_table(prof, top=12):
    """Markdown lines for one kernel profile: the ``top`` kernels by time, the rest summed."""
    from .profile import table
    return [f"Per-kernel time of one BP step, {prof['threads']} thread(s), attention probabilities "
            f"{'kept' if prof['attention'] == 'store' else 'recomputed'} (each kernel replayed and "
            f"timed on its own, `nbrgc.profile`; step {prof['step_s'] * 1e3:.1f} ms):", "",
            *table(prof["kernels_s"], top)]


def plot(report, path):
    """Tokens/s by mode (median, min–max bars) per thread count; returns the path or None."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    rows = report["summary"]
    threads = sorted({r["threads"] for r in rows})
    labels = list(dict.fromkeys(r["label"] for r in rows))
    fig, ax = plt.subplots(figsize=(max(5, 1.2 * len(labels) * len(threads)), 3.5))
    w = 0.8 / max(1, len(labels))
    for i, lab in enumerate(labels):
        xs, ys, lo, hi = [], [], [], []
        for j, t in enumerate(threads):
            r = next((r for r in rows if r["label"] == lab and r["threads"] == t), None)
            if r is None:
                continue
            s = r["tokens_per_s"]
            xs.append(j + i * w)
            ys.append(s["median"])
            lo.append(s["median"] - s["min"])
            hi.append(s["max"] - s["median"])
        ax.bar(xs, ys, w, yerr=[lo, hi], capsize=3, label=lab)
    ax.set_xticks([j + w * (len(labels) - 1) / 2 for j in range(len(threads))])
    ax.set_xticklabels([f"{t} thread(s)" for t in threads])
    ax.set_ylabel("tokens/s")
    ax.set_title(f"nbrgc-bench {report['settings']['config']}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


# ---------------------------------------------------------------------------------------------- the bench
def run_bench(config="small", modes=("bp", "rgc-sync", "rgc-async"), threads=(2,), repeats=3,
              warmup_steps=3, steps=20, batch=None, seq=0, n_stages=None, stage_groups=("auto",),
              stage_workers=(0,), max_staleness=1, attention=("store",), dataset="default",
              data_dir=None, seed=0, gemm_peak=False,
              gemm_shape=None, timeout=None, model_overrides=None, log=None, kernel_profile=0):
    """Run the benchmark and return the report dict (``settings``, ``machine``, ``runs`` with every
    raw figure, ``summary`` rows, ``gemm_peak``, ``kernel_profile``, ``notes``). ``kernel_profile``
    > 0 also times one BP step kernel by kernel, averaged over that many steps, in a fresh process
    per thread count and attention setting."""
    from .config import PRESET_BATCH, TrainConfig, preset
    from .machine import describe_machine, machine_line
    from .model import Layout
    from .peers import available
    log = log or (lambda msg: None)
    mcfg = preset(config, **(model_overrides or {}))
    batch = batch if batch is not None else PRESET_BATCH.get(config, 8)
    modes = list(modes)
    for name, v, lo in (("repeats", repeats, 1), ("steps", steps, 1), ("warmup_steps", warmup_steps, 0),
                        ("batch", batch, 1), ("seq", seq, 0), ("kernel_profile", kernel_profile, 0)):
        if not isinstance(v, int) or v < lo:
            raise ConfigError(f"{name.replace('_', '-')} must be an integer >= {lo}, got {v!r}")
    threads = list(threads)
    if not threads or any((not isinstance(t, int)) or t < 1 for t in threads):
        raise ConfigError(f"threads must be integers >= 1, got {threads!r}")
    n_stages = n_stages if n_stages else default_n_stages(mcfg.n_layer)
    notes = []
    if "torch" in modes:
        ok, why = available("torch")
        if not ok:
            modes.remove("torch")
            notes.append(why)
            log(why)
    if not modes:
        raise ConfigError("no mode left to run")
    stage_groups = list(stage_groups) if stage_groups else ["auto"]
    tcs = {}
    for m in modes:
        for _, _, g, w, att in plan_variants([m], stage_groups, stage_workers, attention):
            tc = TrainConfig(mode=m if m != "torch" else "bp", steps=warmup_steps + steps,
                             warmup=max(1, (warmup_steps + steps) // 20), batch=batch, seq=seq,
                             seed=seed, threads=threads[0],
                             n_stages=n_stages if m in ("rgc-sync", "rgc-async") else 1,
                             stage_threads=g, stage_workers=w, max_staleness=max_staleness,
                             attention=att)
            seq_eff = tc.validate_for(mcfg)
            tcs[(m, g, w, att)] = tc
    from .data import load_dataset
    ds = load_dataset(dataset, data_dir=data_dir, log=log, seq=seq_eff)  # downloads/checks once
    if len(ds.train) < seq_eff + 1:
        raise NbrgcError(f"train split of {ds.name} is shorter than one window of {seq_eff}")
    if BASE not in modes:
        notes.append("bp not among --modes: no ratios to BP")
    flops = flops_per_token(mcfg, seq_eff)
    variants = plan_variants(modes, stage_groups, stage_workers, attention)
    machine = describe_machine()
    gemm = {}
    if gemm_peak:
        shape = list(gemm_shape or gemm_shape_for(mcfg, batch, seq_eff))
        for t in threads:
            log(f"GEMM peak, {t} thread(s), shape {shape}")
            gemm[t] = launch({"kind": "gemm", "shape": shape, "threads": t}, timeout=timeout)
    records = []
    order = interleaved(variants, threads, repeats)
    for i, (t, rnd, (label, mode, groups, workers, att)) in enumerate(order):
        tc = tcs[(mode, groups, workers, att)]
        tc_d = dict(tc.to_dict(), threads=t)
        spec = {"kind": "train", "mode": mode, "label": label, "threads": t, "round": rnd,
                "model": mcfg.to_dict(), "train": tc_d, "warmup_steps": warmup_steps, "steps": steps,
                "data": dataset, "data_dir": data_dir,
                "groups": None if groups == "auto" else [int(v) for v in groups.split(",")]}
        log(f"[{i + 1}/{len(order)}] {label}, {t} thread(s), round {rnd + 1}")
        res = launch(spec, timeout=timeout)
        res.update(label=label, round=rnd, threads=t, mode=mode,
                   flops_per_token=flops,
                   executed_flops_per_token=executed_flops_per_token(
                       mcfg, seq_eff, mode, tc.n_stages if mode != "torch" else 1))
        log(f"    {res['tokens_per_s']:,.0f} tokens/s, {res['ms_per_step']:.1f} ms/step, peak RSS "
            f"{res['peak_rss_mib']:.0f} MiB")
        records.append(res)
    profiles = []
    for t in threads if kernel_profile else ():
        for att in attention:
            log(f"kernel profile of a BP step, {t} thread(s), attention {att}")
            profiles.append(launch({"kind": "profile", "model": mcfg.to_dict(), "batch": batch,
                                    "seq": seq_eff, "threads": t, "attention": att, "seed": seed,
                                    "repeats": kernel_profile}, timeout=timeout))
    settings = {"config": config, "model": mcfg.to_dict(), "modes": modes,
                "variants": [v[0] for v in variants], "threads": threads, "repeats": repeats,
                "warmup_steps": warmup_steps, "steps": steps, "batch": batch, "seq": seq_eff,
                "n_stages": n_stages, "stage_groups": stage_groups, "stage_workers": list(stage_workers),
                "attention": list(attention),
                "max_staleness": max_staleness,
                "dataset": dataset, "seed": seed, "order": [[t, r, v[0]] for t, r, v in order],
                "n_params": Layout(mcfg).size, "non_embedding_params": non_embedding_params(mcfg)}
    report = {"settings": settings, "machine": machine, "machine_line": machine_line(machine),
              "flops_formula": FLOPS_FORMULA, "flops_per_token": flops,
              "gemm_peak": {str(t): g for t, g in gemm.items()}, "kernel_profile": profiles,
              "runs": records,
              "summary": aggregate(records, flops, gemm), "notes": notes,
              "method": ("each run in a fresh process, rounds interleaved; timed span: after warm-up "
                         "steps and a drain, from the first timed submit to the end of drain(); "
                         "tokens/s = completed tokens / wall; ratios to BP per round, then median")}
    return report


def write_json(report, path):
    d = os.path.dirname(os.path.abspath(path))
    os.makedirs(d, exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(report, f, indent=1)
    os.replace(tmp, path)
    return path


if __name__ == "__main__":
    sys.exit(worker_main(sys.argv[1:]))
