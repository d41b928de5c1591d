"""rgc-async's training does not depend on evaluation, checkpoints, stops or resumes.

The pipeline state at a step boundary (the decoder versions that the next S steps still read) is
kept across every pause and written into every checkpoint, so for one seed and config the training
losses are the same to the last bit for any ``eval_every``, ``ckpt_every``, ``keep`` and
``stage_workers``, and a run stopped anywhere (a stop request, ``--time``) and resumed from any of its
checkpoints continues the uninterrupted trajectory. The per-stage thread groups are fixed
(``stage_threads="1"``): the stage-worker count must not change them.
"""
import glob
import os
import shutil

import numpy as np
import pytest

import nbrgc  # noqa: F401  (thread-safe threading layer first)
from nbrgc import checkpoint as ck
from nbrgc.config import ModelConfig, TrainConfig
from nbrgc.errors import CheckpointError
from nbrgc.trainer import Trainer

from jsonlines import JsonLines

CFG = ModelConfig(n_layer=4, d_model=32, n_head=2, ctx=16)
STEPS = 40


@pytest.fixture(scope="module")
def data():
    from nbrgc.data import load_dataset
    return load_dataset("default", log=None)


class Records(JsonLines):
    """The JSON lines of a run; optionally asks the trainer to stop once step ``stop_at`` is logged."""

    def __init__(self, stop_at=None):
        super().__init__(None if stop_at is None else lambda rec: rec.get("step") == stop_at and "loss" in rec)

    def losses(self):
        return {r["step"]: r["loss"] for r in self.records if "loss" in r and not r.get("summary")}

    def summary(self):
        return [r for r in self.records if r.get("summary")][-1]


def run(data, out=None, resume=False, stop_at=None, time_limit=None, **kw):
    tc = dict(mode="rgc-async", steps=STEPS, batch=4, n_stages=4, seed=5, log_every=1, threads=2,
              stage_threads="1", warmup=4, eval_every=STEPS, eval_batches=2)
    tc.update(kw)
    rec = Records(stop_at)
    tr = Trainer(CFG, TrainConfig(**tc), data, out, resume=resume, json_lines=True, progress=False,
                 log=lambda m: None, stream=rec, time_limit=time_limit)
    rec.trainer = tr
    tr.run()
    return rec, tr.model.flat.copy()


def ckpt_steps(d):
    return sorted(int(os.path.basename(p)[5:14]) for p in glob.glob(os.path.join(d, "ckpt-*.nbrgc")))


def keep_up_to(src, dst, step):
    """A copy of run folder ``src`` holding only its checkpoints up to ``step``."""
    shutil.copytree(src, dst)
    for s in ckpt_steps(dst):
        if s > step:
            os.remove(ck.checkpoint_path(dst, s))


def assert_cadence_and_resume_keep(data, tmp_path, kw, resumes, cadence=None, resumed=None):
    """A run of ``kw`` with another evaluation and checkpoint cadence (plus ``cadence``), and the
    same run resumed from each of its first ``resumes`` checkpoints (plus ``resumed``), give the
    uninterrupted run's losses and parameters; resuming with another boundary delay is refused.
    Returns the uninterrupted run (records, parameters)."""
    ref, ref_params = run(data, **kw)
    got, params = run(data, out=str(tmp_path / "cad"), eval_every=3, ckpt_every=7, keep=1,
                      **dict(kw, **(cadence or {})))
    assert got.losses() == ref.losses() and np.array_equal(params, ref_params)
    full_dir = str(tmp_path / "full")
    full, full_params = run(data, out=full_dir, eval_every=6, ckpt_every=5, keep=100, **kw)
    for n in [s for s in ckpt_steps(full_dir) if s < STEPS][:resumes]:
        d = str(tmp_path / f"from{n}")
        keep_up_to(full_dir, d, n)
        again, params = run(data, out=d, resume=True, eval_every=4, **dict(kw, **(resumed or {})))
        assert again.losses() == {s: v for s, v in full.losses().items() if s > n}, n
        assert np.array_equal(params, full_params), n
    # another delay is another trajectory: refused on resume
    with pytest.raises(CheckpointError, match="boundary_delay 1, this run has 2"):
        run(data, out=full_dir, resume=True, **dict(kw, boundary_delay=2, steps=60))
    return ref, ref_params


