"""Finite-difference gradient checking for your own kernels (float64), plus Hypothesis strategies.

nbrgc's own kernel tests use these helpers; they are public so that you can property-test the
backward passes of kernels you write yourself.

Usage
-----
Write the loss as ``f(*arrays) -> float`` and the analytic gradients as arrays of the same shapes::

    import numpy as np
    from hypothesis import given, settings
    from nbrgc.testing import check_grad, shapes, float64_arrays, seeds
    from hypothesis import strategies as st

    def softmax(x):
        e = np.exp(x - x.max(axis=-1, keepdims=True))
        return e / e.sum(axis=-1, keepdims=True)

    def softmax_backward(x, w):          # d/dx of  sum(w * softmax(x))
        p = softmax(x)
        return p * (w - (w * p).sum(axis=-1, keepdims=True))

    @settings(max_examples=25, deadline=None)
    @given(st.data())
    def test_softmax_grad(data):
        shape = data.draw(shapes(min_dims=1, max_dims=3))
        x = data.draw(float64_arrays(shape, scale=3.0))
        w = data.draw(float64_arrays(shape))
        f = lambda x: float((w * softmax(x)).sum())
        check_grad(f, [x], [softmax_backward(x, w)], seed=data.draw(seeds()))

``check_grad`` raises ``AssertionError`` naming the array, the coordinate or projection, the analytic
and numeric values and the error; on success it returns a :class:`GradReport`.

What is checked
---------------
* ``n_proj`` random projections: a direction ``d = (d_1, ..., d_k)`` (one block per array) with
  i.i.d. normal entries, scaled to unit total 2-norm. Analytic ``a = sum_i <g_i, d_i>``, numeric
  ``n = central_diff(f, arrays, d, eps)``. A projection sees every coordinate at once, so a gradient
  that is wrong anywhere (or wrong by a global factor) is caught with probability ~1.
* ``n_coords`` coordinates per array, sampled without replacement (all of them if the array is
  smaller): ``a = g_i[j]``, ``n`` = central difference along the unit vector ``e_j``.

Pass criterion (for every check)::

    |a - n| <= atol + rtol * max(|a|, |n|, scale) + noise

with ``scale`` the typical magnitude of the checked quantity, so that a check whose true value is
(nearly) zero by accident is not held to an impossible relative precision:

* projection: ``scale = ||g||_2 / sqrt(N)`` over all arrays together (``N`` = total number of
  elements) -- the root-mean-square size of ``<g, d>`` for a random unit direction ``d``;
* coordinate of array ``i``: ``scale = ||g_i||_2 / sqrt(N_i)`` -- the RMS entry of that gradient.

and ``noise = 32 * 2.2e-16 * |f(x)| / eps`` the round-off floor of a central difference (the two
evaluations of ``f`` each carry a few ulps of ``|f|`` of error, divided by ``2 eps``); without it a
loss of magnitude ~10 whose gradient is zero along the direction would fail at ``atol=1e-9``.

The reported relative error of a check is ``|a - n| / max(|a|, |n|, scale, atol / rtol)`` (the
``atol / rtol`` floor keeps values that are zero up to ``atol`` from reporting a spurious relative
error of 1), and ``err / tol`` is reported too: a check passes iff that ratio is ``<= 1``.

Central differences have truncation error ``O(eps^2 * |third derivative|)``, far below ``rtol=1e-5`` with the
default ``eps=1e-6``. If ``f`` loses more precision than a few ulps (long sums with heavy
cancellation), raise ``atol`` accordingly.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Callable, Sequence

import numpy as np

__all__ = [
    "central_diff", "check_grad", "assert_grad_close", "GradReport", "GradCheck",
    "shapes", "float64_arrays", "seeds",
]


# ----------------------------------------------------------------------------------------------- helpers

def _as_list(arrays, what):
    if isinstance(arrays, np.ndarray):
        return [arrays]
    out = list(arrays)
    for k, a in enumerate(out):
        if not isinstance(a, np.ndarray):
            raise TypeError(f"{what}[{k}] must be a numpy array, got {type(a).__name__}")
    return out


def _check_inputs(arrays):
    for k, a in enumerate(arrays):
        if a.dtype != np.float64:
            raise TypeError(f"arrays[{k}] must be float64 (finite differences need it), got {a.dtype}")
        if not a.flags.writeable:
            raise ValueError(f"arrays[{k}] must be writeable (it is perturbed in place and restored)")


def _eval(f, arrays):
    v = f(*arrays)
    try:
        return float(v)
    except TypeError:
        raise TypeError(f"f must return a scalar, got {type(v).__name__}") from None


def central_diff(f: Callable[..., float], arrays: Sequence[np.ndarray], direction: Sequence[np.ndarray],
                 eps: float = 1e-6) -> float:
    """Directional derivative of ``f(*arrays)`` along ``direction`` by central differences:
    ``(f(x + eps d) - f(x - eps d)) / (2 eps)``.

    ``arrays`` (float64) are perturbed *in place* -- so ``f`` may hold references to them -- and are
    restored bit-for-bit afterwards, also when ``f`` raises. ``direction`` holds one array per
    entry of ``arrays`` (same shapes; ``None`` means zero for that array).
    """
    arrays = _as_list(arrays, "arrays")
    direction = list(direction) if not isinstance(direction, np.ndarray) else [direction]
    if len(direction) != len(arrays):
        raise ValueError(f"direction has {len(direction)} entries for {len(arrays)} arrays")
    _check_inputs(arrays)
    eps = float(eps)
    if not eps > 0:
        raise ValueError(f"eps must be > 0, got {eps}")
    pairs = []
    for k, (a, d) in enumerate(zip(arrays, direction)):
        if d is None:
            continue
        d = np.asarray(d, dtype=np.float64)
        if d.shape != a.shape:
            raise ValueError(f"direction[{k}] has shape {d.shape}, arrays[{k}] has shape {a.shape}")
        pairs.append((a, d))
    saved = [a.copy() for a, _ in pairs]
    try:
        for (a, d), s in zip(pairs, saved):
            np.add(s, eps * d, out=a)
        fp = _eval(f, arrays)
        for (a, d), s in zip(pairs, saved):
            np.subtract(s, eps * d, out=a)
        fm = _eval(f, arrays)
    finally:
        for (a, _), s in zip(pairs, saved):
            a[...] = s
    return (fp - fm) / (2.0 * eps)


def _coord_diff(f, arrays, k, j, eps):
    """Central difference along coordinate ``j`` (flat index) of ``arrays[k]``, using the step that
    was actually representable (``(x+eps) - (x-eps)``), restoring the element exactly."""
    a = arrays[k]
    idx = np.unravel_index(j, a.shape)
    x0 = a[idx]
    xp, xm = x0 + eps, x0 - eps
    try:
        a[idx] = xp
        fp = _eval(f, arrays)
        a[idx] = xm
        fm = _eval(f, arrays)
    finally:
        a[idx] = x0
    return (fp - fm) / (xp - xm)


# ----------------------------------------------------------------------------------------------- reports

@dataclasses.dataclass(frozen=True)
class GradCheck:
    """One comparison: ``kind`` is ``"proj"`` or ``"coord"``; ``array`` the array index (``None`` for
    projections, which span all arrays); ``index`` the coordinate (tuple) or projection number."""
    kind: str
    array: int | None
    index: object
    analytic: float
    numeric: float
    abs_err: float
    rel_err: float
    tol: float

    @property
    def ok(self) -> bool:
        return self.abs_err <= self.tol

    @property
    def err_ratio(self) -> float:
        """``abs_err / tol``; the check passes iff this is ``<= 1``."""
        return self.abs_err / self.tol if self.tol > 0 else (0.0 if self.abs_err == 0 else math.inf)

    def describe(self) -> str:
        where = (f"projection #{self.index} (random unit direction over all arrays)" if self.kind == "proj"
                 else f"arrays[{self.array}] at coordinate {self.index}")
        return (f"{where}: analytic={self.analytic:.10g} numeric={self.numeric:.10g} "
                f"|diff|={self.abs_err:.3g} rel_err={self.rel_err:.3g} tol={self.tol:.3g}")


@dataclasses.dataclass
class GradReport:
    """Result of a passing :func:`check_grad`: the worst relative error, how many comparisons were
    made, and every comparison (:class:`GradCheck`) in ``details``."""
    max_rel_err: float
    n_checks: int
    details: list = dataclasses.field(default_factory=list)

    @property
    def max_err_ratio(self) -> float:
        """Largest ``abs_err / tol`` over the checks (<= 1 when the check passed)."""
        return max((c.err_ratio for c in self.details), default=0.0)

    def __str__(self):
        return (f"GradReport(n_checks={self.n_checks}, max_rel_err={self.max_rel_err:.3g}, "
                f"max_err_ratio={self.max_err_ratio:.3g})")


_NOISE_ULPS = 32.0
_EPS64 = float(np.finfo(np.float64).eps)


def _make_check(kind, array, index, a, n, scale, rtol, atol, noise):
    err = abs(a - n)
    ref = max(abs(a), abs(n), scale)
    tol = atol + rtol * ref + noise
    floor = max(ref, atol / rtol) if rtol > 0 else ref
    rel = err / floor if floor > 0 else (0.0 if err == 0 else math.inf)
    if not math.isfinite(n):
        err = rel = math.inf
    return GradCheck(kind, array, index, float(a), float(n), float(err), float(rel), float(tol))


# ---------------------------------------------------------------------------------------------- checker

def check_grad(f: Callable[..., float], arrays: Sequence[np.ndarray], grads: Sequence[np.ndarray], *,
               eps: float = 1e-6, rtol: float = 1e-5, atol: float = 1e-9, n_proj: int = 3,
               n_coords: int = 8, seed: int = 0) -> GradReport:
    """Check analytic gradients ``grads`` of ``f(*arrays) -> float`` against central differences.

    ``arrays`` are float64 and are perturbed in place and restored exactly; ``grads`` have the same
    shapes. Runs ``n_proj`` random-projection checks and ``n_coords`` sampled-coordinate checks per
    array (see the module docstring for the exact pass criterion), all drawn from
    ``numpy.random.default_rng(seed)``. Raises ``AssertionError`` listing every failing comparison;
    returns a :class:`GradReport` when all pass.
    """
    arrays = _as_list(arrays, "arrays")
    grads = _as_list(grads, "grads")
    if len(grads) != len(arrays):
        raise ValueError(f"got {len(grads)} gradients for {len(arrays)} arrays")
    _check_inputs(arrays)
    gs = []
    for k, (a, g) in enumerate(zip(arrays, grads)):
        g = np.asarray(g, dtype=np.float64)
        if g.shape != a.shape:
            raise ValueError(f"grads[{k}] has shape {g.shape}, arrays[{k}] has shape {a.shape}")
        if not np.all(np.isfinite(g)):
            raise AssertionError(f"grads[{k}] contains non-finite values")
        gs.append(g)
    rng = np.random.default_rng(seed)
    f0 = _eval(f, arrays)
    if not math.isfinite(f0):
        raise AssertionError(f"f(*arrays) is not finite: {f0}")
    noise = _NOISE_ULPS * _EPS64 * abs(f0) / float(eps)

    checks = []
    n_total = sum(a.size for a in arrays)
    if n_total and n_proj > 0:
        g_norm = math.sqrt(sum(float(np.vdot(g, g)) for g in gs))
        proj_scale = g_norm / math.sqrt(n_total)
        for p in range(n_proj):
            d = [rng.standard_normal(a.shape) for a in arrays]
            dn = math.sqrt(sum(float(np.vdot(x, x)) for x in d))
            d = [x / dn for x in d]
            a_val = sum(float(np.vdot(g, x)) for g, x in zip(gs, d))
            n_val = central_diff(f, arrays, d, eps)
            checks.append(_make_check("proj", None, p, a_val, n_val, proj_scale, rtol, atol, noise))
    for k, (a, g) in enumerate(zip(arrays, gs)):
        if a.size == 0 or n_coords <= 0:
            continue
        scale = float(np.linalg.norm(g)) / math.sqrt(g.size)
        picks = rng.choice(a.size, size=min(n_coords, a.size), replace=False)
        for j in np.sort(picks):
            j = int(j)
            n_val = _coord_diff(f, arrays, k, j, eps)
            a_val = float(g.reshape(-1)[j])
            idx = tuple(int(i) for i in np.unravel_index(j, a.shape))
            checks.append(_make_check("coord", k, idx, a_val, n_val, scale, rtol, atol, noise))

    bad = [c for c in checks if not c.ok]
    if bad:
        shown = "\n  ".join(c.describe() for c in bad[:12])
        more = f"\n  ... and {len(bad) - 12} more" if len(bad) > 12 else ""
        raise AssertionError(
            f"gradient check failed: {len(bad)} of {len(checks)} comparisons outside "
            f"|a-n| <= atol + rtol*max(|a|,|n|,scale) + noise (rtol={rtol:g}, atol={atol:g}, "
            f"noise={noise:.3g}, eps={eps:g}, "
            f"seed={seed}, shapes={[a.shape for a in arrays]}):\n  {shown}{more}")
    max_rel = max((c.rel_err for c in checks), default=0.0)
    return GradReport(max_rel_err=max_rel, n_checks=len(checks), details=checks)


def assert_grad_close(f, arrays, grads, **kwargs) -> GradReport:
    """Alias of :func:`check_grad` (same arguments, same behaviour)."""
    return check_grad(f, arrays, grads, **kwargs)


# ------------------------------------------------------------------------------------ Hypothesis strategies

def shapes(min_dims: int = 1, max_dims: int = 3, min_side: int = 1, max_side: int = 8):
    """Hypothesis strategy for array shapes (tuples of ints)."""
    from hypothesis.extra import numpy as hnp
    return hnp.array_shapes(min_dims=min_dims, max_dims=max_dims, min_side=min_side, max_side=max_side)


def float64_arrays(shape, scale: float = 1.0):
    """Hypothesis strategy for float64 arrays of ``shape`` (a tuple or a strategy of tuples) with finite
    entries in ``[-scale, scale]`` (no NaN/inf; subnormals excluded so differences stay meaningful)."""
    from hypothesis import strategies as st
    from hypothesis.extra import numpy as hnp
    scale = float(scale)
    elems = st.floats(-scale, scale, allow_nan=False, allow_infinity=False, allow_subnormal=False,
                      width=64)
    return hnp.arrays(np.float64, shape, elements=elems)


def seeds():
    """Hypothesis strategy for RNG seeds (``0 <= seed < 2**32``)."""
    from hypothesis import strategies as st
    return st.integers(min_value=0, max_value=2**32 - 1)
