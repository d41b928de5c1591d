"""Training schemes driven through make_scheme/submit/poll/drain: rgc-sync with one stage is BP,
rgc-async with staleness 0 is rgc-sync, the asynchronous pipeline is deterministic, trains, never
deadlocks, and turns a failure in any stage into a prompt StageError with no worker left behind."""
import math
import threading
import time

import numpy as np
import pytest

import nbrgc  # noqa: F401
from nbrgc.config import TrainConfig, preset
from nbrgc.data import Batches
from nbrgc.errors import DivergenceError, StageError
from nbrgc.model import Model
from nbrgc.optim import lr_at
from nbrgc.schemes import StepResult, make_scheme

TINY = preset("tiny")                 # 2 layers
TINY4 = preset("tiny", n_layer=4)     # 4 layers, for 4 stages


@pytest.fixture(scope="module")
def text(request):
    """enwik6 when the shared data is there (via the conftest fixture), else the bundled corpus."""
    try:
        return request.getfixturevalue("enwik6")
    except pytest.skip.Exception:
        from nbrgc.data.default import CORPUS_FILE
        return np.fromfile(CORPUS_FILE, np.uint8)[:100_000]


def run(mode, data, steps=20, cfg=TINY, seed=0, data_seed=1, dtype=np.float32, fault_hook=None,
        **kw):
    """Drive a scheme the way the trainer does; returns (results, model)."""
    tc = TrainConfig(mode=mode, steps=steps, batch=kw.pop("batch", 4), seed=seed, **kw)
    seq = tc.validate_for(cfg)
    model = Model(cfg, seed=seed, dtype=dtype)
    batches = Batches(data, tc.batch, seq, seed=data_seed)
    extra = {} if fault_hook is None else {"fault_hook": fault_hook}
    sc = make_scheme(model, tc, **extra)
    results = []
    try:
        for t in range(steps):
            x, y = batches.next()
            sc.submit(t, x, y, lr_at(t, tc))
            results += sc.poll()
        results += sc.drain()
    finally:
        sc.close()
    assert [r.step for r in results] == list(range(steps))
    assert all(isinstance(r, StepResult) for r in results)
    return results, model


def losses(results):
    return np.array([r.loss for r in results])


def stage_losses(results):
    return np.array([r.stage_losses for r in results])


def stage_threads_alive():
    return [th.name for th in threading.enumerate() if th.name.startswith("nbrgc-stage-")]


# ------------------------------------------------------------------------------ rgc-sync(K=1) == BP

def test_rgc_sync_one_stage_reproduces_bp_with_warmup_and_clipping(text):
    clip = 0.3
    kw = dict(steps=20, lr=3e-3, warmup=5, grad_clip=clip)
    bp, m_bp = run("bp", text, **kw)
    sy, m_sy = run("rgc-sync", text, n_stages=1, **kw)
    # clipping really binds on every step (the reported norm is the pre-clip one) ...
    assert all(r.grad_norm > clip for r in bp), [r.grad_norm for r in bp]
    assert all(r.grad_norm > clip for r in sy)
    # ... and warm-up really ramps the learning rate over the first steps
    tc = TrainConfig(**kw)
    assert lr_at(0, tc) < lr_at(4, tc) <= tc.lr
    # Not bitwise: BP clips with the global norm from ONE sumsq pass over the whole flat gradient,
    # RGC with stage_sumsq = sumsq(stage params) + sumsq(its decoder slot), the same sum added in two
    # pieces, so the clip factor differs in the last bits; RGC also rounds slot * scale to float32
    # before the decoder's AdamW, where BP multiplies by gscale in float64 inside the kernel. Without
    # clipping the two are identical (next test).
    np.testing.assert_allclose(losses(sy), losses(bp), rtol=1e-6)
    np.testing.assert_allclose([r.grad_norm for r in sy], [r.grad_norm for r in bp], rtol=1e-5)
    assert [r.stage_losses for r in sy] == [[r.loss] for r in sy]
    np.testing.assert_allclose(m_sy.flat, m_bp.flat, rtol=1e-4, atol=1e-5)
    assert not np.array_equal(m_bp.flat, Model(TINY, seed=0).flat)  # it did train


def test_rgc_sync_one_stage_is_bitwise_bp_without_clipping(text):
    kw = dict(steps=8, lr=3e-3, warmup=3, grad_clip=0.0)
    bp, m_bp = run("bp", text, **kw)
    sy, m_sy = run("rgc-sync", text, n_stages=1, **kw)
    assert losses(sy).tolist() == losses(bp).tolist()
    assert np.array_equal(m_sy.flat, m_bp.flat)


# ------------------------------------------------------------------------ rgc-async(S=0) == rgc-sync

