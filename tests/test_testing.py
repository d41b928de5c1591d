import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from nbrgc.testing import (GradReport, assert_grad_close, central_diff, check_grad, float64_arrays,
                           seeds, shapes)

SETTINGS = settings(max_examples=25, deadline=None)


# ------------------------------------------------------------------------------ functions and gradients

def sumsq(x):
    return float(np.sum(x * x))


def sumsq_grad(x):
    return 2.0 * x


def tanh_matmul(a, b):
    return float(np.sum(np.tanh(a @ b)))


def tanh_matmul_grads(a, b):
    s = 1.0 - np.tanh(a @ b) ** 2
    return s @ b.T, a.T @ s


def logsumexp(x):
    m = x.max()
    return float(m + np.log(np.exp(x - m).sum()))


def logsumexp_grad(x):
    e = np.exp(x - x.max())
    return e / e.sum()


def softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _rng_arrays(seed, *shape_list, scale=1.0):
    rng = np.random.default_rng(seed)
    return [scale * rng.standard_normal(s) for s in shape_list]


# ---------------------------------------------------------------------------------- passes when correct

@SETTINGS
@given(st.data())
def test_sumsq_passes(data):
    x = data.draw(float64_arrays(data.draw(shapes()), scale=2.0))
    rep = check_grad(sumsq, [x], [sumsq_grad(x)], seed=data.draw(seeds()))
    assert isinstance(rep, GradReport) and rep.n_checks >= 3 + min(8, x.size)
    assert rep.max_rel_err < 1e-5 and rep.max_err_ratio <= 1.0


@SETTINGS
@given(st.integers(1, 5), st.integers(1, 5), st.integers(1, 5), float64_arrays((5, 5), 1.5),
       float64_arrays((5, 5), 1.5), seeds())
def test_tanh_matmul_passes(m, k, n, a_full, b_full, seed):
    a = np.ascontiguousarray(a_full[:m, :k])
    b = np.ascontiguousarray(b_full[:k, :n])
    ga, gb = tanh_matmul_grads(a, b)
    check_grad(tanh_matmul, [a, b], [ga, gb], seed=seed)


@SETTINGS
@given(st.data())
def test_logsumexp_passes(data):
    x = data.draw(float64_arrays(data.draw(shapes(max_dims=2, max_side=10)), scale=5.0))
    check_grad(logsumexp, [x], [logsumexp_grad(x)], seed=data.draw(seeds()))


@SETTINGS
@given(st.data())
def test_docstring_softmax_example(data):
    shape = data.draw(shapes(min_dims=1, max_dims=3))
    x = data.draw(float64_arrays(shape, scale=3.0))
    w = data.draw(float64_arrays(shape))

    def f(x):
        return float((w * softmax(x)).sum())

    p = softmax(x)
    g = p * (w - (w * p).sum(axis=-1, keepdims=True))
    assert_grad_close(f, [x], [g], seed=data.draw(seeds()))


def test_single_array_and_zero_gradient():
    x = np.zeros(4)
    check_grad(lambda x: 3.0, x, np.zeros(4))           # constant f, bare arrays accepted
    check_grad(sumsq, [x], [np.zeros(4)])               # zero gradient at the minimum


# ----------------------------------------------------------------------------------- fails when wrong

@SETTINGS
@given(seeds(), st.sampled_from(["sumsq", "tanh", "lse"]))
def test_scaled_gradient_fails(seed, which):
    """A gradient 1% too large must be caught (the random projections see every coordinate)."""
    if which == "sumsq":
        (x,) = _rng_arrays(seed, (3, 4))
        f, arrays, grads = sumsq, [x], [sumsq_grad(x)]
    elif which == "tanh":
        a, b = _rng_arrays(seed, (3, 4), (4, 2))
        f, arrays, grads = tanh_matmul, [a, b], list(tanh_matmul_grads(a, b))
    else:
        (x,) = _rng_arrays(seed, (7,), scale=2.0)
        f, arrays, grads = logsumexp, [x], [logsumexp_grad(x)]
    check_grad(f, arrays, grads, seed=seed)  # sanity: the correct one passes
    bad = [g * 1.01 for g in grads]
    with pytest.raises(AssertionError, match="gradient check failed"):
        check_grad(f, arrays, bad, seed=seed)


