"""``--resume`` continues a run exactly: an interrupted and resumed run logs the same losses, evaluates
the same validation bpb and ends with the same parameters as the uninterrupted run.

The interrupted run uses the same TrainConfig (the lr schedule depends on ``steps``) and is stopped
with ``Trainer.request_stop()`` called from its own JSON stream at the evaluation of step K. A stop
takes effect at the next step boundary the trainer reaches: K itself for bp and rgc-sync, which pause
to evaluate; a few steps later for rgc-async, which evaluates a copy of boundary K while the trainer
goes on submitting steps (nbrgc.boundary), so where it stops depends on timing and the test checks
the resume from wherever that is. All three modes are bitwise deterministic, rgc-async included
(its checkpoints carry the pipeline state; tests/test_pipeline_state.py stops and resumes it
anywhere): every step of every stage reads a fixed decoder version, rounds close in order and each round averages its K slots in a fixed order; thread timing
only changes *when* work happens, never what is computed. The stage thread groups are fixed here
(``stage_threads``), since ``auto`` times the machine and kernels that split reductions over threads
may round differently with another group size.
"""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import nbrgc  # noqa: F401  (thread-safe threading layer first)
from nbrgc import checkpoint as ck
from nbrgc.config import TrainConfig, preset
from nbrgc.data import load_dataset
from nbrgc.trainer import Trainer

from jsonlines import JsonLines

REPO = Path(__file__).resolve().parents[1]
N, K, EVERY = 24, 8, 4


def StopStream(stop_at=None):
    """The JSON lines; asks the trainer to stop at the evaluation of step ``stop_at``."""
    return JsonLines(None if stop_at is None else lambda rec: (
        not rec.get("summary") and "loss" not in rec and rec.get("step") == stop_at))


@pytest.fixture(scope="module")
def data():
    return load_dataset("default", log=None)


def _run(data, mode, out, stop_at=None, resume=False, optimizer="adamw", grad_delay=0):
    mcfg = preset("tiny", n_layer=4)
    tc = TrainConfig(mode=mode, optimizer=optimizer, grad_delay=grad_delay, steps=N, batch=4, eval_every=EVERY, eval_batches=2, log_every=1,
                     warmup=2, n_stages=2 if mode != "bp" else 1,
                     stage_threads="1,1" if mode == "rgc-async" else "auto", threads=1,
                     seed=5, keep=10)
    stream = StopStream(stop_at)
    tr = Trainer(mcfg, tc, data, out, resume=resume, json_lines=True, progress=False,
                 log=lambda m: None, stream=stream, data_spec="default")
    stream.trainer = tr
    summary = tr.run()
    return stream.records, summary, tr.model.flat.copy()


def _train_lines(recs):
    return {r["step"]: r for r in recs if "loss" in r}


def _eval_lines(recs):
    return {r["step"]: r["val_bpb"] for r in recs if "val_bpb" in r and "loss" not in r
            and not r.get("summary")}


@pytest.mark.parametrize("mode,optimizer,delay", [("bp", "adamw", 0), ("rgc-sync", "adamw", 0),
                                                  ("rgc-async", "adamw", 0), ("bp", "muon", 0),
                                                  ("bp", "adamw", 3)])
