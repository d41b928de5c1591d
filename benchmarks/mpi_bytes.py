"""Bytes each rank sends per training step under --distributed mpi, counted by the instrumented
sends of nbrgc.distributed.link (OUT/mpi.json of each run), for data-parallel BP, RGC stages on
ranks and pipelined backprop (pipe-async) stages on ranks, at 2 and 4 ranks, for the small, paper
and deep presets.

    python3 benchmarks/mpi_bytes.py [--presets small,deep,paper] [--modes bp,rgc-async,pipe-async] [--steps 4]

Counting needs no quiet machine (bytes do not depend on timing); the runs are short. Updates the
rows it counted in benchmarks/mpi-bytes.json (keeping the others) and prints a Markdown table of all.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def one(preset, mode, ranks, steps, tmp):
    out = Path(tmp) / f"{preset}-{mode}-{ranks}-{steps}"
    mpiexec = shutil.which("mpiexec", path=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
    cmd = [mpiexec, "-n", str(ranks), sys.executable, str(ROOT / "bin" / "nbrgc-train"), "--config", preset,
           "--mode", mode, "--steps", str(steps), "--eval-batches", "1", "--quiet", "--distributed", "mpi",
           "--threads", "1", "--out", str(out), "--force"]
    if mode != "bp":
        cmd += ["--n-stages", "4"]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    return json.loads((out / "mpi.json").read_text())


def steady(preset, mode, ranks, steps, tmp, extra=4):
    """Per rank, bytes by kind per step once the pipeline is full: the difference of the totals of a
    run of ``steps`` and one of ``steps + extra`` steps, over ``extra`` (pipe-async's messages start
    only when the first boundary gradient comes back, D_k steps in; pauses are counted apart)."""
    short, long = (one(preset, mode, ranks, n, tmp)["bytes_sent"] for n in (steps, steps + extra))
    return [{k: (b.get(k, 0) - a.get(k, 0)) / extra for k in b if k != "pause"}
            for a, b in zip(short, long)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--presets", default="small,deep,paper")
    ap.add_argument("--modes", default="bp,rgc-async,pipe-async")
    ap.add_argument("--steps", type=int, default=4, help="the shorter run's steps (at least the "
                    "pipeline's depth: the longer run has 4 more)")
    a = ap.parse_args()
    path = ROOT / "benchmarks" / "mpi-bytes.json"
    rows = json.loads(path.read_text()) if path.exists() else []
    with tempfile.TemporaryDirectory() as tmp:
        for preset in a.presets.split(","):
            for mode in a.modes.split(","):
                for ranks in (2, 4):
                    per = steady(preset, mode, ranks, a.steps, tmp)
                    row = {"preset": preset, "mode": mode, "ranks": ranks, "per_rank": per,
                           "max_rank_total": max(sum(d.values()) for d in per)}
                    rows = [r for r in rows if (r["preset"], r["mode"], r["ranks"]) != (preset, mode, ranks)]
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    path.write_text(json.dumps(rows, indent=1))
    print("| preset | mode | ranks | busiest rank's bytes/step | per rank (kind: bytes) |")
    print("|---|---|---:|---:|---|")
    for r in rows:
        per = "; ".join(f"r{i} " + ", ".join(f"{k} {v:,.0f}" for k, v in sorted(d.items()))
                        for i, d in enumerate(r["per_rank"]))
        print(f"| {r['preset']} | {r['mode']} | {r['ranks']} | {r['max_rank_total']:,.0f} | {per} |")


if __name__ == "__main__":
    main()
