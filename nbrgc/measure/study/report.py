"""What a study reports: study.json (the shape below), study.md and curves.png, rebuilt from the
result files after every finished run, so a partial study is always readable.

study.json: ``{"dataset", "config": {...}, "tokens_per_run", "seeds", "code_version",
"arms": {arm: {"lr", "test_bpb": [per seed, null where missing], "curve": {"tokens": [...],
"val_bpb": [[...] per seed]}, "sweep": {...}, ...}}, "convergence": {"bp_last20_rel_improvement",
...}, "verdicts": {arm: {"mean_gap", "t_lower", "t_upper", "margin", "noninferior", ...}}, ...}``.

Verdicts: per paired seed the gap is ``(test_bpb_arm - test_bpb_ref) / test_bpb_ref``, ``ref`` the
arm's reference (:func:`nbrgc.measure.study.arms.reference_of`: BP with the same optimizer); the two-sided
95% Student-t interval of the mean gap over the paired seeds decides (non-inferior iff its upper
bound is below the margin); the paired bootstrap is reported alongside. Convergence: for every bp
seed, ``(v80 - v_end) / v80`` with ``v80`` the validation bpb at 80% of the run (linear
interpolation between evaluations) and ``v_end`` the final one; their mean must be below 0.01.
"""
import math
import os
import statistics

from ...atomic import write_json, write_text
from ..machine import machine_key
from .arms import ARMS, BASE, CROSSES, DIAGNOSTIC, reference_of
from .plan import SWEEP_SEED

REPORT_FILE, MARKDOWN_FILE, CURVES_FILE = "study.json", "study.md", "curves.png"
CONVERGED_BELOW = 0.01


def _num(x):
    return None if x is None or (isinstance(x, float) and not math.isfinite(x)) else x


def _label(rep, m):
    """The short name of machine line ``m`` in study.md: M1, M2, ... in the order of "Runs made on"."""
    order = list(rep.get("run_machines", {}))
    return f"M{order.index(m) + 1}" if m in order else "–"


def _speed_machine(speeds):
    """The machine the throughput column compares arms on: the one with the most finished main
    runs (tokens/s differ between machine kinds by more than between arms, so a mean over
    machines would compare the machines)."""
    count = {}
    for by in speeds.values():
        for m, v in by.items():
            count[m] = count.get(m, 0) + len(v)
    return max(count, key=count.get) if count else None


def value_at(tokens, vals, at):
    """The curve's value at ``at`` tokens: linear between the evaluations around it (the first
    evaluation when ``at`` comes before it)."""
    if not tokens:
        return None
    if at <= tokens[0]:
        return vals[0]
    for (t0, v0), (t1, v1) in zip(zip(tokens, vals), zip(tokens[1:], vals[1:])):
        if t0 <= at <= t1:
            return v0 + (v1 - v0) * (at - t0) / (t1 - t0) if t1 > t0 else v1
    return vals[-1]


def last20_rel_improvement(tokens, vals, frac=0.8):
    """(v(frac * end) - v(end)) / v(frac * end) of one curve (positive: still improving)."""
    if len(tokens) < 2:
        return None
    v80 = value_at(tokens, vals, frac * tokens[-1])
    return (v80 - vals[-1]) / v80


def convergence(curves):
    """``curves``: bp's [(tokens, vals)] per finished seed."""
    per = [last20_rel_improvement(t, v) for t, v in curves]
    per = [p for p in per if p is not None]
    mean = sum(per) / len(per) if per else None
    ok = mean is not None and mean < CONVERGED_BELOW
    note = ("no finished bp main run yet" if mean is None else
            f"converged: bp improved {100 * mean:.2f}% over the last 20% of its run (< 1%)" if ok else
            f"not converged: bp still improved {100 * mean:.2f}% over the last 20% of its run "
            "(>= 1%): lengthen the runs (--tokens)")
    return {"bp_last20_rel_improvement": mean, "per_seed": per, "seeds": len(per),
            "threshold": CONVERGED_BELOW, "converged": ok, "note": note}


def _ref(arm, present):
    """``arm``'s reference among the arms ``present`` (the base where its own is missing)."""
    ref = reference_of(arm)
    return ref if ref in present else BASE


