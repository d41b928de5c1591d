"""Pipelined backprop with late gradients on a short `deep` run: the zero-delay reference, the delayed
pipeline, and each fix behind its flag, at the same budget, rate and seed.

    python3 benchmarks/pipe_delay.py --runs /tmp/pipe-delay [--variants d0,d1,...] [--jobs 1]

Each variant is one `bin/nbrgc-train --mode pipe-sync` run in RUNS/<variant> (a finished run is
reused, an interrupted one resumed); the table goes to benchmarks/pipe-delay.md and the figures to
benchmarks/pipe-delay.json. Only the quality columns compare across machines and loads; the runs
may share the machine.
"""
import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
COMMON = ["--config", "deep", "--mode", "pipe-sync", "--max-staleness", "0", "--tokens", "1000000",
          "--threads", "1", "--eval-every", "61", "--eval-batches", "16", "--sample", "0", "--quiet"]
VARIANTS = {  # name: (what, flags); the reference is d0 at the same rate
    "d0": ("no delay (the reference: backprop with per-stage clipping)", ["--boundary-delay", "0", "--lr", "4e-3"]),
    "d1": ("delay 1 a hop (D = 3, 2, 1, 0), replay on current weights", ["--boundary-delay", "1", "--lr", "4e-3"]),
    "d1-stash": ("+ stashed weights", ["--boundary-delay", "1", "--lr", "4e-3", "--replay-weights", "stashed"]),
    "d1-pred": ("+ predicted weights", ["--boundary-delay", "1", "--lr", "4e-3", "--replay-weights", "predicted"]),
    "d1-warm": ("+ no delay for the first 10% of steps", ["--boundary-delay", "1", "--lr", "4e-3", "--delay-warmup", "49"]),
    "d1-warm122": ("+ no delay for the first 25% of steps", ["--boundary-delay", "1", "--lr", "4e-3", "--delay-warmup", "122"]),
    "d1-stash-warm": ("+ stashed weights + no delay for the first 10%", ["--boundary-delay", "1", "--lr", "4e-3", "--replay-weights", "stashed", "--delay-warmup", "49"]),
    "d0-lr1e-3": ("no delay, lr 1e-3", ["--boundary-delay", "0", "--lr", "1e-3"]),
    "d1-lr1e-3": ("delay 1 a hop, lr 1e-3", ["--boundary-delay", "1", "--lr", "1e-3"]),
    "d1-stash-lr1e-3": ("delay 1 a hop, stashed weights, lr 1e-3",
                        ["--boundary-delay", "1", "--lr", "1e-3", "--replay-weights", "stashed"]),
}


def summary(run_dir):
    path = os.path.join(run_dir, "log.jsonl")
    if not os.path.exists(path):
        return None, []
    recs = [json.loads(line) for line in open(path) if line.strip()]
    curve = [(r["step"], r["val_bpb"]) for r in recs if "val_bpb" in r and not r.get("summary")]
    done = [r for r in recs if r.get("summary") and r.get("stopped") is None]
    return (done[-1] if done else None), curve


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", required=True, help="folder of the run folders")
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--dataset", default=os.path.join(ROOT, os.pardir, "shared", "data", "enwik8-4M"))
    p.add_argument("--report-only", action="store_true", help="tabulate what is there, run nothing")
    a = p.parse_args(argv)
    names = [v for v in a.variants.split(",") if v]
    for v in names:
        d = os.path.join(a.runs, v)
        if a.report_only or summary(d)[0] is not None:
            continue
        cmd = [sys.executable, os.path.join(ROOT, "bin", "nbrgc-train"), "--dataset", a.dataset,
               *COMMON, *VARIANTS[v][1], "--out", d] + (["--resume"] if os.path.isdir(d) else [])
        print("running", v, file=sys.stderr)
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    rows = {}
    for v in names:
        s, curve = summary(os.path.join(a.runs, v))
        if s is not None:
            rows[v] = {"what": VARIANTS[v][0], "flags": VARIANTS[v][1], "val_bpb": s["val_bpb"],
                       "val_stage_bpb": s.get("val_stage_bpb"), "curve": curve,
                       "peak_rss_mib": s.get("peak_rss_mib")}
    ref = {"4e-3": rows.get("d0", {}).get("val_bpb"), "1e-3": rows.get("d0-lr1e-3", {}).get("val_bpb")}
    from nbrgc.measure.machine import describe_machine, machine_line
    mline = machine_line(describe_machine())
    L = ["## Pipelined backprop with late gradients: deep, 1 M tokens", "",
         "`deep` (24 × d64, 4 stages of 6 blocks) on enwik8-4M, 1,001,472 tokens (489 steps × 16 × 128), "
         "seed 0, warm-up 5%, cosine; validation bpb of the full network on 16 fixed batches. "
         "Δ: against the zero-delay run at the same rate.", "", f"Machine: {mline}", "",
         "    python3 benchmarks/pipe_delay.py --runs RUNS", "",
         "| variant | flags | val bpb | Δ vs no delay | val bpb at steps 61 / 183 / 305 / 489 |",
         "|---|---|---:|---:|---|"]
    for v, r in rows.items():
        lr = r["flags"][r["flags"].index("--lr") + 1]
        base = ref.get(lr)
        gap = "–" if not base else f"{100 * (r['val_bpb'] - base) / base:+.1f}%"
        pts = dict(r["curve"])
        mid = " / ".join(f"{pts[s]:.3f}" if s in pts else "–" for s in (61, 183, 305, 489))
        L.append(f"| {v}: {r['what']} | `{' '.join(r['flags'])}` | {r['val_bpb']:.4f} | {gap} | {mid} |")
    with open(os.path.join(HERE, "pipe-delay.md"), "w") as f:
        f.write("\n".join(L) + "\n")
    with open(os.path.join(HERE, "pipe-delay.json"), "w") as f:
        json.dump({"machine": mline, "common": COMMON, "runs": rows}, f, indent=1)
    print("\n".join(L))


if __name__ == "__main__":
    sys.path.insert(0, ROOT)
    main()