@pytest.mark.parametrize("S", [0, 1, 2])
def test_losses_do_not_depend_on_eval_checkpoints_or_workers(data, tmp_path, S):
    ref, ref_params = run(data, max_staleness=S)
    variants = [dict(eval_every=3, ckpt_every=7, keep=1), dict(eval_every=5, keep=3),
                dict(eval_every=1, stage_workers=1), dict(eval_every=7, ckpt_every=2, stage_workers=2),
                dict(eval_every=4, stage_workers=4)]
    for i, v in enumerate(variants):
        out = str(tmp_path / f"r{i}") if "ckpt_every" in v or "keep" in v else None
        got, params = run(data, out=out, max_staleness=S, **v)
        assert got.losses() == ref.losses(), (S, v)
        assert np.array_equal(params, ref_params), (S, v)
        assert got.summary()["val_bpb"] == ref.summary()["val_bpb"], (S, v)


@pytest.mark.parametrize("S", [1, 2])
def test_resume_from_any_checkpoint_continues_the_trajectory(data, tmp_path, S):
    full_dir = str(tmp_path / "full")
    full, full_params = run(data, out=full_dir, max_staleness=S, eval_every=6, ckpt_every=5, keep=100)
    steps = [s for s in ckpt_steps(full_dir) if s < STEPS]
    assert len(steps) >= 8, steps  # checkpoints at 5, 6, 10, 12, ...: evaluation and extra ones
    for n in steps:
        d = str(tmp_path / f"from{n}")
        keep_up_to(full_dir, d, n)
        # another worker count and evaluation cadence in the resumed part: still the same run
        got, params = run(data, out=d, resume=True, max_staleness=S, eval_every=4, ckpt_every=0,
                          keep=2, stage_workers=2)
        assert got.losses() == {s: v for s, v in full.losses().items() if s > n}, n
        assert np.array_equal(params, full_params), n


def test_stop_anywhere_then_resume(data, tmp_path):
    ref, ref_params = run(data, max_staleness=1)
    for stop_at in (1, 13, 22, 33):  # none of them an evaluation step
        d = str(tmp_path / f"stop{stop_at}")
        first, _ = run(data, out=d, stop_at=stop_at, max_staleness=1)
        assert first.summary()["stopped"] == "test stop"
        done = first.summary()["steps"]
        assert stop_at <= done < STEPS
        assert ckpt_steps(d)[-1] == done
        second, params = run(data, out=d, resume=True, max_staleness=1)
        losses = {**first.losses(), **second.losses()}
        assert losses == ref.losses(), stop_at
        assert np.array_equal(params, ref_params), stop_at


def test_time_limit_stop_then_resume(data, tmp_path):
    """--time stops wherever the clock says; resuming from there repeats the uninterrupted run."""
    ref, ref_params = run(data, max_staleness=2)
    d = str(tmp_path / "timed")
    first, _ = run(data, out=d, max_staleness=2, time_limit=1e-9)  # up at the first step boundary
    done = first.summary()["steps"]
    assert 1 <= done < STEPS and ckpt_steps(d)[-1] == done
    second, params = run(data, out=d, resume=True, max_staleness=2)
    assert {**first.losses(), **second.losses()} == ref.losses()
    assert np.array_equal(params, ref_params)


def test_resume_with_other_staleness_is_refused(data, tmp_path):
    d = str(tmp_path / "s1")
    run(data, out=d, max_staleness=1, steps=8, eval_every=4)
    os.remove(ck.checkpoint_path(d, 8))
    with pytest.raises(CheckpointError, match="max_staleness 1, this run has 2"):
        run(data, out=d, resume=True, max_staleness=2, steps=8, eval_every=4)


