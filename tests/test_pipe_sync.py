"""pipe-sync: the objective of nbrgc.horizon with the delays of an asynchronous pipeline, run stage by
stage. Its corners are the schemes it generalises, bit for bit (rgc-sync, rgc-async with staleness S,
backprop); with no delay it follows the reference gradient of nbrgc.local_loss_and_grad; with a delay
the late gradients arrive exactly when the documented rule says; and its trajectory does not depend
on evaluations, checkpoints, stops or resumes."""
import numpy as np
import pytest

import nbrgc
from nbrgc.config import TrainConfig, preset
from nbrgc.data import Batches
from nbrgc.errors import ConfigError
from nbrgc.model import Model
from nbrgc.schemes import make_scheme
from nbrgc.schemes.pipe_sync import delays

from conftest import numba_threads
from test_pipeline_state import assert_cadence_and_resume_keep, data, run as run_trainer  # noqa: F401
from test_schemes import TINY4, losses, run, stage_losses, text  # noqa: F401  (data, text: fixtures)


def test_corner_rgc_sync(text):
    kw = dict(cfg=TINY4, steps=10, lr=3e-3, warmup=3, grad_clip=0.5, n_stages=4)
    with numba_threads(1):
        ref, m_ref = run("rgc-sync", text, **kw)
        got, m_got = run("pipe-sync", text, horizon=0, aux_weight=1.0, max_staleness=0, **kw)
    assert stage_losses(got).tolist() == stage_losses(ref).tolist()
    assert [r.grad_norm for r in got] == [r.grad_norm for r in ref]
    assert np.array_equal(m_got.flat, m_ref.flat)


@pytest.mark.parametrize("S", [1, 2])
def test_corner_rgc_async(text, S):
    kw = dict(cfg=TINY4, steps=10, lr=3e-3, warmup=3, grad_clip=0.5, n_stages=4, max_staleness=S)
    ref, m_ref = run("rgc-async", text, stage_threads="1", **kw)
    with numba_threads(1):
        got, m_got = run("pipe-sync", text, horizon=0, aux_weight=1.0, **kw)
    assert stage_losses(got).tolist() == stage_losses(ref).tolist()
    assert np.array_equal(m_got.flat, m_ref.flat)


def test_corner_backprop(text):
    kw = dict(cfg=TINY4, steps=8, lr=3e-3, warmup=3, grad_clip=0.0)
    with numba_threads(1):
        bp, m_bp = run("bp", text, **kw)
        got, m_got = run("pipe-sync", text, n_stages=4, boundary_delay=0, max_staleness=0, **kw)
    assert losses(got).tolist() == losses(bp).tolist()
    assert np.array_equal(m_got.flat, m_bp.flat)


@pytest.mark.parametrize("horizon,aux,consensus", [("2", 0.5, "uniform"), ("all", 1.0, "depth"),
                                                   ("all", 0.25, "uniform"), ("1", 1.0, "last")])
def test_no_delay_follows_the_reference_gradient(text, horizon, aux, consensus):
    """rgc-sync with a horizon (no delay, no staleness): the first step's gradient is the reference's;
    the same holds at every step, checked on a float64 model over several steps."""
    cfg = TINY4
    K = 4 if horizon != "2" else 2
    tc = TrainConfig(mode="rgc-sync", steps=4, batch=2, n_stages=K, horizon=horizon, aux_weight=aux,
                     consensus=consensus, grad_clip=0.0, lr=1e-3, warmup=1)
    tc.validate_for(cfg)
    model = Model(cfg, seed=3, dtype=np.float64)
    ref = Model(cfg, seed=3, dtype=np.float64)
    sc = make_scheme(model, tc)
    batches = Batches(text, 2, 16, seed=0)
    dlo, dhi = model.layout.decoder_range
    with numba_threads(1):
        for t in range(4):
            x, y = batches.next()
            ref.flat[...] = model.flat
            want_losses, _ = nbrgc.local_loss_and_grad(ref, x, y, K, consensus=consensus,
                                                        horizon=horizon, aux_weight=aux)
            sc.submit(t, x, y, 1e-3)
            (res,) = sc.poll()
            np.testing.assert_allclose(res.stage_losses, want_losses, rtol=1e-13)
            np.testing.assert_allclose(model.grad_flat[:dlo], ref.grad_flat[:dlo], rtol=1e-10,
                                       atol=1e-14)
            np.testing.assert_allclose(sc.rgc.mean, ref.grad_flat[dlo:dhi], rtol=1e-10, atol=1e-14)


