"""The bench's markdown table and notes."""
from .flops import FLOPS_FORMULA
from .plan import BASE


def _fmt(x, nd=0):
    if x is None:
        return "–"
    return f"{x:,.{nd}f}"


def markdown(report):
    s = report["settings"]
    m = s["model"]
    lines = [f"## nbrgc-bench: {s['config']} (L{m['n_layer']} d{m['d_model']} H{m['n_head']} "
             f"ctx{m['ctx']}), batch {s['batch']} x seq {s['seq']}, {s['repeats']} round(s) of "
             f"{s['steps']} timed steps after {s['warmup_steps']} warm-up",
             "", f"Machine: {report['machine_line']}", ""]
    lines.append("| threads | mode | stage threads | tokens/s median (min–max) | ms/step | "
                 "peak RSS MiB | GFLOP/s | of GEMM peak | × BP tokens/s, per round: median (min–max) "
                 "| RSS × BP |")
    lines.append("|---:|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in report["summary"]:
        tps, ratio, rss, rr = r["tokens_per_s"], r["ratio_vs_bp"], r["peak_rss_mib"], r["rss_ratio_vs_bp"]
        groups = ",".join(map(str, r["stage_threads"])) if r["stage_threads"] else ""
        if r.get("stage_workers") and r["stage_threads"] and r["stage_workers"] < len(r["stage_threads"]):
            groups += f" on {r['stage_workers']} worker{'s' if r['stage_workers'] > 1 else ''}"
        if r.get("oversubscribed"):
            groups += " (oversubscribed)"
        lines.append(
            f"| {r['threads']} | {r['label']} | {groups} | {_fmt(tps['median'])} ({_fmt(tps['min'])}–"
            f"{_fmt(tps['max'])}) | {_fmt(r['ms_per_step']['median'], 1)} | "
            f"{_fmt(rss and rss['median'])} | {_fmt((r.get('gflops') or {}).get('median'), 2)} | "
            + (f"{100 * r['fraction_of_gemm_peak']:.0f}%" if r.get("fraction_of_gemm_peak") else "–")
            + " | "
            + (f"{ratio['median']:.3f}× ({ratio['min']:.3f}–{ratio['max']:.3f})" if ratio else
               ("1" if r["label"] == BASE else "–"))
            + " | " + (f"{rr['median']:.3f}×" if rr else ("1" if r["label"] == BASE else "–")) + " |")
    lines.append("")
    lines.append(f"FLOPs/token = {report['flops_per_token']:,} ({FLOPS_FORMULA}).")
    if report.get("gemm_peak"):
        for t, g in sorted(report["gemm_peak"].items(), key=lambda kv: int(kv[0])):
            M, K, N = g["shape"]
            lines.append(f"GEMM peak at {M}×{K}×{N} fp32, {t} thread(s): nbrgc Numba path "
                         f"{g['numba_gflops']:.1f} GFLOP/s, np.dot {g['npdot_gflops']:.1f} GFLOP/s.")
    lines.append("Tokens/s: timed steps only (after warm-up, pipeline fill and drain included); peak "
                 "RSS: the worker process's ru_maxrss from the OS (MiB, median over rounds: a run "
                 "that had to compile kernels first peaks higher, and the JSON keeps every run's).")
    for r in report["summary"]:
        if r.get("stage_busy_frac"):
            lines.append(f"{r['label']} at {r['threads']} thread(s), stage busy (share of each stage "
                         "thread's time not spent waiting on a neighbour, median over rounds): "
                         + ", ".join(f"{100 * b:.0f}%" for b in r["stage_busy_frac"]) + ".")
    for n in report.get("notes", []):
        lines.append(f"Note: {n}")
    for prof in report.get("kernel_profile") or []:
        lines += ["", *profile_table(prof)]
    return "\n".join(lines) + "\n"


def profile_table(prof, top=12):
    """Markdown lines for one kernel profile: the ``top`` kernels by time, the rest summed."""
    from ...profile import table
    return [f"Per-kernel time of one BP step, {prof['threads']} thread(s), attention probabilities "
            f"{'kept' if prof['attention'] == 'store' else 'recomputed'} (each kernel replayed and "
            f"timed on its own, `nbrgc.profile`; step {prof['step_s'] * 1e3:.1f} ms):", "",
            *table(prof["kernels_s"], top)]
