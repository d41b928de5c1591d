"""The bench's figures from its raw runs: per-round ratios to BP and one summary row per variant."""
import math
import statistics

from .plan import BASE


def _stats(vals):
    vals = [v for v in vals if v is not None and math.isfinite(v)]
    if not vals:
        return None
    return {"median": statistics.median(vals), "min": min(vals), "max": max(vals), "n": len(vals)}


def round_ratios(records, base=BASE, key="tokens_per_s"):
    """Per (threads, label): the ratio of ``key`` to the base mode's, taken round by round.

    ``records``: dicts with ``threads``, ``round``, ``label`` and ``key``. Returns
    ``{(threads, label): {"per_round": [...], "median", "min", "max", "n"}}``; rounds without a base
    run are skipped; the base mode itself is left out.
    """
    by_round = {}
    for r in records:
        by_round.setdefault((r["threads"], r["round"]), {})[r["label"]] = r
    out = {}
    for (t, rnd), runs in sorted(by_round.items()):
        b = runs.get(base)
        if b is None or not b.get(key):
            continue
        for label, r in runs.items():
            if label == base or r.get(key) is None:
                continue
            out.setdefault((t, label), []).append((rnd, r[key] / b[key]))
    res = {}
    for k, pairs in out.items():
        vals = [v for _, v in pairs]
        res[k] = dict(_stats(vals), per_round=vals, rounds=[rnd for rnd, _ in pairs])
    return res


def aggregate(records, flops=None, gemm=None, base=BASE):
    """One row per (threads, label) in run order: tokens/s, ms/step, peak RSS, GFLOP/s, ratios."""
    ratios = round_ratios(records, base)
    rss_ratios = round_ratios(records, base, key="peak_rss_mib")
    rows, seen = [], []
    for r in records:
        k = (r["threads"], r["label"])
        if k not in seen:
            seen.append(k)
    for t, label in seen:
        runs = [r for r in records if (r["threads"], r["label"]) == (t, label)]
        tps = _stats([r["tokens_per_s"] for r in runs])
        row = {"threads": t, "label": label, "mode": runs[0]["mode"],
               "stage_threads": runs[0].get("stage_threads"),
               "stage_workers": runs[0].get("stage_workers"), "n": len(runs),
               "tokens_per_s": tps, "ms_per_step": _stats([r["ms_per_step"] for r in runs]),
               "peak_rss_mib": _stats([r.get("peak_rss_mib") for r in runs]),
               "ratio_vs_bp": ratios.get((t, label)), "rss_ratio_vs_bp": rss_ratios.get((t, label))}
        if flops:
            row["flops_per_token"] = flops
            row["gflops"] = _stats([flops * r["tokens_per_s"] / 1e9 for r in runs])
            g = (gemm or {}).get(t)
            if g and row["gflops"]:
                row["gemm_peak_gflops"] = g["numba_gflops"]
                row["fraction_of_gemm_peak"] = row["gflops"]["median"] / g["numba_gflops"]
        profs = [r["stage_profile"]["busy_frac"] for r in runs if r.get("stage_profile")]
        if profs:
            row["stage_busy_frac"] = [statistics.median(p[k] for p in profs if p[k] is not None)
                                      for k in range(len(profs[0]))]
        g, W = row["stage_threads"], row["stage_workers"] or len(row["stage_threads"] or [])
        oversub = g and sum(g[:W]) > t  # stage w runs on worker w: the first W groups are the workers'
        row["oversubscribed"] = bool(oversub)
        rows.append(row)
    return rows