def test_delays_rule():
    assert delays(4, "all", 1) == [3, 2, 1, 0]
    assert delays(4, "all", 2) == [6, 4, 2, 0]
    assert delays(4, 1, 1) == [1, 1, 1, 0]
    assert delays(4, 0, 3) == [0, 0, 0, 0]


def test_late_gradients_arrive_when_the_rule_says(text):
    """Pipelined backprop (aux 0): stage k gets no gradient before step D_k, then the true gradient of
    micro-batch t - D_k; with weights frozen (lr 0) that is exactly the reference gradient of that
    micro-batch, so the rule is checked against an independent computation."""
    cfg, K, d = TINY4, 4, 1
    tc = TrainConfig(mode="pipe-sync", steps=6, batch=2, n_stages=K, boundary_delay=d,
                     max_staleness=0, grad_clip=0.0, weight_decay=0.0, lr=1e-3, warmup=1)
    model = Model(cfg, seed=2, dtype=np.float64)
    ref = Model(cfg, seed=2, dtype=np.float64)
    sc = make_scheme(model, tc)
    batches = Batches(text, 2, 16, seed=1)
    D = delays(K, "all", d)
    ranges = sc.ranges
    seen = []
    with numba_threads(1):
        for t in range(6):
            x, y = batches.next()
            seen.append((x, y))
            sc.submit(t, x, y, 0.0)  # lr 0: the weights stay where they are
            sc.poll()
            for k, (plo, phi) in enumerate(ranges):
                s = t - D[k]
                if s < 0:
                    assert not model.grad_flat[plo:phi].any(), (t, k)
                    continue
                nbrgc.local_loss_and_grad(ref, *seen[s], K, horizon="all", aux_weight=0.0)
                np.testing.assert_allclose(model.grad_flat[plo:phi], ref.grad_flat[plo:phi],
                                           rtol=1e-10, atol=1e-15)


def test_bad_settings_are_one_line_errors():
    with pytest.raises(ConfigError, match="not 0, one stage"):
        TrainConfig(mode="pipe-sync", n_stages=4, horizon="3", aux_weight=1).validate_for(
            preset("tiny", n_layer=8))
    with pytest.raises(ConfigError, match="no gradient"):
        TrainConfig(mode="rgc-sync", n_stages=4, horizon="2", aux_weight=0).validate_for(
            preset("tiny", n_layer=8))
    with pytest.raises(ConfigError, match="not 0, one stage"):
        TrainConfig(mode="rgc-async", n_stages=4, horizon="3").validate_for(preset("tiny", n_layer=8))
    with pytest.raises(ConfigError, match="no gradient"):
        TrainConfig(mode="pipe-async", n_stages=4, horizon="2", aux_weight=0).validate_for(
            preset("tiny", n_layer=8))
    with pytest.raises(ConfigError, match="horizon"):
        TrainConfig(mode="pipe-sync", horizon="far")
    with pytest.raises(ConfigError, match="aux_weight"):
        TrainConfig(mode="pipe-sync", aux_weight=-1)


@pytest.mark.parametrize("kw", [dict(), dict(horizon="1", aux_weight=1.0, max_staleness=1),
                                dict(horizon="0", aux_weight=1.0, readout_blocks=1)],
                         ids=["pipelined-bp", "one-stage-horizon", "readout-blocks"])
def test_cadence_stop_and_resume_leave_the_trajectory(data, tmp_path, kw):
    kw = dict(mode="pipe-sync", threads=1, stage_threads="auto", boundary_delay=1, **kw)
    assert_cadence_and_resume_keep(data, tmp_path, kw, 4)