def verdicts(test_bpb, seeds, margin, conf, n_boot):
    """{arm: verdict} from {arm: [test bpb per seed or None]}, each arm against its reference."""
    from ..stats import noninferiority
    out = {}
    for arm, vals in test_bpb.items():
        if arm == BASE:
            continue
        ref = _ref(arm, test_bpb)
        paired = [s for s, a, b in zip(seeds, vals, test_bpb[ref]) if a is not None and b is not None]
        base = {"reference": ref, "margin": margin, "conf": conf, "n_paired": len(paired),
                "seeds": paired}
        if not paired:
            out[arm] = dict(base, mean_gap=None, t_lower=None, t_upper=None, noninferior=False,
                            gaps=[], boot_lower=None, boot_upper=None, verdict="no paired seeds yet")
            continue
        bp = [test_bpb[ref][seeds.index(s)] for s in paired]
        rg = [vals[seeds.index(s)] for s in paired]
        r = noninferiority(bp, rg, margin=margin, conf=conf, n_boot=n_boot, seed=0)
        out[arm] = dict(base, mean_gap=r["mean_gap"], t_lower=_num(r["t_lo"]), t_upper=_num(r["t_hi"]),
                        noninferior=r["non_inferior"], gaps=r["gaps"], boot_lower=_num(r["boot_lo"]),
                        boot_upper=_num(r["boot_hi"]),
                        verdict=r["verdict"] + f" ({len(paired)} of {len(seeds)} seeds paired)")
    return out


def build(st, computed=()):
    """The study.json dict of Study ``st`` from the result files there now."""
    from ..machine import describe_machine, machine_line
    arms, seeds = {}, st.seeds
    n_done = n_known = 0
    test_bpb = {}
    bp_curves = []
    sweep_lrs = set()
    run_machines = {}  # machine line -> runs reported made on it
    speeds = {}  # arm -> machine line -> training tokens/s of its finished main runs

    def seen(r):
        m = machine_key(r.get("machine"))
        run_machines[m] = run_machines.get(m, 0) + 1
        return m

    for arm in st.arms:
        grid, res, best, at_edge = st.sweep_state(arm)
        for r in res.values():
            if r is not None:
                seen(r)
        sweep_lrs.update(grid)
        n_known += len(grid)
        n_done += sum(1 for r in res.values() if r is not None)
        sweep = {"lrs": grid, "val_bpb": [_num(r["val_bpb"]) if r else None for r in res.values()],
                 "diverged": [bool(r and r["diverged"]) for r in res.values()],
                 "best_lr": best, "at_edge": bool(at_edge), "complete": best is not None}
        entry = {"lr": best, "overrides": ARMS[arm], "code_version": st.fingerprints.get(arm),
                 "test_bpb": [None] * len(seeds), "val_bpb": [None] * len(seeds),
                 "val_stage_bpb": [None] * len(seeds), "curve": {"tokens": [], "val_bpb": []},
                 "train_tokens_per_s": None, "peak_rss_mib": None, "crosses": CROSSES[arm],
                 "sweep": sweep}
        curves, rss = [None] * len(seeds), []
        if best is not None:
            n_known += len(seeds)
            for i, s in enumerate(seeds):
                r = st.result(st.task("main", arm, s, best))
                if r is None:
                    continue
                n_done += 1
                m = seen(r)
                entry["test_bpb"][i] = _num(r["test_bpb"])
                entry["val_bpb"][i] = _num(r["val_bpb"])
                entry["val_stage_bpb"][i] = r.get("val_stage_bpb")
                curves[i] = r["curve"]
                if r.get("train_tokens_per_s"):
                    speeds.setdefault(arm, {}).setdefault(m, []).append(
                        r["train_tokens_per_s"])
                if r.get("peak_rss_mib"):
                    rss.append(r["peak_rss_mib"])
        toks = next(([p[1] for p in c] for c in curves if c), [])
        entry["curve"] = {"tokens": toks,
                          "val_bpb": [[p[2] for p in c] if c else None for c in curves]}
        entry["peak_rss_mib"] = float(statistics.median(rss)) if rss else None
        entry["peak_rss_mib_max"] = max(rss) if rss else None
        if arm == BASE:
            bp_curves = [([p[1] for p in c], [p[2] for p in c]) for c in curves if c]
        test_bpb[arm] = entry["test_bpb"]
        arms[arm] = entry
    speed_machine = _speed_machine(speeds)
    for arm, entry in arms.items():
        by = speeds.get(arm, {})
        entry["train_tokens_per_s_by_machine"] = {
            m: {"median": float(statistics.median(v)), "n": len(v)} for m, v in by.items()}
        on = by.get(speed_machine)
        entry["train_tokens_per_s"] = float(statistics.median(on)) if on else None
    machine = describe_machine()
    cfg = dict(st.mcfg.to_dict(), preset=st.config, batch=st.batch, seq=st.seq,
               n_stages=st.base["n_stages"], steps=st.steps, eval_every=st.eval_every,
               eval_batches=st.base["eval_batches"], warmup_frac=st.base["warmup_frac"],
               min_lr_frac=st.base["min_lr_frac"], threads_per_run=st.base["threads"],
               schedule="linear warm-up, then cosine to min_lr_frac * lr")
    rep = {"dataset": st.dataset, "data": st.data_id, "config": cfg,
           "tokens_per_run": st.steps * st.batch * st.seq, "seeds": seeds,
           "code_version": st.code_version(), "code_versions": dict(st.fingerprints or {}),
           "arms": arms, "convergence": convergence(bp_curves),
           "verdicts": verdicts(test_bpb, seeds, st.margin, st.conf, st.n_boot),
           "gap_by_tokens": gaps_by_tokens(arms, st.steps * st.batch * st.seq),
           "sweep": {"seed": SWEEP_SEED, "frac": st.sweep_frac, "steps": st.sweep_steps,
                     "tokens": st.sweep_steps * st.batch * st.seq, "eval_every": st.sweep_eval_every,
                     "lrs": sorted(sweep_lrs), "grid": st.sweep_lrs, "extend": st.extend_sweep,
                     "criterion": "lowest final validation bpb"},
           "test_metric": {"split": "test", "eval": "nbrgc.evaluate.sliding_bpb (full context, stride "
                           "ctx/2), full network (RGC: the last stage)", "bytes": st.test_bytes},
           "margin": st.margin, "conf": st.conf, "runs": {"done": n_done, "known": n_known},
           "command": st.command, "machine": machine, "machine_line": machine_line(machine),
           "run_machines": run_machines, "speed_machine": speed_machine,
           "computed_this_call": list(computed), "notes": []}
    for a in arms:
        twin = st.twin_of(a)
        if twin is not None:
            rep["notes"].append(f"{a} has {twin}'s numerics fingerprint (at one thread they run the same "
                                f"calls on the same shapes, bit for bit): its runs are {twin}'s, copied")
    waiting = [a for a, e in arms.items() if not e["sweep"]["complete"]]
    if waiting:
        rep["notes"].append(f"the sweep is not complete for {', '.join(waiting)}: their main runs "
                            "start once it is (--phase sweep or all runs it)")
    return rep