def test_checkpoint_holds_the_decoder_versions(data, tmp_path):
    """At boundary n the ring holds versions max(0, n - S)..n, and the newest is the decoder in params."""
    d = str(tmp_path / "v")
    run(data, out=d, max_staleness=2, steps=9, eval_every=9, ckpt_every=7, keep=5)
    _, arrays, meta = ck.latest(d)
    S = meta["max_staleness"]
    versions = arrays["decoder_versions"]
    assert versions.shape[0] == S + 2 and meta["decoder_version"] == meta["step"] == 9
    from nbrgc.model import Layout
    lo, hi = Layout(CFG).decoder_range
    assert np.array_equal(versions[9 % (S + 2)], arrays["params"][lo:hi])
    # the versions steps 9 and 10 read are older decoders, all different from each other
    live = [versions[v % (S + 2)] for v in range(9 - S, 10)]
    assert all(not np.array_equal(a, b) for i, a in enumerate(live) for b in live[i + 1:])


@pytest.mark.parametrize("S", [0, 1, 2])
def test_snapshot_checkpoints_equal_paused_ones(data, tmp_path, monkeypatch, S):
    """Checkpoints and evaluations before the end, read from a snapshot while the stages run on
    (an evaluation with the workers frozen), are the files and the validation losses of a run that
    pauses the pipeline there, bit for bit, and the run goes on the same."""
    from nbrgc.schemes.rgc_async import RGCAsync
    kw = dict(max_staleness=S, eval_every=6, ckpt_every=5, keep=100, stage_workers=2)
    snap_dir, pause_dir = str(tmp_path / "snap"), str(tmp_path / "pause")
    taken = []
    real = RGCAsync.snapshot
    monkeypatch.setattr(RGCAsync, "snapshot", lambda self, step: taken.append(step) or real(self, step))
    snap, _ = run(data, out=snap_dir, **kw)
    assert taken == sorted(set(range(5, STEPS, 5)) | set(range(6, STEPS, 6)))  # all but the end
    monkeypatch.setattr(RGCAsync, "can_snapshot", lambda self: False)
    paused, _ = run(data, out=pause_dir, **kw)
    assert snap.losses() == paused.losses()
    assert ckpt_steps(snap_dir) == ckpt_steps(pause_dir) == sorted(
        set(taken) | {6, 12, 18, 24, 30, 36, STEPS})
    for step in ckpt_steps(snap_dir):
        (a, ma) = ck.load(ck.checkpoint_path(snap_dir, step))
        (b, mb) = ck.load(ck.checkpoint_path(pause_dir, step))
        assert a.keys() == b.keys()
        for name in a:
            assert np.array_equal(a[name], b[name]), (S, step, name)
        assert ma == mb, (S, step)
    vals = [[(r.get("step"), r["val_bpb"]) for r in x.records if "val_bpb" in r] for x in (snap, paused)]
    assert vals[0] == vals[1]