@pytest.mark.parametrize("replay", ["stashed", "predicted", "momentum"])
def test_stashed_weights_give_the_exact_delayed_gradient(text, replay):
    """With every stage replaying on the weights its micro-batch's forward used, stage k's gradient at
    step t is the true gradient of micro-batch s = t - D_k at the parameters of step s (decoupled
    backprop with delayed gradients), checked against the reference at the recorded parameters while
    the weights really move (lr > 0). With ``predicted`` the forward of step s runs on the weights
    extrapolated to step s + D_k, W + D_k (W - W_prev), and the gradient is the reference's at
    those."""
    cfg, K = TINY4, 4
    tc = TrainConfig(mode="pipe-sync", steps=7, batch=2, n_stages=K, boundary_delay=1,
                     max_staleness=0, replay_weights=replay, grad_clip=0.0, lr=3e-3, warmup=1)
    model = Model(cfg, seed=4, dtype=np.float64)
    ref = Model(cfg, seed=4, dtype=np.float64)
    sc = make_scheme(model, tc)
    batches = Batches(text, 2, 16, seed=2)
    D = delays(K, "all", 1)
    seen, params = [], []
    with numba_threads(1):
        for t in range(7):
            x, y = batches.next()
            seen.append((x, y))
            before = model.flat.copy()
            moments = [(o.M.copy(), o.V.copy(), o.t) for o in sc.opts]
            sc.submit(t, x, y, 3e-3)
            sc.poll()
            used = before.copy()  # the parameters step t's forward ran on
            for k, (plo, phi) in enumerate(sc.ranges[:-1]):
                used[plo:phi] = sc._rings[f"weights{k}"][t % (D[k] + 1)]
                if replay == "predicted":
                    # W_prev: the weights before the last update (none yet at step 0)
                    prev = last_before[plo:phi] if t else before[plo:phi]
                    want = before[plo:phi] + D[k] * (before[plo:phi] - prev)
                    np.testing.assert_allclose(used[plo:phi], want, rtol=1e-12, atol=1e-15)
                elif replay == "momentum":
                    # D_k of AdamW's current steps ahead (none before its first step)
                    M, V, n = moments[k]
                    want = before[plo:phi].copy()
                    if n:
                        mhat, vhat = M / (1 - 0.9 ** n), V / (1 - 0.95 ** n)
                        want -= D[k] * 3e-3 * mhat / (np.sqrt(vhat) + 1e-8)
                    np.testing.assert_allclose(used[plo:phi], want, rtol=1e-12, atol=1e-15)
                else:
                    assert np.array_equal(used[plo:phi], before[plo:phi])
            last_before = before
            params.append(used)
            for k, (plo, phi) in enumerate(sc.ranges):
                s = t - D[k]
                if s < 0:
                    continue
                ref.flat[...] = params[s]
                nbrgc.local_loss_and_grad(ref, *seen[s], K, horizon="all", aux_weight=0.0)
                np.testing.assert_allclose(model.grad_flat[plo:phi], ref.grad_flat[plo:phi],
                                           rtol=1e-9, atol=1e-14)
            assert not np.array_equal(params[-1], model.flat)


def test_delay_warmup(text):
    """The first N steps have no delay (the zero-delay run's gradients, bit for bit); after them stage
    k waits D_k steps for the first micro-batch after the warm-up, none before it is applied twice."""
    cfg, K, N = TINY4, 4, 3
    kw = dict(cfg=cfg, steps=N, lr=3e-3, warmup=1, n_stages=K, max_staleness=0)
    with numba_threads(1):
        ref, m_ref = run("pipe-sync", text, boundary_delay=0, **kw)
        got, m_got = run("pipe-sync", text, boundary_delay=1, delay_warmup=N, **kw)
    assert stage_losses(got).tolist() == stage_losses(ref).tolist()
    assert np.array_equal(m_got.flat, m_ref.flat)
    tc = TrainConfig(mode="pipe-sync", steps=8, batch=2, n_stages=K, boundary_delay=1,
                     delay_warmup=N, max_staleness=0, lr=3e-3, warmup=1)
    model = Model(cfg, seed=0)
    sc = make_scheme(model, tc)
    batches = Batches(text, 2, 16, seed=2)
    D = delays(K, "all", 1)
    with numba_threads(1):
        for t in range(8):
            sc.submit(t, *batches.next(), 1e-3)
            sc.poll()
            for k, (plo, phi) in enumerate(sc.ranges):
                idle = N <= t < N + D[k]
                assert model.grad_flat[plo:phi].any() != idle, (t, k)


