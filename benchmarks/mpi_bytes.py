"""Bytes each rank sends per training step under --distributed mpi, counted by the instrumented
sends of nbrgc.distributed.link (OUT/mpi.json of each run), for data-parallel BP and RGC stages on
ranks, at 2 and 4 ranks, for the small, paper and deep presets.

    python3 benchmarks/mpi_bytes.py [--presets small,deep,paper] [--steps 2]

Counting needs no quiet machine (bytes do not depend on timing); the runs are short. Writes
benchmarks/mpi-bytes.json and prints a Markdown table.
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
    out = Path(tmp) / f"{preset}-{mode}-{ranks}"
    mpiexec = shutil.which("mpiexec", path=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
    cmd = [mpiexec, "-n", str(ranks), sys.executable, str(ROOT / "bin" / "nbrgc-train"), "--config", preset,
           "--mode", mode, "--steps", str(steps), "--eval-batches", "1", "--quiet", "--distributed", "mpi",
           "--threads", "1", "--out", str(out), "--force"]
    if mode == "rgc-async":
        cmd += ["--n-stages", "4"]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    return json.loads((out / "mpi.json").read_text())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--presets", default="small,deep,paper")
    ap.add_argument("--steps", type=int, default=2)
    a = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for preset in a.presets.split(","):
            for mode in ("bp", "rgc-async"):
                for ranks in (2, 4):
                    rep = one(preset, mode, ranks, a.steps, tmp)
                    per = rep["bytes_sent_per_step"]
                    rows.append({"preset": preset, "mode": mode, "ranks": ranks,
                                 "per_rank": per, "max_rank_total": max(sum(d.values()) for d in per)})
                    print(json.dumps(rows[-1]), flush=True)
    (ROOT / "benchmarks" / "mpi-bytes.json").write_text(json.dumps(rows, indent=1))
    print("| preset | mode | ranks | busiest rank's bytes/step | per rank (kind: bytes) |")
    print("|---|---|---:|---:|---|")
    for r in rows:
        per = "; ".join(f"r{i} " + ", ".join(f"{k} {v:,.0f}" for k, v in sorted(d.items()))
                        for i, d in enumerate(r["per_rank"]))
        print(f"| {r['preset']} | {r['mode']} | {r['ranks']} | {r['max_rank_total']:,.0f} | {per} |")


if __name__ == "__main__":
    main()