@pytest.mark.parametrize("cfg,K,G", [(TINY4, 4, 1), (TINY, 2, 2), (TINY, 1, 2)],
                         ids=["K4-G1", "K2-G2", "K1-G2"])
def test_rgc_async_staleness_zero_is_bitwise_rgc_sync_with_equal_groups(text, cfg, K, G):
    """Every stage worker on a group of G threads, rgc-sync's one thread on G too: the same kernel
    calls on the same shapes in the same order, so the same bits on any BLAS kernel."""
    from conftest import numba_threads
    kw = dict(cfg=cfg, steps=12, lr=3e-3, warmup=3, grad_clip=0.5, n_stages=K)
    with numba_threads(G):
        sy, m_sy = run("rgc-sync", text, **kw)
    asy, m_asy = run("rgc-async", text, max_staleness=0, stage_threads=str(G), **kw)
    assert stage_losses(asy).tolist() == stage_losses(sy).tolist()
    assert [r.grad_norm for r in asy] == [r.grad_norm for r in sy]
    assert not any(r.skipped for r in asy)
    assert np.array_equal(m_asy.flat, m_sy.flat)  # decoder published too
    assert len(sy[0].stage_losses) == len(asy[0].stage_losses) == K


@pytest.mark.parametrize("cfg,K,stage_threads", [(TINY4, 4, "auto"), (TINY, 2, "2,1")],
                         ids=["K4-auto", "K2-2,1"])
def test_rgc_async_staleness_zero_equals_rgc_sync_to_rounding(text, cfg, K, stage_threads):
    """Other group sizes cut the GEMMs and the LayerNorm sums differently: equal to rounding. The
    losses stay within float32 rounding of the forward (rtol 1e-6, about 8 ulps; seen: <= 3e-8),
    where one stale decoder read would move them by about one update (~lr = 3e-3 relative). The
    parameters drift further (AdamW turns a rounding-sized change of a near-zero gradient into up to
    one lr-sized step), so they are held to a fraction of one update, lr/30 (seen: <= 1e-5)."""
    lr = 3e-3
    kw = dict(cfg=cfg, steps=12, lr=lr, warmup=3, grad_clip=0.5, n_stages=K)
    sy, m_sy = run("rgc-sync", text, **kw)
    asy, m_asy = run("rgc-async", text, max_staleness=0, stage_threads=stage_threads, **kw)
    np.testing.assert_allclose(stage_losses(asy), stage_losses(sy), rtol=1e-6, atol=0)
    np.testing.assert_allclose([r.grad_norm for r in asy], [r.grad_norm for r in sy], rtol=1e-4)
    assert not any(r.skipped for r in asy)
    np.testing.assert_allclose(m_asy.flat, m_sy.flat, rtol=0, atol=lr / 30)


# --------------------------------------------------------------------- rgc-async with staleness >= 1

@pytest.mark.parametrize("S,K,cfg", [(1, 2, TINY), (2, 4, TINY4)])
def test_rgc_async_is_deterministic(text, S, K, cfg):
    kw = dict(cfg=cfg, steps=15, lr=3e-3, warmup=3, grad_clip=1.0, n_stages=K, max_staleness=S)
    a, m_a = run("rgc-async", text, **kw)
    b, m_b = run("rgc-async", text, **kw)
    assert stage_losses(a).tolist() == stage_losses(b).tolist()
    assert [r.grad_norm for r in a] == [r.grad_norm for r in b]
    assert np.array_equal(m_a.flat, m_b.flat)
    # and stale reads really happen: not the synchronous schedule
    sy, _ = run("rgc-sync", text, **{k: v for k, v in kw.items() if k != "max_staleness"})
    assert not np.array_equal(stage_losses(a), stage_losses(sy))


@pytest.mark.parametrize("S", [0, 2])
def test_rgc_async_stage_workers_change_nothing_but_buffers(text, S):
    """Four stages on 1, 2, 3 or 4 worker threads (stage k on worker k mod W, one workspace per
    worker): the same losses, norms and parameters to the last bit, with W workspaces allocated."""
    kw = dict(cfg=TINY4, steps=10, lr=3e-3, warmup=3, grad_clip=0.5, n_stages=4, max_staleness=S,
              stage_threads="1", threads=1)
    ref, m_ref = run("rgc-async", text, stage_workers=4, **kw)
    for W in (1, 2, 3):
        tc = TrainConfig(mode="rgc-async", n_stages=4, stage_workers=W, stage_threads="1")
        sc = make_scheme(Model(TINY4), tc)
        assert sc.W == W and [sc.worker_stages(w) for w in range(W)] == \
            [list(range(w, 4, W)) for w in range(W)]
        got, m_got = run("rgc-async", text, stage_workers=W, **kw)
        assert stage_losses(got).tolist() == stage_losses(ref).tolist(), W
        assert [r.grad_norm for r in got] == [r.grad_norm for r in ref]
        assert np.array_equal(m_got.flat, m_ref.flat)
        assert not stage_threads_alive()


