"""Pipelined backprop with late gradients on short runs: the zero-delay reference, the delayed
pipeline, and each fix behind its flag, at the same budget, rate and seed.

    python3 benchmarks/pipe_delay.py --runs /tmp/pipe-delay [--shape deep|demo8] [--variants d0,d1,...]

Shapes: ``deep`` (24 x d64, 4 stages of 6 blocks, ctx 128, batch 16: the studies' model) and
``demo8`` (8 x d64, 4 stages of 2 blocks, ctx 64, batch 16: the same question at a fifth of the
cost), both 1 M tokens of enwik8-4M. Each variant is one `bin/nbrgc-train --mode pipe-sync` run in
RUNS/<shape>/<variant> (a finished run is reused, an interrupted one resumed). A variant's
reference is the variant of the same shape with the same flags and no delay (``--boundary-delay
0``, no replay, warm-up or delay rescaling): so each fix is measured against backprop with the same
optimizer, rate and stages. The table goes to benchmarks/pipe-delay.md and the figures to
benchmarks/pipe-delay.json, which keeps the rows of runs made on other machines (each row names
its machine); only the quality columns compare across machines and loads.
"""
import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SHAPES = {
    "deep": dict(
        title="deep (24 × d64, 4 stages of 6 blocks, ctx 128, batch 16), 1 M tokens (489 steps)",
        flags=["--config", "deep", "--eval-every", "61"], marks=(61, 183, 305, 489)),
    "demo8": dict(
        title="demo with 8 layers (8 × d64, 4 stages of 2 blocks, ctx 64, batch 16), 1 M tokens "
              "(977 steps)",
        flags=["--config", "demo", "--n-layer", "8", "--eval-every", "250"],
        marks=(250, 500, 750, 977)),
}
COMMON = ["--mode", "pipe-sync", "--max-staleness", "0", "--tokens", "1000000", "--threads", "1",
          "--eval-batches", "16", "--sample", "0", "--quiet"]
