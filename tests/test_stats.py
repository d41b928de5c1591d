import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from scipy import stats as sst

from nbrgc.errors import NbrgcError
from nbrgc.measure.stats import (StatsError, bootstrap_ci, noninferiority, relative_gaps, t_interval)


def test_relative_gaps_known():
    g = relative_gaps([2.0, 1.0, 4.0], [2.2, 1.0, 3.0])
    np.testing.assert_allclose(g, [0.1, 0.0, -0.25])


@pytest.mark.parametrize("bp, rgc", [
    ([1.0, 2.0], [1.0]),            # length mismatch
    ([], []),                        # no seeds
    ([1.0, np.nan], [1.0, 1.0]),     # non-finite
    ([1.0, 0.0], [1.0, 1.0]),        # bp must be > 0
    ([[1.0]], [[1.0]]),              # not 1-D
    (["a"], ["b"]),                  # not numeric
])
def test_relative_gaps_validation(bp, rgc):
    with pytest.raises(StatsError) as info:
        relative_gaps(bp, rgc)
    assert isinstance(info.value, NbrgcError) and isinstance(info.value, ValueError)
    assert "\n" not in str(info.value)


def test_t_interval_hard_coded():
    mean, lo, hi = t_interval([1, 2, 3, 4, 5])
    half = 2.776445 * 1.581139 / math.sqrt(5)
    assert mean == 3.0
    assert half == pytest.approx(1.963243, abs=1e-6)
    assert hi - mean == pytest.approx(half, abs=1e-5)
    assert mean - lo == pytest.approx(half, abs=1e-5)


@pytest.mark.parametrize("conf", [0.8, 0.9, 0.95, 0.99])
def test_t_interval_matches_formula(conf):
    v = np.array([0.013, -0.004, 0.021, 0.007, 0.0, 0.011, -0.002])
    n = v.size
    half = sst.t.ppf(1 - (1 - conf) / 2, n - 1) * v.std(ddof=1) / math.sqrt(n)
    mean, lo, hi = t_interval(v, conf)
    assert mean == pytest.approx(v.mean(), rel=1e-12)
    assert lo == pytest.approx(v.mean() - half, rel=1e-12)
    assert hi == pytest.approx(v.mean() + half, rel=1e-12)


def test_t_interval_single_value_and_constant():
    mean, lo, hi = t_interval([0.5])
    assert mean == 0.5 and math.isnan(lo) and math.isnan(hi)
    assert t_interval([0.2, 0.2, 0.2]) == pytest.approx((0.2, 0.2, 0.2))


@pytest.mark.parametrize("bad", [0.0, 1.0, -0.5, 1.5, True])
def test_conf_validation(bad):
    with pytest.raises(StatsError):
        t_interval([1.0, 2.0], conf=bad)
    with pytest.raises(StatsError):
        bootstrap_ci([1.0, 2.0], conf=bad)


def test_bootstrap_deterministic_and_contains_mean():
    v = np.array([0.013, -0.004, 0.021, 0.007, 0.0, 0.011, -0.002])
    a = bootstrap_ci(v, n_boot=2000, seed=3)
    b = bootstrap_ci(v, n_boot=2000, seed=3)
    c = bootstrap_ci(v, n_boot=2000, seed=4)
    assert a == b
    assert a != c
    mean, lo, hi = a
    assert mean == pytest.approx(v.mean())
    assert lo <= mean <= hi
    assert v.min() <= lo < hi <= v.max()
    # the bootstrap interval is (a bit) narrower than the t interval for small n, same ballpark
    _, tlo, thi = t_interval(v)
    assert 0.3 < (hi - lo) / (thi - tlo) < 1.5


def test_bootstrap_edge_cases():
    mean, lo, hi = bootstrap_ci([0.7])
    assert mean == 0.7 and math.isnan(lo) and math.isnan(hi)
    assert bootstrap_ci([1.0, 1.0, 1.0], n_boot=50) == (1.0, 1.0, 1.0)
    with pytest.raises(StatsError):
        bootstrap_ci([1.0, 2.0], n_boot=0)
    with pytest.raises(StatsError):
        bootstrap_ci([])


@settings(max_examples=30, deadline=None)
@given(st.lists(st.floats(-1.0, 1.0, allow_nan=False), min_size=2, max_size=12),
       st.integers(0, 2 ** 32 - 1))
