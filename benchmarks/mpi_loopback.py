"""Loopback throughput of --distributed mpi on this machine: data-parallel BP and RGC stages on 2
and 4 ranks (1 thread each), beside one process at the same total thread budget, interleaved rounds.

    python3 benchmarks/mpi_loopback.py [--presets small,deep] [--steps 30] [--rounds 2]   # IDLE machine

Each figure is the run's own training throughput (the summary line of log.jsonl, ``tokens_per_s``: the first step, which
loads the kernels, and evaluations are not counted). With more ranks than cores the ranks share
cores (oversubscribed): such rows say how the code behaves, not what a cluster would do. Writes
benchmarks/mpi-loopback.json and prints a Markdown table.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def variants(cores):
    # (label, mode, ranks or None for one process, threads per process)
    return [("1 process, bp", "bp", None, cores),
            ("1 process, rgc-async", "rgc-async", None, cores),
            ("mpi 2 ranks, dp-bp", "bp", 2, 1), ("mpi 2 ranks, rgc-async", "rgc-async", 2, 1),
            ("mpi 4 ranks, dp-bp", "bp", 4, 1), ("mpi 4 ranks, rgc-async", "rgc-async", 4, 1)]


def one(preset, mode, ranks, threads, steps, out):
    cmd = [sys.executable, str(ROOT / "bin" / "nbrgc-train"), "--config", preset, "--mode", mode,
           "--steps", str(steps), "--eval-every", str(steps), "--eval-batches", "1", "--quiet",
           "--threads", str(threads), "--out", str(out), "--force"]
    if mode == "rgc-async":
        cmd += ["--n-stages", "4"]
    if ranks:
        mpiexec = shutil.which("mpiexec", path=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
        cmd = [mpiexec, "-n", str(ranks)] + cmd + ["--distributed", "mpi"]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    last = (Path(out) / "log.jsonl").read_text().strip().splitlines()[-1]
    return json.loads(last)["tokens_per_s"]  # the summary line


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--presets", default="small,deep")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()
    cores = len(os.sched_getaffinity(0))
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for preset in a.presets.split(","):
            tps = {v[0]: [] for v in variants(cores)}
            for rnd in range(a.rounds):
                for label, mode, ranks, threads in variants(cores):
                    out = Path(tmp) / f"{preset}-{rnd}-{label.replace(' ', '_').replace(',', '')}"
                    tps[label].append(one(preset, mode, ranks, threads, a.steps, out))
                    print(f"{preset} round {rnd}: {label}: {tps[label][-1]:.0f} tokens/s", flush=True)
            base = statistics.median(tps["1 process, bp"])
            for label, mode, ranks, threads in variants(cores):
                med = statistics.median(tps[label])
                rows.append({"preset": preset, "variant": label, "mode": mode, "ranks": ranks or 1,
                             "threads_per_rank": threads, "cores": cores,
                             "oversubscribed": (ranks or 1) * threads > cores,
                             "tokens_per_s": tps[label], "median": med, "over_1proc_bp": med / base})
    (ROOT / "benchmarks" / "mpi-loopback.json").write_text(json.dumps(
        {"command": "python3 benchmarks/mpi_loopback.py " + " ".join(sys.argv[1:]), "steps": a.steps,
         "rounds": a.rounds, "rows": rows}, indent=1))
    print("| preset | run | ranks × threads | tokens/s (median) | ÷ 1-process bp |")
    print("|---|---|---|---:|---:|")
    for r in rows:
        over = " (oversubscribed)" if r["oversubscribed"] else ""
        print(f"| {r['preset']} | {r['variant']} | {r['ranks']} × {r['threads_per_rank']}{over} | "
              f"{r['median']:,.0f} | {r['over_1proc_bp']:.2f} |")


if __name__ == "__main__":
    main()
