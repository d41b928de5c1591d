"""Throughput against link bandwidth and rank count for RGC stages on ranks vs data-parallel BP,
from measured compute times and the counted bytes of benchmarks/mpi-bytes.json.

    python3 benchmarks/mpi_model.py --presets small,deep,paper --threads 2   # on an IDLE machine

NOT RUN YET: it times kernels, and the machine was busy with other measurements when it was
written. It writes benchmarks/mpi-model.json and prints the table for 1, 10 and 100 Gb/s.

The model (one rank per machine, --threads each):
* DP-BP over R ranks: t = T_bp(B / R) + A_R / bw, where T_bp(b) is one BP step at batch b
  (timed) and A_R the busiest rank's counted all-reduce bytes per step (not overlapped: the step
  needs the summed gradient).
* RGC over K ranks (one stage each, S >= 1): t = max(T_stage, (X + C_K) / bw), where T_stage is the
  slowest stage's step (forward, local loss, backward, own AdamW; timed) and X + C_K the busiest
  rank's counted activation and consensus bytes: with S >= 1 the sends overlap the next step's
  compute, so the slower of the two sets the pace.
Latency is left out (it is microseconds against steps of milliseconds to seconds).
"""
import argparse
import json
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


def measure(preset, threads, ranks):
    import nbrgc
    from nbrgc.config import PRESET_BATCH
    from nbrgc.local import split_stages
    from nbrgc.threads import limit_blas, set_threads
    limit_blas(1)
    set_threads(threads)
    cfg = nbrgc.preset(preset)
    B, T = PRESET_BATCH[preset], cfg.ctx
    m = nbrgc.Model(cfg, seed=0)
    x = np.zeros((B, T), np.int32)
    out = {"bp_step_s": {}, "stage_step_s": {}}
    for R in ranks:
        b = max(1, B // R)
        out["bp_step_s"][R] = timed(lambda: m.loss_and_grad(x[:b], x[:b]))
        lo, hi = split_stages(cfg.n_layer, R)[-1]
        ws = m.workspace(B, T, lo, hi)
        gdec = np.zeros(m.layout.decoder_range[1] - m.layout.decoder_range[0], m.dtype)

        def stage():
            h = m.forward_blocks(m.embed(x, ws), lo, hi, ws)
            _, dh = m.decoder_loss_and_grad(h, x, ws, gdec=gdec)
            m.backward_blocks(dh, lo, hi, ws)
        out["stage_step_s"][R] = timed(stage)
    return B * T, out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--presets", default="small,deep,paper")
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    counted = json.loads((ROOT / "benchmarks" / "mpi-bytes.json").read_text())
    rows = []
    for preset in a.presets.split(","):
        ranks = sorted({r["ranks"] for r in counted if r["preset"] == preset})
        tokens, t = measure(preset, a.threads, ranks)
        for R in ranks:
            by = {r["mode"]: r for r in counted if r["preset"] == preset and r["ranks"] == R}
            for gbps in (1, 10, 100):
                bw = gbps * 1e9 / 8
                t_bp = t["bp_step_s"][R] + by["bp"]["max_rank_total"] / bw
                t_rgc = max(t["stage_step_s"][R], by["rgc-async"]["max_rank_total"] / bw)
                rows.append({"preset": preset, "ranks": R, "gbps": gbps, "bp_tokens_per_s": tokens / t_bp,
                             "rgc_tokens_per_s": tokens / t_rgc, "rgc_over_bp": t_bp / t_rgc, **t})
                print(json.dumps(rows[-1]), flush=True)
    (ROOT / "benchmarks" / "mpi-model.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
