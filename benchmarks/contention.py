"""BP step time of small models with the machine idle and with busy processes competing for the cores.

    python3 benchmarks/contention.py --out benchmarks/contention.json --md benchmarks/contention.md

One BP step is what ``nbrgc-train --mode bp`` runs per step (loss and gradient, gradient norm,
AdamW), on random bytes, with BLAS pinned to one thread and the calling thread's Numba group set to
``--threads``. "busy N" starts N processes running ``while 1: pass`` before timing and ends them
after. Each cell times steps for ``--seconds`` (at least ``--min-steps``) after ``--warmup`` steps
and reports the mean step (the cell's wall time over its steps: what throughput sees, stalls
included) and the median; cells are interleaved over ``--rounds`` rounds, so a slow minute of the
machine hits every cell alike. ``--label`` names the code measured, so a before/after pair of runs
can go in one file (``--append``).
"""
import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

BUSY = [sys.executable, "-c", "while 1: pass"]


def _step_fn(cfg_name, threads, seed=0):
    import numpy as np

    from nbrgc.config import preset, preset_batch
    from nbrgc.kernels.adamw import sumsq
    from nbrgc.model import Model
    from nbrgc.optim import AdamW
    from nbrgc.threads import limit_blas, set_threads
    limit_blas(1)
    set_threads(threads)
    cfg = preset(cfg_name)
    B, T = preset_batch(cfg_name), cfg.ctx
    model = Model(cfg, seed=seed)
    M, V = np.zeros_like(model.flat), np.zeros_like(model.flat)
    opt = AdamW(model.flat, model.grad_flat, M, V, model.decay_mask, 0, model.layout.size)
    rng = np.random.default_rng(seed)
    x = rng.integers(0, cfg.vocab, (B, T))
    y = rng.integers(0, cfg.vocab, (B, T))

    def step():
        model.loss_and_grad(x, y)
        sumsq(model.grad_flat)
        opt.step(1e-4)
    return step, B * T


def _cell(step, seconds, min_steps, warmup):
    for _ in range(warmup):
        step()
    times = []
    t0 = time.perf_counter()
    while len(times) < min_steps or time.perf_counter() < t0 + seconds:
        t = time.perf_counter()
        step()
        times.append(time.perf_counter() - t)
    return times, time.perf_counter() - t0


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--configs", default="tiny,demo,small")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--busy", default="0,2", help="competing busy processes per condition")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--seconds", type=float, default=3.0)
    p.add_argument("--min-steps", type=int, default=3)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--label", default="")
    p.add_argument("--out", default=None, help="JSON results")
    p.add_argument("--append", action="store_true", help="add to the runs already in --out")
    p.add_argument("--md", default=None, help="markdown table of every run in --out")
    a = p.parse_args(argv)
    import nbrgc  # noqa: F401  (threading layer, cache folder)
    configs = a.configs.split(",")
    busy_counts = [int(b) for b in a.busy.split(",")]
    steps = {c: _step_fn(c, a.threads) for c in configs}
    for c in configs:  # compile (or load) before anything is timed
        steps[c][0]()
    cells = {}
    for r in range(a.rounds):
        for nb in busy_counts:
            procs = [subprocess.Popen(BUSY) for _ in range(nb)]
            try:
                time.sleep(0.2 if nb else 0.0)
                for c in configs:
                    step, tokens = steps[c]
                    t, wall = _cell(step, a.seconds, a.min_steps, a.warmup)
                    t.sort()
                    cells.setdefault((c, nb), {"tokens": tokens, "rounds": []})["rounds"].append(
                        {"mean_step_s": wall / len(t), "median_step_s": statistics.median(t),
                         "p90_step_s": t[int(0.9 * (len(t) - 1))], "max_step_s": t[-1],
                         "steps": len(t)})
                    print(f"round {r} busy {nb} {c}: {wall / len(t) * 1e3:.2f} ms/step mean, "
                          f"{statistics.median(t) * 1e3:.2f} median ({len(t)} steps)",
                          file=sys.stderr, flush=True)
            finally:
                for pr in procs:
                    pr.kill()
                    pr.wait()
    run = {"label": a.label, "threads": a.threads, "command": " ".join([os.path.basename(sys.executable)]
                                                                        + sys.argv),
           "machine": {"cpus": os.cpu_count(), "processor": platform.processor() or platform.machine(),
                       "python": platform.python_version()},
           "cells": [{"config": c, "busy": nb, "tokens_per_step": v["tokens"],
                      "mean_step_s": statistics.median(x["mean_step_s"] for x in v["rounds"]),
                      "median_step_s": statistics.median(x["median_step_s"] for x in v["rounds"]),
                      "rounds": v["rounds"]} for (c, nb), v in cells.items()]}
    runs = []
    if a.out and a.append and os.path.exists(a.out):
        with open(a.out) as f:
            runs = json.load(f)["runs"]
    runs.append(run)
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"runs": runs}, f, indent=1)
            f.write("\n")
    lines = table(runs)
    if a.md:
        with open(a.md, "w") as f:
            f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


def table(runs):
    out = ["| code | config | busy processes | ms/step (mean) | ms/step (median) | tokens/s |",
           "|---|---|---:|---:|---:|---:|"]
    for run in runs:
        for c in run["cells"]:
            s = c["mean_step_s"]
            out.append(f"| {run['label'] or '-'} | {c['config']} | {c['busy']} | {s * 1e3:.2f} | "
                       f"{c['median_step_s'] * 1e3:.2f} | {c['tokens_per_step'] / s:,.0f} |")
    return out


if __name__ == "__main__":
    sys.exit(main())
