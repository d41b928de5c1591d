"""Throughput against link bandwidth and rank count for RGC stages on ranks vs data-parallel BP,
from measured compute times and the counted bytes of benchmarks/mpi-bytes.json.

    python3 benchmarks/mpi_model.py --presets small,deep,paper --threads 2   # on an IDLE machine

It times kernels: run it on an idle machine. It writes benchmarks/mpi-model.json and mpi-model.png and prints
the table for 1, 10 and 100 Gb/s (--from-json: the same from the times already measured).

The model (one rank per machine, --threads each):
* DP-BP over R ranks: t = T_bp(B / R) + A_R / bw, where T_bp(b) is one BP step at batch b
  (timed) and A_R the busiest rank's counted all-reduce bytes per step (not overlapped: the step
  needs the summed gradient).
* RGC over R ranks (n_stages / R consecutive stages each) at staleness S:
  t = max(T_rank, (X + C) / bw, (R T_rank + (R - 1) X / bw + C / bw) / (S + 1)),
  T_rank the busiest rank's stage steps (forward, local loss, backward, own AdamW; timed), X its
  activation bytes and C its consensus bytes (counted). The first two terms: sends overlap compute,
  so the slower sets the pace. The third is the pipeline's own limit: step t of rank 0 reads decoder
  version t - S, which exists once the last rank has finished step t - S - 1, so only S + 1 steps
  are in flight along a chain of R rank steps and R - 1 activation transfers. With S + 1 < R the
  ranks take turns (S = 1 on 4 ranks: half of them idle); S >= R - 1 lets every rank work at once,
  at a staleness whose quality cost the study has not measured (it runs S = 1).
Latency is left out (it is microseconds against steps of milliseconds to seconds).
"""
import argparse
import itertools
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def timed(fn, reps=3):
    fn()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t0) / reps