def test_resume_is_exact(tmp_path, data, mode, optimizer, delay):
    kw = dict(optimizer=optimizer, grad_delay=delay)
    full, s_full, p_full = _run(data, mode, tmp_path / "full", **kw)
    assert s_full["steps"] == N and s_full["stopped"] is None

    part, s_part, _ = _run(data, mode, tmp_path / "split", stop_at=K, **kw)
    stop = s_part["steps"]
    # rgc-async's trainer is at most a pipeline's depth (a few steps here) past the boundary it
    # evaluates, far from N
    assert (stop == K if mode != "rgc-async" else K <= stop < N - EVERY), stop
    assert s_part["stopped"] == "test stop"
    assert os.path.basename(s_part["checkpoint"]) == f"ckpt-{stop:09d}.nbrgc"
    assert sorted(_train_lines(part)) == list(range(1, stop + 1))

    rest, s_rest, p_rest = _run(data, mode, tmp_path / "split", resume=True, **kw)
    assert s_rest["steps"] == N and s_rest["tokens"] == (N - stop) * 4 * 16
    a, b = _train_lines(full), _train_lines(rest)
    assert sorted(b) == list(range(stop + 1, N + 1))
    for step in range(1, stop + 1):  # the interrupted part repeats the uninterrupted run
        assert _train_lines(part)[step]["loss"] == a[step]["loss"], (mode, step)
    assert _eval_lines(part) == {s: v for s, v in _eval_lines(full).items() if s <= stop}
    for step in b:
        for key in ("loss", "grad_norm", "lr"):
            assert b[step][key] == a[step][key], (mode, step, key, b[step][key], a[step][key])
        if mode != "bp":
            assert b[step]["stage_bpb"] == a[step]["stage_bpb"]
    assert _eval_lines(rest) == {s: v for s, v in _eval_lines(full).items() if s > stop}
    assert s_rest["val_bpb"] == s_full["val_bpb"]
    np.testing.assert_array_equal(p_rest, p_full)
    # the final checkpoints hold the same state (parameters and optimizer moments)
    fa, _ = ck.load(s_full["checkpoint"])
    fb, _ = ck.load(s_rest["checkpoint"])
    for name in ("params", "adam_m", "adam_v"):
        np.testing.assert_array_equal(fa[name], fb[name])


def test_sigint_then_resume_cli(tmp_path):
    """The CLI stops on SIGINT with a checkpoint at the step it reached; --resume then continues
    exactly (BP: stopping at any step is exact)."""
    steps = 3000
    # tiny: the pipe, not the model's speed, holds the run back until the signal (see below)
    args = [sys.executable, str(REPO / "bin" / "nbrgc-train"), "--config", "tiny", "--quiet", "--json",
            "--threads", "1", "--steps", str(steps), "--eval-every", "0", "--eval-batches", "1", "--log-every", "1",
            "--seed", "2"]
    full = subprocess.run(args + ["--out", str(tmp_path / "full")], capture_output=True, timeout=300)
    assert full.returncode == 0, full.stderr.decode()
    ref = _train_lines([json.loads(x) for x in full.stdout.decode().splitlines()])

    out = tmp_path / "split"
    p = subprocess.Popen(args + ["--out", str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         env=dict(os.environ, PYTHONUNBUFFERED="1"))
    first = p.stdout.readline()  # the first step is done: the loop runs and the handler is in place
    assert b'"step": 1' in first
    # Nothing reads stdout until the signal is sent: the pipe (64 KiB) holds a few hundred of the
    # 3000 JSON lines, then the run blocks on its next write, so it cannot finish before SIGINT
    # however fast it is; the signal interrupts that write and the handler runs.
    time.sleep(0.05)
    p.send_signal(signal.SIGINT)
    rest_out, err = p.communicate(timeout=300)
    assert p.returncode == 0, err.decode()
    recs = [json.loads(first)] + [json.loads(x) for x in rest_out.decode().splitlines()]
    summary = recs[-1]
    stop = summary["steps"]
    assert stop < steps, "the run finished before SIGINT arrived: the pipe did not hold it back"
    assert summary["stopped"] == "received SIGINT" and b"Traceback" not in err
    assert os.path.basename(summary["checkpoint"]) == f"ckpt-{stop:09d}.nbrgc"
    part = _train_lines(recs)
    assert max(part) == stop
    assert all(part[s]["loss"] == ref[s]["loss"] for s in part)

    res = subprocess.run(args + ["--out", str(out), "--resume"], capture_output=True, timeout=300)
    assert res.returncode == 0, res.stderr.decode()
    rest = _train_lines([json.loads(x) for x in res.stdout.decode().splitlines()])
    assert sorted(rest) == list(range(stop + 1, steps + 1))
    assert all(rest[s]["loss"] == ref[s]["loss"] for s in rest)
