"""Every picture nbrgc draws: training curves of run folders (``nbrgc-plot``), the study's
curves.png and the bench's bar chart.

matplotlib is an optional extra (``pip install 'nbrgc[plot]'``); without it each function raises
:class:`PlotUnavailable`, one line naming the extra. Figures are built as ``matplotlib.figure.Figure``
objects, not through pyplot: no backend is switched and no global figure state is left behind, so
the functions are safe inside a long-running study and return the figure for inspection.
"""
import numpy as np

from ..errors import NbrgcError

EXTRA_HINT = "pip install 'nbrgc[plot]' (or pip install matplotlib)"


class PlotUnavailable(NbrgcError):
    """matplotlib is not installed."""


def _figure(**kw):
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise PlotUnavailable(f"drawing needs matplotlib, which is not installed: {EXTRA_HINT}") from None
    return Figure(**kw)


def _save(fig, path, dpi):
    try:
        fig.savefig(path, dpi=dpi)
    except OSError as exc:
        raise NbrgcError(f"cannot write {path}: {exc.strerror or exc}") from None
    except ValueError as exc:  # an extension matplotlib has no writer for
        raise NbrgcError(f"cannot write {path}: {exc}") from None


# ------------------------------------------------------------------------------------------ run curves
def _stage_values(points, k, n):
    """Stage k's values from (step, bpb, stage_bpb) points; where a record has no per-stage list
    the last stage is the network's own bpb."""
    xs, ys = [], []
    for s, v, st in points:
        if isinstance(st, list) and len(st) == n:
            xs.append(s)
            ys.append(st[k])
        elif k == n - 1:
            xs.append(s)
            ys.append(v)
    return xs, ys


def plot_runs(runs, path, dpi=110):
    """Training and validation bits per byte against training tokens, one panel per run side by
    side (a shared y axis), every stage for RGC runs; writes ``path`` and returns the Figure.
    ``runs``: dicts from :func:`nbrgc.measure.runlog.load_run`."""
    if not runs:
        raise NbrgcError("nothing to plot: no runs given")
    n = len(runs)
    fig = _figure(figsize=(5.2 * n, 4.2), layout="constrained")
    axes = fig.subplots(1, n, sharey=True, squeeze=False)[0]
    for ax, run in zip(axes, runs):
        K, per = max(1, run["n_stages"]), run["tokens_per_step"]
        for k in range(K):
            color = f"C{k}"
            what = "" if K == 1 else f"stage {k}" + (" (full network)" if k == K - 1 else "") + ", "
            xs, ys = _stage_values(run["train"], k, K)
            if xs:
                ax.plot(np.asarray(xs) * per, ys, color=color, lw=0.9, alpha=0.55,
                        label=f"{what}training")
            xs, ys = _stage_values(run["val"], k, K)
            if xs:
                ax.plot(np.asarray(xs) * per, ys, color=color, lw=1.6, marker="o", ms=3,
                        label=f"{what}validation")
        title = f"{run['name']}\n{run['mode']}" + (f", {K} stages" if K > 1 else "")
        final = (run.get("summary") or {}).get("val_bpb")
        if final is not None:
            title += f", final val {final:.3f} bpb"
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("training tokens")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    axes[0].set_ylabel("bits per byte")
    _save(fig, path, dpi)
    return fig


# ------------------------------------------------------------------------------------------ study
def _stack(rows):
    rows = [r for r in rows if r]
    if not rows:
        return None
    n = min(len(r) for r in rows)
    return np.array([r[:n] for r in rows], dtype=np.float64)


def arm_style(i):
    """(colour, line style) of the i-th arm: 20 colours, and a line style that changes with every
    colour, so no two of up to 20 arms look alike (and neighbours differ in both)."""
    import matplotlib
    return matplotlib.colormaps["tab20"](i % 20), ("-", "--", "-.", ":")[i % 4]