@pytest.mark.parametrize("S,W", [(0, 4), (1, 2), (2, 1)])
def test_evaluations_of_a_frozen_pipeline_equal_paused_ones(data, monkeypatch, S, W):
    """Without a run folder too, every evaluation before the end freezes the workers instead of
    draining them, and gives the paused run's validation losses, every stage's, bit for bit."""
    from nbrgc.schemes.rgc_async import RGCAsync
    kw = dict(max_staleness=S, eval_every=3, stage_workers=W)
    frozen_at, drains = [], []
    real_freeze, real_drain = RGCAsync.freeze, RGCAsync.drain
    monkeypatch.setattr(RGCAsync, "freeze", lambda self: frozen_at.append(self.submitted) or real_freeze(self))
    monkeypatch.setattr(RGCAsync, "drain", lambda self: drains.append(self.submitted) or real_drain(self))
    frozen, frozen_params = run(data, **kw)
    evals = list(range(3, STEPS, 3))
    assert len(frozen_at) == len(evals) and all(f > e for f, e in zip(frozen_at, evals))
    assert all(d == STEPS for d in drains)  # only the end drains
    monkeypatch.setattr(RGCAsync, "can_snapshot", lambda self: False)
    paused, paused_params = run(data, **kw)
    assert frozen.losses() == paused.losses()
    assert np.array_equal(frozen_params, paused_params)
    vals = [[(r["step"], r["val_bpb"], r["val_stage_bpb"]) for r in x.records
             if "val_bpb" in r and not r.get("summary")] for x in (frozen, paused)]
    assert [v[0] for v in vals[0]] == evals + [STEPS]
    assert vals[0] == vals[1]
    # the records keep their order: train steps ascending, each evaluation after its step's record
    order = [(r["step"], "loss" in r) for r in frozen.records if not r.get("summary")]
    trained = [s for s, is_train in order if is_train]
    assert trained == sorted(trained)
    assert all(order.index((s, True)) < order.index((s, False)) for s, is_train in order if not is_train)


def test_a_stage_failing_under_a_pending_snapshot_stops_the_run_without_its_checkpoint(data, tmp_path):
    """Stage 2 fails at step 5 before the snapshot of boundary 5 is complete: the run raises the
    stage's error promptly, and no checkpoint of step 5 (nor a partial file) is written."""
    from nbrgc.errors import StageError

    def hook(k, t):
        if (k, t) == (2, 5):
            raise RuntimeError("injected")
    d = str(tmp_path / "f")
    tc = TrainConfig(mode="rgc-async", steps=STEPS, batch=4, n_stages=4, seed=5, threads=2,
                     stage_threads="1", eval_every=STEPS, ckpt_every=5, eval_batches=2)
    tr = Trainer(CFG, tc, data, d, json_lines=True, progress=False, log=lambda m: None,
                 stream=Records(), fault_hook=hook)
    with pytest.raises(StageError, match="stage 2 failed: RuntimeError: injected"):
        tr.run()
    assert 5 not in ckpt_steps(d)
    assert not [p for p in os.listdir(d) if p.endswith(".tmp") or ".tmp." in p]


def test_a_stop_right_after_a_checkpoint_copy_was_asked_for_ends_with_that_boundary(data, tmp_path,
                                                                                   monkeypatch):
    """A stop landing between the request for boundary 4's copy and the submission of step 4 (a
    signal in that window) must not wait for a copy that needs step 4: the run ends at once with
    the stop checkpoint of boundary 4, and resuming it gives the uninterrupted run's losses."""
    import threading
    from nbrgc.boundary import BackgroundBoundaries
    real = BackgroundBoundaries.checkpoint

    def checkpoint_then_stop(self, step):
        real(self, step)
        if step == 4:
            self.trainer.request_stop("stop in the window")
    ref, ref_params = run(data, out=str(tmp_path / "ref"), ckpt_every=2)
    monkeypatch.setattr(BackgroundBoundaries, "checkpoint", checkpoint_then_stop)
    d = str(tmp_path / "split")
    done = []
    th = threading.Thread(target=lambda: done.append(run(data, out=d, ckpt_every=2)), daemon=True)
    th.start()
    th.join(120)
    assert done, "the run hung waiting for a copy of a boundary whose step was never submitted"
    part = done[0][0]
    assert part.summary()["steps"] == 4 and part.summary()["stopped"] == "stop in the window"
    assert ckpt_steps(d)[-1] == 4
    monkeypatch.setattr(BackgroundBoundaries, "checkpoint", real)
    rest, rest_params = run(data, out=d, ckpt_every=2, resume=True)
    assert {**part.losses(), **rest.losses()} == ref.losses()
    assert np.array_equal(rest_params, ref_params)
