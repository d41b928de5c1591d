"""Bounded-horizon local training: ``local_loss_and_grad`` against finite differences of the right
objectives, the stage split, and the RGC buffer's post/close protocol (also from several threads).

The objectives. Stage k owns blocks [lo_k, hi_k) (stage 0 also the embeddings) and learns from its own
loss L_k = CE(decoder(h_k), y), h_k the output of its last block. Its INPUT h_{k-1} is a constant for
it: no gradient crosses a stage boundary. Because h_{k-1} is computed by earlier stages only, the
derivative of L_k w.r.t. theta_k with h_{k-1} held constant is simply the ordinary derivative of L_k
w.r.t. theta_k -- so a central difference of ``losses[k]`` alone is the reference, while the later
losses L_{j>k}, which do change with theta_k, must NOT enter theta_k's gradient. The shared decoder
gets the RGC consensus: the mean over k of dL_k/d(decoder), i.e. d mean(losses) / d(decoder).
"""
import threading

import numba
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import nbrgc
from nbrgc.config import ModelConfig
from nbrgc.errors import ConfigError
from nbrgc.kernels.atomics import fetch_add, load, store
from nbrgc.local import RGCBuffer, split_stages, stage_param_ranges, stage_sumsq
from nbrgc.model import Model
from nbrgc.testing import check_grad, central_diff, seeds

from conftest import numba_threads
from contention import contended, run_threads


def _model(n_layer, seed, d=8, H=2, vocab=24, ctx=6):
    cfg = ModelConfig(n_layer=n_layer, d_model=d, n_head=H, ctx=ctx, vocab=vocab)
    m = Model(cfg, seed=seed, dtype=np.float64)
    # off the special init point (unit LN gains, zero biases), and larger weights so that every stage
    # visibly changes the later stages' losses
    m.flat += 0.1 * np.random.default_rng(seed + 1).standard_normal(m.flat.shape)
    return m


def stage_losses(model, x, y, stages):
    """Independent reference: L_k is the loss of the network truncated after stage k."""
    B, T = x.shape
    out = []
    for _, hi in stages:
        ws = model.workspace(B, T, 0, hi)
        h = model.forward_blocks(model.embed(x, ws), 0, hi, ws)
        out.append(float(model.decoder_loss(h, y, ws)))
    return out


@st.composite
def local_case(draw):
    n_layer = draw(st.sampled_from([2, 4]), label="n_layer")
    K = draw(st.sampled_from([k for k in (1, 2, 4) if n_layer % k == 0]), label="K")
    B, T = draw(st.integers(1, 3), label="B"), draw(st.integers(1, 6), label="T")
    H = draw(st.sampled_from([1, 2]), label="heads")
    return n_layer, K, B, T, H, draw(seeds(), label="seed")


@settings(max_examples=25, deadline=None)
@given(local_case())
def test_local_gradients_vs_finite_differences(case):
    n_layer, K, B, T, H, seed = case
    with numba_threads(1):
        _check_local(n_layer, K, B, T, H, seed)