def test_bootstrap_bounds_property(values, seed):
    v = np.array(values)
    mean, lo, hi = bootstrap_ci(v, n_boot=200, seed=seed)
    tol = 1e-12 * (1 + np.abs(v).max())
    assert v.min() - tol <= lo <= hi <= v.max() + tol
    m2, tlo, thi = t_interval(v)
    assert m2 == mean
    assert tlo <= mean + tol and mean - tol <= thi


def _bp_rgc_with_upper_bound(target, n=5):
    """Paired bpb arrays whose gaps have a t upper bound of exactly ``target`` (up to rounding)."""
    base = np.array([-0.002, 0.001, 0.0035, -0.0005, 0.003, 0.0015, -0.001][:n])
    half = sst.t.ppf(0.975, n - 1) * base.std(ddof=1) / math.sqrt(n)
    gaps = base - base.mean() + (target - half)
    bp = np.linspace(1.1, 1.9, n)
    return bp, bp * (1.0 + gaps)


def test_verdict_flips_at_margin():
    bp, rgc = _bp_rgc_with_upper_bound(0.01 - 1e-9)
    r = noninferiority(bp, rgc, margin=0.01, n_boot=500)
    assert r["t_hi"] < 0.01 and r["t_hi"] == pytest.approx(0.01, abs=1e-8)
    assert r["non_inferior"] is True
    assert r["verdict"].startswith("non-inferior at 1.00% margin (upper 95% bound 1.00%)")

    bp, rgc = _bp_rgc_with_upper_bound(0.01 + 1e-9)
    r = noninferiority(bp, rgc, margin=0.01, n_boot=500)
    assert r["t_hi"] >= 0.01
    assert r["non_inferior"] is False
    assert r["verdict"].startswith("not shown non-inferior: upper 95% bound 1.00% >= margin 1.00%")


def test_noninferiority_report_fields():
    bp = np.array([1.50, 1.52, 1.49, 1.51])
    rgc = bp * np.array([1.002, 1.004, 1.001, 1.005])
    r = noninferiority(bp, rgc, margin=0.01, n_boot=1000, seed=1)
    assert set(r) >= {"n", "gaps", "mean_gap", "t_lo", "t_hi", "boot_lo", "boot_hi", "margin",
                      "non_inferior", "verdict"}
    assert r["n"] == 4
    np.testing.assert_allclose(r["gaps"], [0.002, 0.004, 0.001, 0.005], atol=1e-12)
    assert isinstance(r["gaps"], list)
    assert r["mean_gap"] == pytest.approx(0.003)
    mean, lo, hi = t_interval(r["gaps"])
    assert (r["t_lo"], r["t_hi"]) == pytest.approx((lo, hi))
    assert (r["boot_lo"], r["boot_hi"]) == pytest.approx(bootstrap_ci(r["gaps"], n_boot=1000, seed=1)[1:])
    assert r["non_inferior"] is True
    assert r["verdict"] == f"non-inferior at 1.00% margin (upper 95% bound {100 * hi:.2f}%)"

    bad = noninferiority(bp, bp * np.array([1.02, 1.03, 1.01, 1.025]), margin=0.01, n_boot=200)
    assert bad["non_inferior"] is False
    assert bad["verdict"].startswith("not shown non-inferior: upper 95% bound")


def test_noninferiority_single_seed_undetermined():
    r = noninferiority([1.5], [1.4], n_boot=100)
    assert r["n"] == 1 and r["non_inferior"] is False
    assert r["verdict"].startswith("undetermined: need >= 2 seeds")
    assert math.isnan(r["t_hi"]) and math.isnan(r["boot_hi"])
    assert r["mean_gap"] == pytest.approx(-0.1 / 1.5)


@pytest.mark.parametrize("margin", [0.0, -0.01, float("nan"), float("inf")])
def test_noninferiority_margin_validation(margin):
    with pytest.raises(StatsError):
        noninferiority([1.0, 1.1], [1.0, 1.1], margin=margin)


def test_noninferiority_length_mismatch():
    with pytest.raises(StatsError, match="differ in length"):
        noninferiority([1.0, 1.1, 1.2], [1.0, 1.1])