D0, D1 = ["--boundary-delay", "0"], ["--boundary-delay", "1"]
STASH, MUON = ["--replay-weights", "stashed"], ["--optimizer", "muon"]
BP = ["--mode", "bp"]  # after COMMON's --mode pipe-sync: the last one counts
VARIANTS = {  # name: (what, flags)
    "d0": ("no delay (the reference: backprop with per-stage clipping)", D0 + ["--lr", "4e-3"]),
    "d1": ("delay 1 a hop (D = 3, 2, 1, 0), replay on current weights", D1 + ["--lr", "4e-3"]),
    "d1-stash": ("+ stashed weights", D1 + ["--lr", "4e-3"] + STASH),
    "d1-pred": ("+ predicted weights", D1 + ["--lr", "4e-3", "--replay-weights", "predicted"]),
    "d1-mom": ("+ momentum look-ahead", D1 + ["--lr", "4e-3", "--replay-weights", "momentum"]),
    "d1-warm": ("+ no delay for the first 10% of steps", D1 + ["--lr", "4e-3", "--delay-warmup", "49"]),
    "d0-lr1e-3": ("no delay, lr 1e-3", D0 + ["--lr", "1e-3"]),
    "d1-lr1e-3": ("delay 1 a hop, lr 1e-3", D1 + ["--lr", "1e-3"]),
    "d0-b05": ("no delay, AdamW beta1 0.5", D0 + ["--lr", "4e-3", "--beta1", "0.5"]),
    "d1-stash-b05": ("stashed, AdamW beta1 0.5", D1 + ["--lr", "4e-3", "--beta1", "0.5"] + STASH),
    "k2-d0": ("2 stages, no delay", D0 + ["--lr", "4e-3", "--n-stages", "2"]),
    "k2-d1-stash": ("2 stages, delay 1 (D = 1, 0), stashed", D1 + ["--lr", "4e-3", "--n-stages", "2"] + STASH),
    "d0-muon": ("no delay, Muon", D0 + ["--lr", "4e-3"] + MUON),
    "d1-muon": ("delay 1 a hop, Muon", D1 + ["--lr", "4e-3"] + MUON),
    "d1-stash-muon": ("delay 1 a hop, stashed, Muon", D1 + ["--lr", "4e-3"] + STASH + MUON),
    "k2-d0-muon": ("2 stages, no delay, Muon", D0 + ["--lr", "4e-3", "--n-stages", "2"] + MUON),
    "k2-d1-stash-muon": ("2 stages, delay 1, stashed, Muon",
                         D1 + ["--lr", "4e-3", "--n-stages", "2"] + STASH + MUON),
    "d0-muon-m08": ("no delay, Muon, momentum 0.8", D0 + ["--lr", "4e-3"] + MUON + ["--muon-momentum", "0.8"]),
    "d1-stash-muon-m08": ("delay 1 a hop, stashed, Muon, momentum 0.8",
                          D1 + ["--lr", "4e-3"] + STASH + MUON + ["--muon-momentum", "0.8"]),
    "d1-stash-muon-lrp1": ("delay 1 a hop, stashed, Muon, delayed stages at lr/(1+D)",
                           D1 + ["--lr", "4e-3"] + STASH + MUON + ["--delay-lr-power", "1"]),
    "d0-muon-2e-3": ("no delay, Muon, lr 2e-3", D0 + ["--lr", "2e-3"] + MUON),
    "d1-stash-muon-2e-3": ("delay 1 a hop, stashed, Muon, lr 2e-3", D1 + ["--lr", "2e-3"] + STASH + MUON),
    "d0-1e-2": ("no delay, lr 1e-2", D0 + ["--lr", "1e-2"]),
    "d0-muon-1e-2": ("no delay, Muon, lr 1e-2", D0 + ["--lr", "1e-2"] + MUON),
    "d1-stash-muon-1e-2": ("delay 1 a hop, stashed, Muon, lr 1e-2", D1 + ["--lr", "1e-2"] + STASH + MUON),
    # every stage one step late on consistent weights (PipeDream-2BW's numerics): bp --grad-delay 1,
    # against bp with no delay (global clipping: not the per-stage references above)
    "bp": ("bp, no delay", D0 + BP + ["--lr", "4e-3"]),
    "bp-muon": ("bp, no delay, Muon", D0 + BP + ["--lr", "4e-3"] + MUON),
    "bp-g1": ("bp, every gradient one step late", BP + ["--grad-delay", "1", "--lr", "4e-3"]),
    "bp-g1-muon": ("bp, every gradient one step late, Muon", BP + ["--grad-delay", "1", "--lr", "4e-3"] + MUON),
    "bp-muon-2e-3": ("bp, no delay, Muon, lr 2e-3", D0 + BP + ["--lr", "2e-3"] + MUON),
    "bp-g1-muon-2e-3": ("bp, one step late, Muon, lr 2e-3", BP + ["--grad-delay", "1", "--lr", "2e-3"] + MUON),
    "bp-muon-1e-2": ("bp, no delay, Muon, lr 1e-2", D0 + BP + ["--lr", "1e-2"] + MUON),
    "bp-g1-muon-1e-2": ("bp, one step late, Muon, lr 1e-2", BP + ["--grad-delay", "1", "--lr", "1e-2"] + MUON),
    # five times the budget: does the cost of the delay shrink as training goes on?
    "bp-muon-5M": ("bp, no delay, Muon, 5 M tokens", D0 + BP + ["--lr", "4e-3", "--tokens", "5000000"] + MUON),
    "bp-g1-muon-5M": ("bp, one step late, Muon, 5 M tokens",
                      BP + ["--grad-delay", "1", "--lr", "4e-3", "--tokens", "5000000"] + MUON),
}
_DELAY_ONLY = {"--boundary-delay", "--replay-weights", "--delay-warmup", "--delay-lr-power", "--grad-delay"}  # each takes a value


def reference_flags(flags):
    """The flags of a variant's zero-delay reference: the same run with no delay and no fix."""
    out, i = [], 0
    while i < len(flags):
        if flags[i] in _DELAY_ONLY:
            i += 2
            continue
        out.append(flags[i])
        i += 1
    return D0 + out


def summary(run_dir):
    path = os.path.join(run_dir, "log.jsonl")
    if not os.path.exists(path):
        return None, []
    recs = [json.loads(line) for line in open(path) if line.strip()]
    curve = [(r["step"], r["val_bpb"]) for r in recs if "val_bpb" in r and not r.get("summary")]
    done = [r for r in recs if r.get("summary") and r.get("stopped") is None]
    return (done[-1] if done else None), curve