def _check_local(n_layer, K, B, T, H, seed):
    model = _model(n_layer, seed % 1000, H=H)
    rng = np.random.default_rng(seed)
    x = rng.integers(0, model.cfg.vocab, (B, T)).astype(np.int32)
    y = rng.integers(0, model.cfg.vocab, (B, T)).astype(np.int32)
    stages = split_stages(n_layer, K)
    losses, grads = nbrgc.local_loss_and_grad(model, x, y, n_stages=K)
    assert len(losses) == K
    np.testing.assert_allclose(losses, stage_losses(model, x, y, stages), rtol=1e-13)
    assert losses[-1] == pytest.approx(model.loss(x, y), rel=1e-13)  # the last is the full network's
    G = model.grad_flat.copy()
    ranges = stage_param_ranges(model.layout, stages)
    dlo, dhi = model.layout.decoder_range
    assert ranges[0][0] == 0 and ranges[-1][1] == dlo  # stages + decoder tile the flat buffer
    assert all(ranges[k][1] == ranges[k + 1][0] for k in range(K - 1))

    all_losses = lambda: stage_losses(model, x, y, stages)  # noqa: E731
    flat0 = model.flat.copy()
    for k, (plo, phi) in enumerate(ranges):
        theta = model.flat[plo:phi]  # a view: check_grad perturbs the model in place
        # (a) the reported gradient is dL_k/d theta_k, L_k alone ...
        check_grad(lambda _: all_losses()[k], [theta], [G[plo:phi]], n_proj=2, n_coords=4,
                   seed=seed + k)
        # ... though theta_k does move the later losses (so ignoring them is a real property, which a
        # check against the global objective sum_{j>=k} L_j would have flagged), and never the earlier
        d = np.random.default_rng(seed + 100 + k).standard_normal(theta.shape)
        d /= np.linalg.norm(d)
        before = all_losses()
        saved = theta.copy()
        theta += 1e-3 * d
        after = all_losses()
        theta[...] = saved
        assert after[:k] == before[:k], f"stage {k} params changed earlier losses"
        assert after[k] != before[k]
        if k + 1 < K:
            d_own = central_diff(lambda _: all_losses()[k], [theta], [d], 1e-6)
            d_all = central_diff(lambda _: sum(all_losses()[k:]), [theta], [d], 1e-6)
            reported = float(G[plo:phi] @ d)
            assert abs(reported - d_own) <= 1e-5 * max(abs(d_own), 1e-3) + 1e-8
            assert abs(d_all - d_own) > 1e-3 * max(abs(d_own), abs(d_all)) + 1e-7, (
                f"later losses do not depend on stage {k}: the test would be vacuous")
    np.testing.assert_array_equal(model.flat, flat0)  # every perturbation was undone exactly

    # (b) decoder: the mean over stages of dL_k/d(decoder) = d mean(losses) / d(decoder)
    dec = model.flat[dlo:dhi]
    check_grad(lambda _: float(np.mean(all_losses())), [dec], [G[dlo:dhi]], n_proj=3, n_coords=6,
               seed=seed + 77)


@pytest.mark.parametrize("n_layer,T", [(2, 5), (4, 1), (3, 6)])
def test_one_stage_is_exactly_backprop(n_layer, T):
    model = _model(n_layer, 3)
    rng = np.random.default_rng(4)
    x = rng.integers(0, 24, (2, T)).astype(np.int32)
    y = rng.integers(0, 24, (2, T)).astype(np.int32)
    loss, _ = model.loss_and_grad(x, y)
    g = model.grad_flat.copy()
    model.grad_flat[...] = np.nan  # local_loss_and_grad must overwrite all of it
    losses, grads = nbrgc.local_loss_and_grad(model, x, y, n_stages=1)
    assert losses == [loss]
    assert np.array_equal(model.grad_flat, g)
    for n, a in grads.items():
        assert np.shares_memory(a, model.grad_flat), n
    # float32 too
    m32 = Model(model.cfg, seed=3)
    l32, _ = m32.loss_and_grad(x, y)
    g32 = m32.grad_flat.copy()
    ls32, _ = nbrgc.local_loss_and_grad(m32, x, y, n_stages=1)
    assert ls32 == [l32] and np.array_equal(m32.grad_flat, g32)


def test_local_loss_and_grad_overwrites_and_repeats():
    model = _model(4, 0)
    x = np.arange(12, dtype=np.int32).reshape(2, 6) % 24
    a = nbrgc.local_loss_and_grad(model, x, x, n_stages=2)[0]
    g = model.grad_flat.copy()
    model.grad_flat[...] = 123.0
    b = nbrgc.local_loss_and_grad(model, x, x, n_stages=2)[0]
    assert a == b and np.array_equal(model.grad_flat, g)
    with pytest.raises(ConfigError, match="divide"):
        nbrgc.local_loss_and_grad(model, x, x, n_stages=3)
    with pytest.raises(ConfigError, match="ctx"):
        nbrgc.local_loss_and_grad(model, np.zeros((1, 7), np.int32), np.zeros((1, 7), np.int32), 2)


# ------------------------------------------------------------------------------------------ split_stages