def measure(preset, threads, ranks, n_stages=4):
    """Seconds per step: BP (gradient and AdamW over every parameter) at each rank's share of the
    batch, and RGC's busiest rank holding n_stages / R consecutive stages, each stage timed as it
    trains (its blocks forward, its own readout through the decoder, its backward, its AdamW)."""
    import nbrgc
    from nbrgc.config import preset_batch
    from nbrgc.local import split_stages, stage_backward, stage_param_ranges
    from nbrgc.optim import AdamW
    from nbrgc.threads import limit_blas, set_threads
    limit_blas(1)
    set_threads(threads)
    cfg = nbrgc.preset(preset)
    B, T = preset_batch(preset), cfg.ctx
    m = nbrgc.Model(cfg, seed=0)
    M, V = np.zeros_like(m.flat), np.zeros_like(m.flat)
    mask = m.layout.decay_mask()
    x = np.zeros((B, T), np.int32)
    lo_d, hi_d = m.layout.decoder_range
    gdec = np.zeros(hi_d - lo_d, m.dtype)
    stages = split_stages(cfg.n_layer, n_stages)
    pranges = stage_param_ranges(m.layout, stages)
    ws = m.workspace(B, T, 0, stages[0][1] - stages[0][0])
    h_in = m.embed(x, ws).copy()

    def stage_step(k):
        lo, hi = stages[k]
        h = m.embed(x, ws) if k == 0 else h_in
        out = m.forward_blocks(h, lo, hi, ws)
        stage_backward(m, ws, k, lo, hi, out, x, gdec)
        AdamW(m.flat, m.grad_flat, M, V, mask, *pranges[k]).step(1e-9)
    per_stage = [timed(lambda k=k: stage_step(k)) for k in range(n_stages)]
    full = AdamW(m.flat, m.grad_flat, M, V, mask, 0, m.flat.size)
    out = {"bp_step_s": {}, "stage_step_s": {}, "per_stage_s": per_stage}
    for R in ranks:
        b = max(1, B // R)

        def bp_step():
            m.loss_and_grad(x[:b], x[:b])
            full.step(1e-9)
        out["bp_step_s"][R] = timed(bp_step)
        per = n_stages // R
        out["stage_step_s"][R] = max(sum(per_stage[r * per:(r + 1) * per]) for r in range(R))
    return B * T, out


def rgc_step_s(T_rank, X, C, R, S, bw):
    return max(T_rank, (X + C) / bw, (R * T_rank + (R - 1) * X / bw + C / bw) / (S + 1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--presets", default="small,deep,paper")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--from-json", action="store_true",
                    help="rebuild the table from the compute times already in mpi-model.json")
    a = ap.parse_args()
    counted = json.loads((ROOT / "benchmarks" / "mpi-bytes.json").read_text())
    out_path = ROOT / "benchmarks" / "mpi-model.json"
    timed_before = {}
    if a.from_json:
        old = json.loads(out_path.read_text())
        for r in (old["rows"] if isinstance(old, dict) else old):
            timed_before[r["preset"]] = (r.get("tokens_per_step"), {
                "bp_step_s": {int(k): v for k, v in r["bp_step_s"].items()},
                "stage_step_s": {int(k): v for k, v in r["stage_step_s"].items()},
                "per_stage_s": r["per_stage_s"]})
    rows = []
    for preset in a.presets.split(","):
        ranks = sorted({r["ranks"] for r in counted if r["preset"] == preset})
        if a.from_json:
            tokens, t = timed_before[preset]
            if tokens is None:
                import nbrgc
                from nbrgc.config import preset_batch
                tokens = preset_batch(preset) * nbrgc.preset(preset).ctx
        else:
            tokens, t = measure(preset, a.threads, ranks)
        for R in ranks:
            by = {r["mode"]: r for r in counted if r["preset"] == preset and r["ranks"] == R}
            busiest = max(by["rgc-async"]["per_rank"], key=lambda d: sum(d.values()))
            X = busiest.get("activations", 0.0)
            C = busiest.get("consensus", 0.0) + busiest.get("control", 0.0)
            for gbps in (1, 10, 100):
                bw = gbps * 1e9 / 8
                t_bp = t["bp_step_s"][R] + by["bp"]["max_rank_total"] / bw
                for S in sorted({1, R - 1}):
                    t_rgc = rgc_step_s(t["stage_step_s"][R], X, C, R, S, bw)
                    rows.append({"preset": preset, "ranks": R, "gbps": gbps, "staleness": S,
                                 "tokens_per_step": tokens, "bp_tokens_per_s": tokens / t_bp,
                                 "rgc_tokens_per_s": tokens / t_rgc, "rgc_over_bp": t_bp / t_rgc, **t})
    out_path.write_text(json.dumps({"command": "python3 benchmarks/mpi_model.py " + " ".join(sys.argv[1:]),
                                    "threads": a.threads, "rows": rows}, indent=1))
    print("| preset | ranks | link | DP-BP tokens/s | RGC S=1 tokens/s | RGC ÷ DP-BP (S=1) "
          "| RGC S=R-1 tokens/s | RGC ÷ DP-BP (S=R-1) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for (preset, R, g), grp in itertools.groupby(rows, key=lambda r: (r["preset"], r["ranks"], r["gbps"])):
        grp = {r["staleness"]: r for r in grp}
        s1, sr = grp[1], grp[max(grp)]
        print(f"| {preset} | {R} | {g} Gb/s | {s1['bp_tokens_per_s']:,.0f} | {s1['rgc_tokens_per_s']:,.0f} | "
              f"{s1['rgc_over_bp']:.2f}× | {sr['rgc_tokens_per_s']:,.0f} | {sr['rgc_over_bp']:.2f}× |")
    plot(rows, ROOT / "benchmarks" / "mpi-model.png")


def plot(rows, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib missing (pip install -e '.[plot]'): no plot", file=sys.stderr)
        return
    presets = list(dict.fromkeys(r["preset"] for r in rows))
    fig, axes = plt.subplots(1, len(presets), figsize=(4.2 * len(presets), 3.4), squeeze=False)
    for ax, preset in zip(axes[0], presets):
        mine = [r for r in rows if r["preset"] == preset]
        for R in sorted({r["ranks"] for r in mine}):
            pts = [r for r in mine if r["ranks"] == R and r["staleness"] == 1]
            g = [r["gbps"] for r in pts]
            ax.plot(g, [r["bp_tokens_per_s"] for r in pts], "o--", label=f"DP-BP, {R} ranks")
            ax.plot(g, [r["rgc_tokens_per_s"] for r in pts], "s-", label=f"RGC S=1, {R} ranks")
            if R - 1 > 1:
                pts = [r for r in mine if r["ranks"] == R and r["staleness"] == R - 1]
                ax.plot(g, [r["rgc_tokens_per_s"] for r in pts], "^:", label=f"RGC S={R - 1}, {R} ranks")
        ax.set_xscale("log")
        ax.set_xlabel("link bandwidth (Gb/s)")
        ax.set_title(preset)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("tokens/s (model)")
    axes[0][-1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
