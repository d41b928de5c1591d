"""rgc-async against BP as a user runs them: whole nbrgc-train runs with the default evaluation
cadence (every steps/5), side by side in interleaved rounds, each run a fresh process.

Unlike nbrgc-bench (timed steps between warm-up and the end, no evaluation), this includes what a
run pays at its evaluations and checkpoints (rgc-async's freeze its pipeline instead of emptying
it: nbrgc.boundary). The ratio is of the trainer's own tokens/s (training time: steps and pauses,
evaluation excluded) and of the wall time.

    python benchmarks/cadence_speed.py --config small --steps 150 --rounds 3 --out benchmarks/small-cadence
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
from nbrgc.measure.machine import describe_machine, machine_line  # noqa: E402
MODES = ("bp", "rgc-async")


def one_run(config, mode, steps, threads, out, eval_every=None):
    argv = [sys.executable, os.path.join(REPO, "bin", "nbrgc-train"), "--config", config, "--mode", mode,
            "--steps", str(steps), "--threads", str(threads), "--json", "--quiet", "--out", out]
    if eval_every is not None:  # 0: only the final evaluation, what the cadence costs set apart
        argv += ["--eval-every", str(eval_every)]
    p = subprocess.run(argv, capture_output=True, text=True, cwd=REPO)
    if p.returncode != 0:
        sys.exit(f"error: {mode} run failed: {p.stderr.strip().splitlines()[-1:]}")
    recs = [json.loads(x) for x in p.stdout.splitlines() if x.startswith("{")]
    s = [r for r in recs if r.get("summary")][-1]
    return {"tokens_per_s": s["tokens_per_s"], "wall_s": s["wall_s"], "val_bpb": s["val_bpb"],
            "peak_rss_mib": s.get("peak_rss_mib"),
            "evals": sum(1 for r in recs if "val_bpb" in r and not r.get("summary")),
            "stage_busy": s.get("stage_busy_frac"), "stage_wait_s": s.get("stage_wait_s")}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default="small")
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--eval-every", type=int, default=None,
                    help="nbrgc-train's --eval-every (default: its own, steps/5; 0: the final one only)")
    ap.add_argument("--out", required=True, help="path prefix: writes PREFIX.json and PREFIX.md")
    a = ap.parse_args()
    rounds = []
    with tempfile.TemporaryDirectory() as tmp:
        one_run(a.config, "bp", 2, a.threads, os.path.join(tmp, "warm-bp"))  # JIT caches warm
        one_run(a.config, "rgc-async", 2, a.threads, os.path.join(tmp, "warm-rgc"))
        for r in range(a.rounds):
            order = MODES if r % 2 == 0 else MODES[::-1]
            res = {m: one_run(a.config, m, a.steps, a.threads, os.path.join(tmp, f"{m}-{r}"), a.eval_every)
                   for m in order}
            res["ratio_tokens_per_s"] = res["rgc-async"]["tokens_per_s"] / res["bp"]["tokens_per_s"]
            res["ratio_wall"] = res["bp"]["wall_s"] / res["rgc-async"]["wall_s"]
            rounds.append(res)
            print(f"round {r + 1}: bp {res['bp']['tokens_per_s']:.0f}, rgc-async "
                  f"{res['rgc-async']['tokens_per_s']:.0f} tokens/s: {res['ratio_tokens_per_s']:.3f}x",
                  file=sys.stderr)
    med = statistics.median(r["ratio_tokens_per_s"] for r in rounds)
    out = {"config": a.config, "steps": a.steps, "threads": a.threads, "rounds": rounds,
           "median_ratio_tokens_per_s": med,
           "median_ratio_wall": statistics.median(r["ratio_wall"] for r in rounds),
           "eval_every": a.eval_every,
           "command": " ".join(["python", "benchmarks/cadence_speed.py"] + sys.argv[1:]),
           "machine": describe_machine()}
    with open(a.out + ".json", "w") as f:
        json.dump(out, f, indent=1)
    cadence = "the default evaluation cadence" if a.eval_every is None else f"--eval-every {a.eval_every}"
    lines = [f"## rgc-async vs BP with {cadence}: {a.config}, {a.steps} steps, "
             f"{a.threads} threads, {a.rounds} interleaved rounds", "",
             "| round | BP tokens/s | rgc-async tokens/s | ratio | BP wall s | rgc-async wall s | evaluations "
             "| peak RSS MiB (BP / rgc-async) |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for i, r in enumerate(rounds):
        lines.append(f"| {i + 1} | {r['bp']['tokens_per_s']:,.0f} | {r['rgc-async']['tokens_per_s']:,.0f} | "
                     f"{r['ratio_tokens_per_s']:.3f} | {r['bp']['wall_s']:.1f} | {r['rgc-async']['wall_s']:.1f} | "
                     f"{r['bp']['evals']} / {r['rgc-async']['evals']} | "
                     f"{r['bp']['peak_rss_mib']:,.0f} / {r['rgc-async']['peak_rss_mib']:,.0f} |")
    lines += ["", f"median ratio (training tokens/s) {med:.3f}, wall {out['median_ratio_wall']:.3f}.",
              f"Command: `{out['command']}`", "", f"Machine: {machine_line(out['machine'])}", ""]
    with open(a.out + ".md", "w") as f:
        f.write("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