def test_split_stages():
    assert split_stages(4, 1) == [(0, 4)]
    assert split_stages(4, 2) == [(0, 2), (2, 4)]
    assert split_stages(4, 4) == [(0, 1), (1, 2), (2, 3), (3, 4)]
    assert split_stages(24, 3) == [(0, 8), (8, 16), (16, 24)]
    assert split_stages(6, np.int64(2)) == [(0, 3), (3, 6)]


@pytest.mark.parametrize("n_layer,K,match", [
    (4, 3, r"n_stages \(3\) must divide n_layer \(4\)"), (2, 4, "must divide"), (4, 0, "positive"),
    (4, -2, "positive"), (4, True, "positive"), (4, 2.0, "positive"), (4, "2", "positive")])
def test_split_stages_errors(n_layer, K, match):
    with pytest.raises(ConfigError, match=match):
        split_stages(n_layer, K)


# ------------------------------------------------------------------------------------------- RGCBuffer

def test_rgc_buffer_post_close_single_thread():
    K, n = 3, 5
    buf = RGCBuffer(K, n, np.float64, n_rounds=2)
    rng = np.random.default_rng(0)
    for t in range(6):
        vals = rng.standard_normal((K, n))
        order = rng.permutation(K)
        flags = []
        for k in order:
            buf.slot(t, k)[...] = vals[k]
            flags.append(buf.post(t, k))
        assert flags == [False] * (K - 1) + [True]  # the K-th poster, whoever it is, closes
        assert buf.counters[t % 2] == K
        mean = buf.close(t)
        assert buf.counters[t % 2] == 0  # reset for the round's next use
        np.testing.assert_allclose(mean, vals.mean(axis=0), rtol=1e-14, atol=1e-15)
        # slots summed in stage order: bitwise independent of the arrival order
        ref = vals[0].copy()
        for k in range(1, K):
            ref += vals[k]
        ref *= 1.0 / K
        assert np.array_equal(mean, ref)
    # rounds map to slots t mod n_rounds
    assert np.shares_memory(buf.slot(0, 1), buf.slot(2, 1))
    assert not np.shares_memory(buf.slot(0, 1), buf.slot(1, 1))
    assert buf.nbytes() == buf.slots.nbytes + buf.counters.nbytes + buf.mean.nbytes


def test_rgc_buffer_one_stage():
    buf = RGCBuffer(1, 4, np.float32)
    buf.slot(0, 0)[...] = [1, 2, 3, 4]
    assert buf.post(0, 0)
    np.testing.assert_array_equal(buf.close(0), [1, 2, 3, 4])


@pytest.mark.parametrize("K,n_rounds", [(4, 1), (8, 3)])
def test_rgc_buffer_from_threads(K, n_rounds):
    """K threads post every round concurrently; exactly one closer per round, with the right mean."""
    rounds, n = 150, 16
    buf = RGCBuffer(K, n, np.float64, n_rounds=n_rounds)
    vals = np.random.default_rng(1).standard_normal((rounds, K, n))
    closers = np.full((rounds, K), False)
    means = np.zeros((rounds, n))
    barrier = threading.Barrier(K)
    errors = []

    def worker(k):
        try:
            for t in range(rounds):
                buf.slot(t, k)[...] = vals[t, k]
                barrier.wait()  # everyone's slot is written; now all post at once
                if buf.post(t, k):
                    closers[t, k] = True
                    means[t] = buf.close(t)
                barrier.wait()  # the round is closed before its slots are reused
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)
            barrier.abort()

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(K)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=60)
    assert not any(th.is_alive() for th in threads)
    assert not errors, errors
    np.testing.assert_array_equal(closers.sum(axis=1), np.ones(rounds))
    np.testing.assert_allclose(means, vals.mean(axis=1), rtol=1e-13, atol=1e-15)
    assert np.all(buf.counters == 0)


