"""pipe-async: the pipeline's rule (nbrgc.schemes.pipe_rule) with every stage on a worker thread. It
computes what pipe-sync computes, stage by stage in one thread, to the last bit: for every horizon,
auxiliary weight, boundary delay, decoder staleness, replay, delay warm-up and readout setting, with
any number of workers, and whatever the cadence of evaluations and checkpoints, stops and resumes.
rgc-async runs it when its objective is not RGC's own."""
import numpy as np
import pytest

from nbrgc.config import TrainConfig, preset
from nbrgc.errors import ConfigError
from nbrgc.memory import estimate
from nbrgc.schemes import make_scheme
from nbrgc.model import Model
from nbrgc.schemes.pipe_async import PipeAsync

from conftest import numba_threads
from test_pipeline_state import assert_cadence_and_resume_keep, data, run as run_trainer  # noqa: F401
from test_schemes import TINY4, run, stage_losses, text  # noqa: F401  (data, text: fixtures)

SETTINGS = {
    "pipelined-bp": dict(),
    "no-delay": dict(boundary_delay=0),
    "delay-2-staleness-2": dict(boundary_delay=2, max_staleness=2),
    "one-stage-horizon": dict(horizon="stage", aux_weight=1.0, max_staleness=1),
    "all-aux-half-stashed": dict(horizon="all", aux_weight=0.5, replay_weights="stashed"),
    "predicted-warmup": dict(replay_weights="predicted", delay_warmup=4),
    "readout-blocks": dict(horizon="stage", aux_weight=1.0, readout_blocks=1),
    "muon-delay-lr": dict(optimizer="muon", delay_lr_power=1.0),
}


@pytest.mark.parametrize("name", list(SETTINGS))
def test_threads_compute_what_the_stages_in_turn_compute(text, name):
    kw = dict(cfg=TINY4, steps=12, lr=3e-3, warmup=3, grad_clip=0.5, n_stages=4, **SETTINGS[name])
    with numba_threads(1):
        ref, m_ref = run("pipe-sync", text, **kw)
    for W in (1, 2, 4):
        got, m_got = run("pipe-async", text, stage_threads="1", stage_workers=W, **kw)
        assert stage_losses(got).tolist() == stage_losses(ref).tolist(), W
        assert [r.grad_norm for r in got] == [r.grad_norm for r in ref], W
        assert np.array_equal(m_got.flat, m_ref.flat), W


def test_rgc_async_with_a_horizon_runs_the_pipeline_rule(text):
    """--mode rgc-async with a horizon, an aux weight or readout blocks is pipe-async with that
    objective (its boundary delay and staleness as given); with RGC's own it stays rgc-async."""
    kw = dict(cfg=TINY4, steps=10, lr=3e-3, warmup=3, n_stages=4, horizon="stage", aux_weight=1.0,
              max_staleness=1)
    tc = TrainConfig(mode="rgc-async", n_stages=4, horizon="stage")
    assert isinstance(make_scheme(Model(TINY4), tc), PipeAsync)
    assert not isinstance(make_scheme(Model(TINY4), TrainConfig(mode="rgc-async")), PipeAsync)
    ref, m_ref = run("pipe-async", text, stage_threads="1", **kw)
    got, m_got = run("rgc-async", text, stage_threads="1", **kw)
    assert stage_losses(got).tolist() == stage_losses(ref).tolist()
    assert np.array_equal(m_got.flat, m_ref.flat)


def test_a_stage_that_waits_longer_changes_no_bit(text):
    """Timing is not part of the rule: stage 2 sleeps at every other step, the others run on."""
    import time
    kw = dict(cfg=TINY4, steps=10, lr=3e-3, warmup=3, n_stages=4, boundary_delay=1)
    ref, m_ref = run("pipe-async", text, stage_threads="1", stage_workers=4, **kw)

    def slow(k, t):
        if k == 2 and t % 2:
            time.sleep(0.02)
    got, m_got = run("pipe-async", text, stage_threads="1", stage_workers=4, fault_hook=slow, **kw)
    assert stage_losses(got).tolist() == stage_losses(ref).tolist()
    assert np.array_equal(m_got.flat, m_ref.flat)


@pytest.mark.parametrize("kw", [dict(), dict(horizon="1", aux_weight=1.0, max_staleness=1),
                                dict(horizon="all", aux_weight=0.5, readout_blocks=1)],
                         ids=["pipelined-bp", "one-stage-horizon", "readout-blocks"])
def test_cadence_workers_stop_and_resume_leave_the_trajectory(data, tmp_path, kw):
    kw = dict(mode="pipe-async", threads=2, stage_threads="1", boundary_delay=1, **kw)
    ref, ref_params = run_trainer(data, stage_workers=1, **kw)
    sync, sync_params = run_trainer(data, **dict(kw, mode="pipe-sync", threads=1))
    assert sync.losses() == ref.losses() and np.array_equal(sync_params, ref_params)
    got, params = assert_cadence_and_resume_keep(data, tmp_path, kw, 3, cadence=dict(stage_workers=4),
                                                 resumed=dict(stage_workers=2))
    assert got.losses() == ref.losses() and np.array_equal(params, ref_params)


def test_memory_estimate_counts_a_workspace_per_worker():
    cfg = preset("small")
    one = estimate(cfg, TrainConfig(mode="pipe-sync", threads=4, readout_blocks=1), 8, 128, 4)
    four = estimate(cfg, TrainConfig(mode="pipe-async", threads=4, stage_workers=4,
                                     readout_blocks=1), 8, 128, 4)
    assert four["activations"] == 4 * one["activations"]
    assert four["pipe_rings"] == one["pipe_rings"] and four["readout"] > one["readout"]
    assert "checkpoint_snapshot" not in four  # evaluations and checkpoints drain the pipeline


def test_refusals_are_one_line():
    from nbrgc.distributed.launch import check_fit
    with pytest.raises(ConfigError, match="use pipe-async"):
        check_fit("pipe-sync", 2, 4, 8)
    with pytest.raises(ConfigError, match="stage_workers"):
        TrainConfig(mode="pipe-async", n_stages=2, stage_workers=3).validate_for(TINY4)


def test_one_action_a_step_where_no_message_is_read_in_its_own_step():
    """With a boundary delay of 1 or more a stage's forward and late part run as one action (the
    settings above hold the bits either way); with none, or during the delay warm-up, two."""
    model = Model(TINY4)
    one = make_scheme(model, TrainConfig(mode="pipe-async", n_stages=4, delay_warmup=3))
    assert one.phases_at(0) == one.phases_at(2) == PipeAsync.phases
    assert one.phases_at(3) == one.phases_at(100) == PipeAsync.ONE_ACTION
    none = make_scheme(model, TrainConfig(mode="pipe-async", n_stages=4, boundary_delay=0))
    assert none.phases_at(100) == PipeAsync.phases