def test_rgc_async_stage_workers_auto_and_memory():
    from nbrgc.config import resolve_stage_workers
    from nbrgc.memory import estimate
    from nbrgc.errors import ConfigError
    tc = lambda **k: TrainConfig(mode="rgc-async", n_stages=4, **k)  # noqa: E731
    assert resolve_stage_workers(tc(), budget=2) == 2       # one single-thread worker per core
    assert resolve_stage_workers(tc(), budget=8) == 4       # one per stage
    assert resolve_stage_workers(tc(), budget=3) == 2       # equal shares: not 2 + 1 + 1 stages
    assert resolve_stage_workers(TrainConfig(mode="rgc-async", n_stages=6), budget=5) == 3
    assert resolve_stage_workers(TrainConfig(mode="rgc-async", n_stages=3), budget=2) == 1
    assert resolve_stage_workers(tc(stage_threads="1,1,1,1"), budget=2) == 4  # pinned per stage
    assert resolve_stage_workers(tc(stage_workers=3), budget=2) == 3
    # memory: the activations scale with the workers, not with the stages
    act = {W: estimate(TINY4, tc(stage_workers=W), 4, 64, 1)["activations"] for W in (1, 2, 4)}
    assert act[2] == 2 * act[1] and act[4] == 4 * act[1]
    with pytest.raises(ConfigError, match="stage_workers"):
        tc(stage_workers=5).validate_for(TINY4)
    with pytest.raises(ConfigError, match="worker 0 of 2"):
        tc(stage_workers=2, stage_threads="2,1,1,1").validate_for(TINY4)
    with pytest.raises(ConfigError):
        TrainConfig(mode="rgc-async", stage_workers=-1)


def test_rgc_async_trains_on_text(enwik6):
    res, model = run("rgc-async", enwik6, cfg=TINY, steps=60, lr=1e-2, warmup=5, grad_clip=1.0,
                     n_stages=2, max_staleness=1)
    ls = losses(res)
    assert np.all(np.isfinite(ls))
    first, last = ls[:5].mean(), ls[-5:].mean()
    assert last < first - 0.5, (first, last)
    # every stage learns, and the published model agrees with the pipeline's last losses
    sl = stage_losses(res)
    assert np.all(sl[-5:].mean(axis=0) < sl[:5].mean(axis=0) - 0.3)
    x, y = Batches(enwik6, 8, TINY.ctx, seed=123).next()
    assert model.loss(x, y) < first - 0.3


def test_rgc_async_repeated_runs_never_deadlock(text):
    """20 short runs, each in a watchdog thread that must finish within a timeout."""
    for i in range(20):
        box = {}

        def target():
            try:
                box["res"] = run("rgc-async", text, cfg=TINY4, steps=6, batch=2, lr=1e-3, warmup=2,
                                 n_stages=4, max_staleness=i % 3, data_seed=i)[0]
            except BaseException as exc:  # noqa: BLE001
                box["exc"] = exc

        th = threading.Thread(target=target, name=f"watchdog-{i}", daemon=True)
        th.start()
        th.join(timeout=60)
        assert not th.is_alive(), f"run {i} (S={i % 3}) did not finish: deadlock"
        assert "exc" not in box, box.get("exc")
        assert len(box["res"]) == 6
        assert not stage_threads_alive()


def test_rgc_async_drain_then_continue(text):
    """drain (before evaluation/checkpoints) waits for every submitted step and leaves the workers
    waiting for the next one; close stops them."""
    tc = TrainConfig(mode="rgc-async", steps=10, batch=2, lr=1e-3, warmup=0, n_stages=2,
                     max_staleness=1)
    model = Model(TINY, seed=0)
    b = Batches(text, 2, TINY.ctx, seed=0)
    sc = make_scheme(model, tc)
    out = []
    for t in range(10):
        sc.submit(t, *b.next(), lr_at(t, tc))
        out += sc.poll()
        if t == 4:
            out += sc.drain()
            assert [r.step for r in out] == list(range(5))  # nothing in flight after a drain
            assert stage_threads_alive()  # paused, not stopped
    out += sc.drain()
    assert stage_threads_alive()
    sc.close()
    assert [r.step for r in out] == list(range(10))
    assert not stage_threads_alive()