def plot_study(rep, path, base="bp", dpi=110):
    """The study's two panels: validation bpb against tokens for every arm (mean over seeds,
    min-max band) and the relative gap to ``base`` (mean over the seeds both have, min-max band).
    Writes ``path`` and returns the Figure, or None while no arm has a curve."""
    arms = rep["arms"]
    if not any(any(v for v in e["curve"]["val_bpb"]) for e in arms.values()):
        return None
    fig = _figure(figsize=(12, 4.5), layout="constrained")
    ax, gx = fig.subplots(1, 2)
    bp = arms[base]["curve"]
    for i, (arm, e) in enumerate(arms.items()):
        toks, rows = e["curve"]["tokens"], e["curve"]["val_bpb"]
        y = _stack(rows)
        if y is None:
            continue
        x = np.asarray(toks[:y.shape[1]], dtype=np.float64)
        color, ls = arm_style(i)
        n = y.shape[0]
        ax.plot(x, y.mean(0), color=color, ls=ls, lw=1.4,
                label=f"{arm} (lr {e['lr']:.3g}, {n} seed{'s' * (n > 1)})")
        if n > 1:
            ax.fill_between(x, y.min(0), y.max(0), color=color, alpha=0.18, lw=0)
        if arm == base:
            continue
        pairs = [(a, b) for a, b in zip(rows, bp["val_bpb"]) if a and b]
        if not pairs:
            continue
        m = min(min(len(a), len(b)) for a, b in pairs)
        g = np.array([(np.array(a[:m]) - np.array(b[:m])) / np.array(b[:m]) for a, b in pairs]) * 100
        gx.plot(x[:m], g.mean(0), color=color, ls=ls, lw=1.4, label=f"{arm} ({len(pairs)} paired)")
        if len(pairs) > 1:
            gx.fill_between(x[:m], g.min(0), g.max(0), color=color, alpha=0.18, lw=0)
    ax.set_xlabel("training tokens")
    ax.set_ylabel("validation bits per byte")
    ax.set_title(f"{rep['config']['preset']} on {rep['data']['name']}: mean over seeds, min-max band")
    ax.legend(fontsize=8)
    gx.axhline(0, color="k", lw=0.8)
    gx.axhline(100 * rep["margin"], color="k", lw=0.8, ls="--", label=f"margin {100 * rep['margin']:g}%")
    gx.set_xlabel("training tokens")
    gx.set_ylabel(f"validation gap to {base} (%)")
    gx.set_title(f"(arm − {base}) / {base}, paired seeds, min-max band")
    gx.legend(fontsize=8)
    _save(fig, path, dpi)
    return fig


# ------------------------------------------------------------------------------------------ bench
def plot_bench(report, path, dpi=120):
    """Tokens/s by variant (median, min-max bars) per thread count; writes ``path`` and returns the
    Figure."""
    rows = report["summary"]
    threads = sorted({r["threads"] for r in rows})
    labels = list(dict.fromkeys(r["label"] for r in rows))
    fig = _figure(figsize=(max(5, 1.2 * len(labels) * len(threads)), 3.5), layout="constrained")
    ax = fig.subplots()
    w = 0.8 / max(1, len(labels))
    for i, lab in enumerate(labels):
        xs, ys, lo, hi = [], [], [], []
        for j, t in enumerate(threads):
            r = next((r for r in rows if r["label"] == lab and r["threads"] == t), None)
            if r is None:
                continue
            s = r["tokens_per_s"]
            xs.append(j + i * w)
            ys.append(s["median"])
            lo.append(s["median"] - s["min"])
            hi.append(s["max"] - s["median"])
        ax.bar(xs, ys, w, yerr=[lo, hi], capsize=3, label=lab)
    ax.set_xticks([j + w * (len(labels) - 1) / 2 for j in range(len(threads))])
    ax.set_xticklabels([f"{t} thread(s)" for t in threads])
    ax.set_ylabel("tokens/s")
    ax.set_title(f"nbrgc-bench {report['settings']['config']}")
    ax.legend(fontsize=8)
    _save(fig, path, dpi)
    return fig