def gaps_by_tokens(arms, total):
    """{"tokens": [a quarter, half and all of the run], arm: [mean paired validation gap to its
    reference at each, or None]}: how the gap moves with training, read off the validation curves."""
    points = [total // 4, total // 2, total]
    out = {"tokens": points}
    for arm, e in arms.items():
        if arm == BASE:
            continue
        bp = arms[_ref(arm, arms)]["curve"]
        row = []
        for at in points:
            gaps = [(value_at(e["curve"]["tokens"], a, at) - value_at(bp["tokens"], b, at))
                    / value_at(bp["tokens"], b, at)
                    for a, b in zip(e["curve"]["val_bpb"], bp["val_bpb"]) if a and b]
            row.append(sum(gaps) / len(gaps) if gaps else None)
        out[arm] = row
    return out


def best_of_class(rep):
    """{class: arm} for each class of what crosses a boundary: the arm with the lowest upper bound
    of its verdict interval (the lowest mean gap while an arm has fewer than two paired seeds)."""
    best = {}
    for arm, e in rep["arms"].items():
        v = rep["verdicts"].get(arm)
        if arm == BASE or arm in DIAGNOSTIC or not v or v.get("mean_gap") is None:
            continue
        score = v["t_upper"] if v.get("t_upper") is not None else v["mean_gap"]
        cls = e.get("crosses", CROSSES.get(arm))
        if cls not in best or score < best[cls][0]:
            best[cls] = (score, arm)
    return {c: a for c, (_, a) in best.items()}


def _pct(x, nd=2):
    return "–" if x is None else f"{100 * x:+.{nd}f}%"


def _f(x, nd=4):
    return "–" if x is None else f"{x:.{nd}f}"


def markdown(rep):
    c, arms, seeds = rep["config"], rep["arms"], rep["seeds"]
    rgc = [a for a in arms if a != BASE]
    L = [f"## nbrgc-study: {c['preset']} (L{c['n_layer']} d{c['d_model']} H{c['n_head']} ctx{c['ctx']}, "
         f"{c['n_stages']} RGC stages) on {rep['data']['name']}",
         "",
         f"{rep['tokens_per_run']:,} tokens per run ({c['steps']} steps × {c['batch']} × {c['seq']}), "
         f"{len(seeds)} paired seeds {seeds}, warm-up {100 * c['warmup_frac']:g}%, cosine to "
         f"{c['min_lr_frac']:g}·lr, validation every {c['eval_every']} steps on {c['eval_batches']} "
         f"fixed batches, {c['threads_per_run']} thread(s) per run. Numerics version "
         f"`{rep['code_version']}`. Runs done: {rep['runs']['done']} of {rep['runs']['known']} known.",
         "", f"Report written on: {rep['machine_line']}", "",
         "Runs made on: " + "; ".join(f"**{_label(rep, m)}** {m} ({n} run{'s' if n != 1 else ''})"
                                      for m, n in rep.get("run_machines", {}).items()), ""]
    if rep.get("command"):
        L += ["Reproduce (reuses every finished run in the folder):", "", "    " + rep["command"], ""]
    sw = rep["sweep"]
    lrs = sw["lrs"]
    L += [f"### Learning-rate sweep (seed {sw['seed']}, {sw['tokens']:,} tokens = {sw['frac']:g} of "
          "the budget, its own schedule; final validation bpb, best in bold)", "",
          "| arm | " + " | ".join(f"lr {v:.3g}" for v in lrs) + " | chosen |",
          "|---|" + "---:|" * (len(lrs) + 1)]
    for a, e in arms.items():
        by = dict(zip(e["sweep"]["lrs"], zip(e["sweep"]["val_bpb"], e["sweep"]["diverged"])))
        cells = []
        for v in lrs:
            if v not in by:
                cells.append("")
            elif by[v][1]:
                cells.append("diverged")
            elif by[v][0] is None:
                cells.append("–")
            else:
                cells.append(f"**{by[v][0]:.4f}**" if v == e["lr"] else f"{by[v][0]:.4f}")
        chosen = "–" if e["lr"] is None else f"{e['lr']:.3g}" + (
            " (edge of the grid)" if e["sweep"]["at_edge"] else "")
        L.append(f"| {a} | " + " | ".join(cells) + f" | {chosen} |")
    edge = [a for a, e in arms.items() if e["sweep"]["at_edge"]]
    if edge:
        L += ["", f"The best learning rate is at the edge of the grid for {', '.join(edge)}: a wider "
              "sweep (--sweep-lrs, --extend-sweep) may find a better one."]
    L += ["", "### Test bits per byte (sliding window, full network) per seed", "",
          "| seed | " + " | ".join(arms) + " | " + " | ".join(f"Δ {a}" for a in rgc) + " |",
          "|---:|" + "---:|" * (len(arms) + len(rgc))]
    for i, s in enumerate(seeds):
        cells = [_f(arms[a]["test_bpb"][i]) for a in arms]
        gaps = []
        for a in rgc:
            bp, v = arms[_ref(a, arms)]["test_bpb"][i], arms[a]["test_bpb"][i]
            gaps.append("–" if bp is None or v is None else _pct((v - bp) / bp, 3))
        L.append(f"| {s} | " + " | ".join(cells + gaps) + " |")
    L += ["", "### Verdicts (Δ = (bpb_arm − bpb_ref) / bpb_ref, ref the BP arm of the arm's optimizer; "
          "non-inferior iff the upper bound of the two-sided 95% t-interval is below the margin)", "",
          "| arm | against | lr | paired seeds | mean Δ | t lower | t upper | bootstrap 95% | margin | "
          "verdict |", "|---|---|---:|---:|---:|---:|---:|---|---:|---|"]
    for a in rgc:
        v = rep["verdicts"][a]
        lr = "–" if arms[a]["lr"] is None else f"{arms[a]['lr']:.3g}"
        L.append(f"| {a} | {v.get('reference', BASE)} | {lr} | {v['n_paired']}/{len(seeds)} | "
                 f"{_pct(v['mean_gap'], 3)} | "
                 f"{_pct(v['t_lower'], 3)} | {_pct(v['t_upper'], 3)} | [{_pct(v['boot_lower'])}, "
                 f"{_pct(v['boot_upper'])}] | {100 * v['margin']:g}% | "
                 + ("diagnostic, not a candidate: " if a in DIAGNOSTIC else "") + f"{v['verdict']} |")
    L += _class_tables(rep)
    L += _depth_table(rep)
    cv = rep["convergence"]
    L += ["", "### Convergence of bp", "",
          f"Mean relative improvement of bp's validation bpb over the last 20% of its run: "
          f"{_pct(cv['bp_last20_rel_improvement'], 3)} over {cv['seeds']} seed(s) "
          f"(per seed: {', '.join(_pct(p, 3) for p in cv['per_seed']) or '–'}). {cv['note']}."]
    tp = [(a, e.get("train_tokens_per_s_by_machine")) for a, e in arms.items()
          if e.get("train_tokens_per_s_by_machine")]
    if tp:
        L += ["", "Training throughput (median over finished main runs on each machine, tokens/s, "
              "machine shared by the parallel runs): " + ", ".join(
                  f"{a} " + " / ".join(f"{v['median']:,.0f} on {_label(rep, m)} ({v['n']})"
                                       for m, v in by.items()) for a, by in tp) + "."]
    for n in rep.get("notes", []):
        L += ["", f"Note: {n}"]
    return "\n".join(L) + "\n"


def _class_tables(rep):
    """What crosses a boundary, quality, speed and memory side by side; the gap at a quarter, half
    and all of the run; the best arm of each class."""
    arms, g = rep["arms"], rep.get("gap_by_tokens")
    L = ["", "### Quality, speed and memory by what crosses a boundary backward", "",
         f"| arm | crosses | against | mean Δ test | t upper | tokens/s on {_label(rep, rep.get('speed_machine'))} "
         "(1 thread, median, machine shared) | peak RSS MiB (median, max) |", "|---|---|---|---:|---:|---:|---:|"]
    for a, e in arms.items():
        v = rep["verdicts"].get(a, {})
        tps, rss, top = e.get("train_tokens_per_s"), e.get("peak_rss_mib"), e.get("peak_rss_mib_max")
        L.append(f"| {a} | {e.get('crosses', CROSSES.get(a))} | {v.get('reference', '–')} | "
                 f"{_pct(v.get('mean_gap'))} | "
                 f"{_pct(v.get('t_upper'))} | {'–' if not tps else f'{tps:,.0f}'} | "
                 f"{'–' if not rss else f'{rss:,.0f}, {top:,.0f}'} |")
    best = best_of_class(rep)
    if best:
        L += ["", "Best arm of each class: " + "; ".join(
            f"{c}: {a} ({_pct(rep['verdicts'][a]['mean_gap'])}, {rep['verdicts'][a]['verdict']})"
            for c, a in best.items()) + "."]
    if g and len(arms) > 1:
        L += ["", "### The gap as training goes on (validation bpb against each arm's reference, mean "
              "over paired seeds)", "",
              "| arm | " + " | ".join(f"{t / 1e6:.3g} M tokens" for t in g["tokens"]) + " |",
              "|---|" + "---:|" * len(g["tokens"])]
        L += [f"| {a} | " + " | ".join(_pct(x) for x in g.get(a, [])) + " |" for a in arms
              if a != BASE]
    return L


def _depth_table(rep):
    """Each arm's final validation bpb at each of its read-outs, against the layers below it: what
    an RGC stage adds to the one before, beside BP at the same depth (bp-quarter, bp-half)."""
    c, rows = rep["config"], []
    for a, e in rep["arms"].items():
        ov = e.get("overrides") or {}
        num, den = ov.get("depth", (1, 1))
        layers = c["n_layer"] * num // den
        k = 1 if ov.get("mode") == "bp" else ov.get("n_stages", c["n_stages"])
        per_seed = [v for v in e.get("val_stage_bpb") or [] if v]
        if not per_seed or any(len(v) != k for v in per_seed):
            continue
        means = [sum(v[j] for v in per_seed) / len(per_seed) for j in range(k)]
        rows.append(f"| {a} | {', '.join(str(layers * (j + 1) // k) for j in range(k))} | "
                    + " → ".join(f"{m:.4f}" for m in means) + f" | {len(per_seed)} |")
    if not rows:
        return []
    return ["", "### Where the depth goes (final validation bpb at each read-out, mean over seeds)", "",
            "An RGC stage's read-out is the shared decoder on its output; bp-quarter and bp-half, where "
            "present, are BP trained at the depth of one stage of a 4- and a 2-stage split.", "",
            "| arm | layers below each read-out | validation bpb, stage by stage | seeds |",
            "|---|---|---|---:|"] + rows


def write(rep, out, plot=True):
    """study.json, study.md and (with ``plot`` and matplotlib) curves.png in ``out``."""
    from ..plot import PlotUnavailable, plot_study
    if plot:
        try:
            if plot_study(rep, os.path.join(out, CURVES_FILE), base=BASE) is not None:
                rep["plot"] = CURVES_FILE
        except PlotUnavailable:
            rep["notes"].append("curves.png needs matplotlib: pip install 'nbrgc[plot]'")
    write_json(os.path.join(out, REPORT_FILE), rep)
    write_text(os.path.join(out, MARKDOWN_FILE), markdown(rep))
    return os.path.join(out, REPORT_FILE)