def _stored():
    """{shape: {variant: row}} from pipe-delay.json (its older single-shape form is deep's)."""
    path = os.path.join(HERE, "pipe-delay.json")
    if not os.path.exists(path):
        return {}
    d = json.load(open(path))
    if "shapes" in d:
        return d["shapes"]
    return {"deep": {v: dict(r, machine=d.get("machine")) for v, r in d.get("runs", {}).items()}}


def table(shape, rows):
    marks = SHAPES[shape]["marks"]
    L = [f"## {SHAPES[shape]['title']}", "",
         "enwik8-4M, seed 0, warm-up 5%, cosine; validation bpb of the full network on 16 fixed "
         "batches. Δ: against the variant's zero-delay reference (same optimizer, rate and stages).",
         "", f"    python3 benchmarks/pipe_delay.py --runs RUNS --shape {shape}", "",
         "| variant | flags | val bpb | Δ vs its reference | val bpb at steps "
         + " / ".join(map(str, marks)) + " | machine |", "|---|---|---:|---:|---|---|"]
    by_flags = {tuple(r["flags"]): r for r in rows.values()}
    machines = []
    for v, r in rows.items():
        ref = by_flags.get(tuple(reference_flags(r["flags"])))
        gap = "–" if ref is None else f"{100 * (r['val_bpb'] - ref['val_bpb']) / ref['val_bpb']:+.1f}%"
        pts = {int(s): b for s, b in r["curve"]}
        mid = " / ".join(f"{pts[s]:.3f}" if s in pts else "–" for s in marks)
        m = r.get("machine") or "?"
        if m not in machines:
            machines.append(m)
        L.append(f"| {v}: {r['what']} | `{' '.join(r['flags'])}` | {r['val_bpb']:.4f} | {gap} | {mid} "
                 f"| {machines.index(m) + 1} |")
    L += [""] + [f"Machine {i + 1}: {m}" for i, m in enumerate(machines)]
    return L


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", required=True, help="folder of the run folders")
    p.add_argument("--shape", choices=sorted(SHAPES), default="deep")
    p.add_argument("--variants", default=None, help="comma list (default: every variant)")
    p.add_argument("--dataset", default=os.path.join(ROOT, os.pardir, "shared", "data", "enwik8-4M"))
    p.add_argument("--report-only", action="store_true", help="tabulate what is there, run nothing")
    a = p.parse_args(argv)
    names = [v for v in (a.variants or ",".join(VARIANTS)).split(",") if v]
    bad = [v for v in names if v not in VARIANTS]
    if bad:
        p.error(f"unknown variant {bad[0]!r}; choose from {', '.join(VARIANTS)}")
    from nbrgc.measure.machine import describe_machine, machine_line
    mline = machine_line(describe_machine())
    rows = {}
    for v in names:
        d = os.path.join(a.runs, a.shape, v)
        if not a.report_only and summary(d)[0] is None:
            cmd = [sys.executable, os.path.join(ROOT, "bin", "nbrgc-train"), "--dataset", a.dataset,
                   *SHAPES[a.shape]["flags"], *COMMON, *VARIANTS[v][1], "--out", d]
            cmd += ["--resume"] if os.path.isdir(d) else []
            print("running", a.shape, v, file=sys.stderr)
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        s, curve = summary(d)
        if s is not None:
            rows[v] = {"what": VARIANTS[v][0], "flags": VARIANTS[v][1], "val_bpb": s["val_bpb"],
                       "val_stage_bpb": s.get("val_stage_bpb"), "curve": curve,
                       "peak_rss_mib": s.get("peak_rss_mib"), "machine": mline}
    stored = _stored()  # read now: another shape's invocation may have written meanwhile
    stored.setdefault(a.shape, {}).update(rows)
    order = {v: i for i, v in enumerate(VARIANTS)}
    for shape in stored:
        stored[shape] = dict(sorted(stored[shape].items(), key=lambda kv: order.get(kv[0], 1e9)))
    L = ["# Pipelined backprop with late gradients", ""]
    for shape in sorted(stored, key=lambda s: list(SHAPES).index(s)):
        L += table(shape, stored[shape]) + [""]
    with open(os.path.join(HERE, "pipe-delay.md"), "w") as f:
        f.write("\n".join(L))
    with open(os.path.join(HERE, "pipe-delay.json"), "w") as f:
        json.dump({"common": COMMON, "shapes": stored}, f, indent=1)
    print("\n".join(L))


if __name__ == "__main__":
    sys.path.insert(0, ROOT)
    main()
