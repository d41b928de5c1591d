"""curves.png of a study: validation bpb against tokens for every arm (mean over seeds, min-max
band), and the relative gap to bp against tokens (mean over the seeds both have, min-max band)."""
import numpy as np

from .arms import BASE


def _stack(rows):
    rows = [r for r in rows if r]
    if not rows:
        return None
    n = min(len(r) for r in rows)
    return np.array([r[:n] for r in rows], dtype=np.float64)


def plot_study(rep, path):
    """Write the two-panel picture to ``path``; None when matplotlib is missing or nothing is done."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    arms = rep["arms"]
    if not any(any(v for v in e["curve"]["val_bpb"]) for e in arms.values()):
        return None
    fig, (ax, gx) = plt.subplots(1, 2, figsize=(12, 4.5))
    bp = arms[BASE]["curve"]
    for i, (arm, e) in enumerate(arms.items()):
        toks, rows = e["curve"]["tokens"], e["curve"]["val_bpb"]
        y = _stack(rows)
        if y is None:
            continue
        x = np.asarray(toks[:y.shape[1]], dtype=np.float64)
        color = f"C{i}"
        n = y.shape[0]
        ax.plot(x, y.mean(0), color=color, lw=1.4, label=f"{arm} (lr {e['lr']:.3g}, {n} seed{'s' * (n > 1)})")
        if n > 1:
            ax.fill_between(x, y.min(0), y.max(0), color=color, alpha=0.18, lw=0)
        if arm == BASE:
            continue
        pairs = [(a, b) for a, b in zip(rows, bp["val_bpb"]) if a and b]
        if not pairs:
            continue
        m = min(min(len(a), len(b)) for a, b in pairs)
        g = np.array([(np.array(a[:m]) - np.array(b[:m])) / np.array(b[:m]) for a, b in pairs]) * 100
        gx.plot(x[:m], g.mean(0), color=color, lw=1.4, label=f"{arm} ({len(pairs)} paired)")
        if len(pairs) > 1:
            gx.fill_between(x[:m], g.min(0), g.max(0), color=color, alpha=0.18, lw=0)
    ax.set_xlabel("training tokens")
    ax.set_ylabel("validation bits per byte")
    ax.set_title(f"{rep['config']['preset']} on {rep['data']['name']}: mean over seeds, min-max band")
    ax.legend(fontsize=8)
    gx.axhline(0, color="k", lw=0.8)
    gx.axhline(100 * rep["margin"], color="k", lw=0.8, ls="--", label=f"margin {100 * rep['margin']:g}%")
    gx.set_xlabel("training tokens")
    gx.set_ylabel("validation gap to bp (%)")
    gx.set_title("(arm − bp) / bp, paired seeds, min-max band")
    gx.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
