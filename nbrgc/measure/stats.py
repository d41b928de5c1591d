"""Non-inferiority statistics for the backprop-vs-RGC comparison over paired seeds.

For each seed the relative gap is ``(bpb_rgc - bpb_bp) / bpb_bp`` (positive: RGC is worse). RGC is
declared non-inferior at margin ``m`` only when the upper bound of the two-sided ``conf`` Student-t
interval of the mean gap is below ``m``. A percentile bootstrap interval is reported alongside as a
robustness check; it does not decide the verdict.
"""
import math

import numpy as np
from scipy import stats as _st

from ..errors import NbrgcError


class StatsError(NbrgcError, ValueError):
    """Inputs the statistics cannot use (mismatched lengths, no seeds, non-finite values)."""


def _vector(values, what):
    try:
        v = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise StatsError(f"{what}: not numeric: {exc}") from None
    if v.ndim != 1:
        raise StatsError(f"{what}: expected a 1-D sequence, got shape {v.shape}")
    if v.size < 1:
        raise StatsError(f"{what}: need at least 1 value, got none")
    if not np.isfinite(v).all():
        raise StatsError(f"{what}: contains non-finite values")
    return v


def _check_conf(conf):
    if not (isinstance(conf, (int, float, np.floating)) and 0.0 < float(conf) < 1.0):
        raise StatsError(f"conf must be in (0, 1), got {conf!r}")
    return float(conf)


def relative_gaps(bpb_bp, bpb_rgc):
    """Per-seed relative gaps ``(rgc - bp) / bp`` of paired bits-per-byte arrays."""
    bp = _vector(bpb_bp, "bpb_bp")
    rgc = _vector(bpb_rgc, "bpb_rgc")
    if bp.shape != rgc.shape:
        raise StatsError(f"paired inputs differ in length: {bp.size} backprop vs {rgc.size} RGC seeds")
    if (bp <= 0).any():
        raise StatsError("bpb_bp: bits-per-byte must be > 0")
    return (rgc - bp) / bp


def t_interval(values, conf=0.95):
    """``(mean, lo, hi)``: two-sided Student-t interval of the mean; ``(mean, nan, nan)`` when n == 1."""
    v = _vector(values, "values")
    conf = _check_conf(conf)
    mean = float(v.mean())
    n = v.size
    if n < 2:
        return mean, math.nan, math.nan
    half = float(_st.t.ppf(0.5 + conf / 2.0, n - 1)) * float(v.std(ddof=1)) / math.sqrt(n)
    return mean, mean - half, mean + half


def bootstrap_ci(values, conf=0.95, n_boot=10000, seed=0):
    """``(mean, lo, hi)``: percentile bootstrap interval of the mean (resampling whole seeds).

    Deterministic for a given ``seed``; ``(mean, nan, nan)`` when n == 1.
    """
    v = _vector(values, "values")
    conf = _check_conf(conf)
    n_boot = int(n_boot)
    if n_boot < 1:
        raise StatsError(f"n_boot must be >= 1, got {n_boot}")
    mean = float(v.mean())
    n = v.size
    if n < 2:
        return mean, math.nan, math.nan
    rng = np.random.default_rng(seed)
    means = np.empty(n_boot)
    rows = max(1, (1 << 22) // n)  # bound the index matrix to ~32 MB
    for start in range(0, n_boot, rows):
        stop = min(n_boot, start + rows)
        idx = rng.integers(0, n, size=(stop - start, n))
        means[start:stop] = v[idx].mean(axis=1)
    alpha = 1.0 - conf
    lo, hi = np.quantile(means, [alpha / 2.0, 1.0 - alpha / 2.0])
    return mean, float(lo), float(hi)


def _pct(x):
    return f"{100.0 * x:.2f}%"


def noninferiority(bpb_bp, bpb_rgc, margin=0.01, conf=0.95, n_boot=10000, seed=0):
    """Non-inferiority test of RGC against backprop on paired per-seed bits-per-byte.

    Returns a dict with ``n``, ``gaps`` (list), ``mean_gap``, ``t_lo``, ``t_hi``, ``boot_lo``,
    ``boot_hi``, ``margin``, ``conf``, ``non_inferior`` (True only when ``t_hi < margin``) and a
    one-line ``verdict``.
    """
    margin = float(margin)
    if not (math.isfinite(margin) and margin > 0):
        raise StatsError(f"margin must be a finite number > 0, got {margin!r}")
    conf = _check_conf(conf)
    gaps = relative_gaps(bpb_bp, bpb_rgc)
    mean, t_lo, t_hi = t_interval(gaps, conf)
    _, b_lo, b_hi = bootstrap_ci(gaps, conf, n_boot=n_boot, seed=seed)
    n = int(gaps.size)
    level = f"{100.0 * conf:g}%"
    if n < 2:
        ok = False
        verdict = f"undetermined: need >= 2 seeds (have {n})"
    elif t_hi < margin:
        ok = True
        verdict = f"non-inferior at {_pct(margin)} margin (upper {level} bound {_pct(t_hi)})"
    else:
        ok = False
        verdict = f"not shown non-inferior: upper {level} bound {_pct(t_hi)} >= margin {_pct(margin)}"
    return {
        "n": n,
        "gaps": [float(g) for g in gaps],
        "mean_gap": mean,
        "t_lo": t_lo,
        "t_hi": t_hi,
        "boot_lo": b_lo,
        "boot_hi": b_hi,
        "margin": margin,
        "conf": conf,
        "non_inferior": bool(ok),
        "verdict": verdict,
    }