@SETTINGS
@given(seeds(), st.integers(0, 63))
def test_one_perturbed_coordinate_fails(seed, j):
    """One wrong entry of a 64-element gradient is caught even though n_coords=2 probably misses it."""
    a, b = _rng_arrays(seed, (8, 8), (8, 3))
    ga, gb = tanh_matmul_grads(a, b)
    ga = ga.copy()
    ga.reshape(-1)[j] += 0.05 * (np.abs(ga).max() + 1e-3)
    with pytest.raises(AssertionError):
        check_grad(tanh_matmul, [a, b], [ga, gb], n_coords=2, seed=seed)


def test_failure_message_is_readable():
    (x,) = _rng_arrays(1, (4,))
    g = sumsq_grad(x)
    g[2] += 1.0
    with pytest.raises(AssertionError) as ei:
        check_grad(sumsq, [x], [g], n_proj=0, n_coords=4)
    msg = str(ei.value)
    assert "arrays[0] at coordinate (2,)" in msg
    assert f"analytic={g[2]:.10g}" in msg and "numeric=" in msg and "rel_err=" in msg
    assert "1 of 4 comparisons" in msg


def test_wrong_gradient_in_second_array_names_it():
    a, b = _rng_arrays(3, (2, 3), (3, 2))
    ga, gb = tanh_matmul_grads(a, b)
    with pytest.raises(AssertionError, match=r"arrays\[1\] at coordinate"):
        check_grad(tanh_matmul, [a, b], [ga, -gb], n_proj=0)


def test_bad_inputs():
    x = np.ones(3)
    with pytest.raises(ValueError):
        check_grad(sumsq, [x], [np.ones(4)])
    with pytest.raises(TypeError):
        check_grad(sumsq, [np.ones(3, np.float32)], [np.ones(3)])
    with pytest.raises(AssertionError, match="not finite"):
        check_grad(lambda x: float("nan"), [x], [x])


# ------------------------------------------------------------------------------------------ central_diff

@SETTINGS
@given(st.data())
def test_central_diff_restores_exactly_and_matches(data):
    shape = data.draw(shapes(max_dims=2))
    x = data.draw(float64_arrays(shape, scale=1e3))
    y = data.draw(float64_arrays((3,)))
    d = [data.draw(float64_arrays(shape)), data.draw(float64_arrays((3,)))]
    x0, y0 = x.copy(), y.copy()
    seen = []

    def f(x, y):
        seen.append(x.copy())
        return float(np.sum(np.sin(x)) + np.sum(y ** 3))

    v = central_diff(f, [x, y], d, eps=1e-6)
    assert x.tobytes() == x0.tobytes() and y.tobytes() == y0.tobytes()   # bit-for-bit
    assert len(seen) == 2
    exact = float(np.sum(np.cos(x0) * d[0]) + np.sum(3 * y0 ** 2 * d[1]))
    scale = np.linalg.norm(d[0]) + 3 * np.linalg.norm(d[1]) + 1.0
    assert abs(v - exact) <= 1e-5 * scale + 1e-9 * np.abs(x0).sum()  # + rounding of x+eps*d


def test_central_diff_restores_when_f_raises():
    x = np.arange(5.0)
    x0 = x.copy()
    calls = []

    def f(x):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("boom")
        return float(x.sum())

    with pytest.raises(RuntimeError):
        central_diff(f, [x], [np.ones(5)])
    assert x.tobytes() == x0.tobytes()


def test_check_grad_restores_arrays():
    a, b = _rng_arrays(7, (3, 3), (3, 2))
    a0, b0 = a.copy(), b.copy()
    check_grad(tanh_matmul, [a, b], list(tanh_matmul_grads(a, b)))
    assert a.tobytes() == a0.tobytes() and b.tobytes() == b0.tobytes()