@pytest.mark.parametrize("K,N", [(2, 1), (4, 2)])
def test_readout_block_gradients_vs_finite_differences(K, N):
    """Stage k < K-1 reads its loss through N private blocks: its own parameters and those blocks get
    the gradient of that loss alone (float64 central differences of an independent forward); the last
    stage reads the decoder directly; evaluation ignores the readout blocks."""
    from nbrgc.testing import check_grad
    from test_local import _model
    model = _model(4, 11)
    tc = TrainConfig(mode="rgc-sync", steps=1, batch=2, n_stages=K, readout_blocks=N, grad_clip=0.0,
                     lr=1e-3, warmup=0, weight_decay=0.0)
    sc = make_scheme(model, tc)
    ro = sc.readout
    ro.model.flat += 0.1 * np.random.default_rng(3).standard_normal(ro.model.flat.shape)
    rng = np.random.default_rng(5)
    x = rng.integers(0, 24, (2, 5)).astype(np.int32)
    y = rng.integers(0, 24, (2, 5)).astype(np.int32)

    def loss_k(k):
        hi = sc.stages[k][1]
        ws = model.workspace(2, 5, 0, hi)
        h = model.forward_blocks(model.embed(x, ws), 0, hi, ws)
        if k < K - 1:
            wr = ro.model.workspace(2, 5, 0, N, decoder=False)
            h = ro.model.forward_blocks(h, k * N, (k + 1) * N, wr)
        return float(model.decoder_loss(h, y, ws))

    with numba_threads(1):
        sc.submit(0, x, y, 0.0)  # lr 0: the gradients stay in place, the weights do not move
        (res,) = sc.poll()
        G, R = model.grad_flat.copy(), ro.model.grad_flat.copy()
        np.testing.assert_allclose(res.stage_losses, [loss_k(k) for k in range(K)], rtol=1e-12)
        for k, (plo, phi) in enumerate(sc.ranges):
            check_grad(lambda _, k=k: loss_k(k), [model.flat[plo:phi]], [G[plo:phi]], n_proj=2,
                       n_coords=3, seed=k)
            if k < K - 1:
                rlo, rhi = ro.ranges[k]
                check_grad(lambda _, k=k: loss_k(k), [ro.model.flat[rlo:rhi]], [R[rlo:rhi]],
                           n_proj=2, n_coords=3, seed=10 + k)
        from nbrgc.evaluate import evaluate
        ev = evaluate(model, [(x, y)], sc.stages, model.workspace(2, 5, 0, 4 // K))
        plain = nbrgc.local_loss_and_grad(model, x, y, K)[0]
        np.testing.assert_allclose(np.array(ev["val_stage_bpb"]) * np.log(2), plain, rtol=1e-12)


def test_delay_lr_power_scales_only_the_delayed_stages_after_the_warmup():
    tc = TrainConfig(mode="pipe-sync", n_stages=4, boundary_delay=1, delay_warmup=5,
                     delay_lr_power=1.0, batch=2, steps=10)
    sc = make_scheme(Model(TINY4, seed=0), tc)
    assert [sc._lr_factor(k, 4) for k in range(4)] == [1.0] * 4  # still in the warm-up
    assert [sc._lr_factor(k, 5) for k in range(4)] == [1 / 4, 1 / 3, 1 / 2, 1.0]
    with pytest.raises(ConfigError, match="delay_lr_power"):
        TrainConfig(mode="pipe-sync", delay_lr_power=-1)