def test_rgc_async_stage_profile_and_prompt_shutdown(text):
    """Each stage's time since the workers started, split into waiting and work; close stops the
    workers, stage 0 blocked on its input included (it is woken rather than left to time out)."""
    tc = TrainConfig(mode="rgc-async", steps=6, batch=2, lr=1e-3, warmup=0, n_stages=2,
                     max_staleness=1, stage_threads="1,1")
    model = Model(TINY, seed=0)
    b = Batches(text, 2, TINY.ctx, seed=0)
    sc = make_scheme(model, tc)
    for t in range(6):
        sc.submit(t, *b.next(), lr_at(t, tc))
        sc.poll()
    sc.drain()  # every step done, however loaded the machine: the stages now wait for input
    time.sleep(0.2)  # stage 0 in its input wait, stage 1 in its ring wait
    sc.close()
    assert not stage_threads_alive()
    prof = sc.stage_profile()  # after close: a wait is counted when it ends
    assert len(prof["step_s"]) == len(prof["wait_s"]) == len(prof["busy_frac"]) == 2
    for step, wait, busy in zip(prof["step_s"], prof["wait_s"], prof["busy_frac"]):
        assert 0.0 <= wait <= step and 0.0 <= busy <= 1.0
    # the 0.2 s idle after the last step was spent waiting, by both stages
    assert all(w >= 0.15 for w in prof["wait_s"]), prof


# ------------------------------------------------------------------------------------ fault injection

class Injected(RuntimeError):
    pass


def _faulty_run(text, k0, t0, S, cfg, K, exc_type=Injected, W=0):
    when = {}

    def hook(k, t):
        if (k, t) == (k0, t0):
            when["t"] = time.monotonic()
            raise exc_type(f"injected at stage {k}, step {t}")

    with pytest.raises(StageError) as ei:
        run("rgc-async", text, cfg=cfg, steps=t0 + 4, batch=2, lr=1e-3, warmup=0, n_stages=K,
            max_staleness=S, fault_hook=hook, stage_workers=W)
    caught = time.monotonic()
    err = ei.value
    assert "t" in when, "the hook never fired"
    # a hang guard (the run has t0 + 4 steps, so a failure that woke nobody would wait forever),
    # generous for a loaded machine; not a speed claim
    assert caught - when["t"] < 60.0, f"StageError took {caught - when['t']:.1f}s"
    assert err.stage == k0
    assert f"stage {k0}" in str(err)
    assert isinstance(err.cause, exc_type) and err.__cause__ is err.cause
    assert not stage_threads_alive(), stage_threads_alive()


def test_fault_in_any_stage_raises_stage_error_promptly(text):
    rng = np.random.default_rng(2024)
    for i in range(50):
        K, cfg = (4, TINY4) if i % 2 else (2, TINY)
        k0, t0, S = int(rng.integers(K)), int(rng.integers(0, 6)), int(rng.integers(0, 3))
        W = int(rng.integers(0, K + 1))  # 0: auto; else stages share W worker threads
        try:
            _faulty_run(text, k0, t0, S, cfg, K, W=W)
        except AssertionError as exc:
            raise AssertionError(f"case {i}: stage {k0}, step {t0}, S={S}, K={K}, W={W}: {exc}") from None


def test_fault_with_a_library_error_still_names_the_stage(text):
    _faulty_run(text, 1, 2, 1, TINY, 2, exc_type=DivergenceError)


# ------------------------------------------------------------------------------------- determinism

@pytest.mark.parametrize("mode,kw", [("bp", {}), ("rgc-sync", {"n_stages": 2})])
def test_same_seed_same_losses(text, mode, kw):
    a, m_a = run(mode, text, steps=10, lr=3e-3, warmup=2, **kw)
    b, m_b = run(mode, text, steps=10, lr=3e-3, warmup=2, **kw)
    assert losses(a).tolist() == losses(b).tolist()
    assert [r.stage_losses for r in a] == [r.stage_losses for r in b]
    assert np.array_equal(m_a.flat, m_b.flat)
    c, _ = run(mode, text, steps=10, lr=3e-3, warmup=2, seed=1, **kw)
    assert losses(c).tolist() != losses(a).tolist()


def test_bp_stops_or_skips_on_non_finite(text):
    tc = TrainConfig(mode="bp", steps=3, batch=2, on_nan="stop")
    model = Model(TINY, seed=0)
    x, y = Batches(text, 2, TINY.ctx, seed=0).next()
    model.params["head.b"][0] = np.nan
    sc = make_scheme(model, tc)
    with pytest.raises(DivergenceError, match="step 0"):
        sc.submit(0, x, y, 1e-3)
    before = model.flat.copy()
    sc = make_scheme(model, TrainConfig(mode="bp", steps=3, batch=2, on_nan="skip"))
    sc.submit(0, x, y, 1e-3)
    (r,) = sc.poll()
    assert r.skipped and math.isnan(r.grad_norm)
    assert np.array_equal(model.flat, before, equal_nan=True)  # parameters untouched