@numba.njit(nogil=True)
def _post_many(counters, r, K, n, plain, progress, me):
    """Posts to round r the way RGCBuffer.post makes them (fetch-and-add, the completing poster is
    the one that saw K-1), from compiled code without the GIL, until every thread has made ``n``
    (tests/contention.py: the posts overlap by construction); ``plain[0]`` is a non-atomic control
    counter read before and written after each post. Returns (closes, posts) of this thread."""
    closes = done = 0
    while True:
        v = plain[0]
        if fetch_add(counters, r, 1) == K - 1:
            closes += 1
        plain[0] = v + 1
        done += 1
        store(progress, me, done)
        if done >= n:
            low = load(progress, 0)
            for j in range(1, progress.size):
                low = min(low, load(progress, j))
            if low >= n:
                return closes, done


def test_rgc_counter_is_atomic_under_contention():
    """Threads posting into one round at once, in nogil loops: no post is lost, and exactly one post
    ever sees the counter at K-1 (not reset here, so it passes K-1 only once), in a run whose plain
    control counter lost increments (the posts really overlapped)."""
    K, per_thread, n_threads = 4, 50_000, 4
    buf = RGCBuffer(K, 1, np.float64)
    plain = np.zeros(1, np.int64)
    _post_many(np.zeros(1, np.int64), 0, K, 1, plain, np.zeros(1, np.int64), 0)  # compile first

    def once():
        buf.counters[:] = 0
        plain[0] = 0
        closes, posts = np.zeros(n_threads, np.int64), np.zeros(n_threads, np.int64)
        progress = np.zeros(n_threads, np.int64)

        def worker(k):
            closes[k], posts[k] = _post_many(buf.counters, 0, K, per_thread, plain, progress, k)

        run_threads(n_threads, worker, lambda k: (k,))
        assert posts.min() >= per_thread
        assert buf.counters[0] == posts.sum()
        assert closes.sum() == 1
        return int(plain[0]), int(posts.sum())

    contended(once)
    # and RGCBuffer.post itself counts through the same counter
    buf.counters[:] = 0
    assert [buf.post(0, k) for k in range(K)] == [False] * (K - 1) + [True]
    assert fetch_add(buf.counters, 0, 0) == K


def test_stage_sumsq():
    G = np.arange(10, dtype=np.float64)
    gdec = np.array([1.0, 2.0], np.float32)
    assert stage_sumsq(G, 2, 5, gdec) == 4 + 9 + 16 + 1 + 4


# ------------------------------------------------------------------------------------------ consensus

@pytest.mark.parametrize("consensus", ["depth", "last"])
def test_weighted_consensus_is_the_weighted_sum_of_the_stage_decoder_gradients(consensus):
    """The decoder gets sum_k w_k dL_k/d(decoder) (finite differences of that weighted loss); the
    blocks' gradients do not depend on the consensus; ``last`` is stage K-1's gradient exactly."""
    model = _model(4, 3)
    x = (np.arange(12, dtype=np.int32).reshape(2, 6) * 7) % 24
    y = (x + 5) % 24
    stages = split_stages(4, 4)
    w = nbrgc.local.consensus_weights(consensus, 4)
    nbrgc.local_loss_and_grad(model, x, y, n_stages=4)
    uniform = model.grad_flat.copy()
    nbrgc.local_loss_and_grad(model, x, y, n_stages=4, consensus=consensus)
    lo, hi = model.layout.decoder_range
    assert np.array_equal(model.grad_flat[:lo], uniform[:lo])
    i = lo + 3  # a decoder weight
    d = np.zeros_like(model.flat)
    d[i] = 1.0
    num = central_diff(lambda flat: float(np.dot(w, stage_losses(model, x, y, stages))), [model.flat], [d])
    assert abs(model.grad_flat[i] - num) < 1e-7 * max(1.0, abs(num))
    if consensus == "last":
        model.grad_flat[...] = 0.0
        ws = model.workspace(2, 6)
        h = model.forward_blocks(model.embed(x, ws), 0, 4, ws)
        gdec = np.zeros(hi - lo)
        model.decoder_loss_and_grad(h, y, ws, gdec=gdec)
        nbrgc.local_loss_and_grad(model, x, y, n_stages=4, consensus="last")
        assert np.array_equal(model.grad_flat[lo:hi], gdec)
    with pytest.raises(ConfigError, match="uniform, depth or last"):
        nbrgc.local.consensus_weights("median", 4)
