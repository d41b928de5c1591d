"""SIGINT and SIGTERM during training (bp, rgc-sync, rgc-async with 4 stage threads): the workers stop,
a checkpoint is written, the process exits 0 within seconds, the checkpoint loads and the summary says
why it stopped; --resume then continues from that checkpoint."""
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import nbrgc  # noqa: F401  (thread-safe threading layer first)
from nbrgc import checkpoint as ck

REPO = Path(__file__).resolve().parents[1]
TRAIN = [sys.executable, str(REPO / "bin" / "nbrgc-train")]
COMMON = ["--config", "tiny", "--quiet", "--threads", "1", "--eval-batches", "1", "--json",
          "--log-every", "5", "--eval-every", "0"]
MODES = {
    "bp": ["--mode", "bp"],
    "rgc-sync": ["--mode", "rgc-sync", "--n-stages", "2"],
    "rgc-async": ["--mode", "rgc-async", "--n-layer", "4", "--n-stages", "4", "--stage-threads", "1,1,1,1"],
    "pipe-async": ["--mode", "pipe-async", "--n-layer", "4", "--n-stages", "4", "--stage-threads",
                   "1,1,1,1"],
}
STOP_WITHIN_S = 60.0  # a hang guard, not a speed claim: signal -> exit, checkpoint and final evaluation
# included, on a loaded machine; what is asserted is that the run stops at a step with its checkpoint


def _env():
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.pop("NBRGC_FAULT", None)
    return env


def start(*args):
    """Popen of nbrgc-train; returns (proc, queue of stdout lines, list collecting stderr)."""
    p = subprocess.Popen([*TRAIN, *COMMON, *map(str, args)], cwd=REPO, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=_env())
    lines, err = queue.Queue(), []

    def read_out():
        for line in p.stdout:
            lines.put(line)
        lines.put(None)
    threading.Thread(target=read_out, daemon=True).start()
    threading.Thread(target=lambda: err.append(p.stderr.read()), daemon=True).start()
    return p, lines, err


def wait_training(p, lines, err, timeout=120):
    """Block until the first training log line; returns the lines read so far."""
    seen, deadline = [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=0.5)
        except queue.Empty:
            continue
        if line is None:
            p.wait()
            time.sleep(0.2)
            pytest.fail(f"exited early ({p.returncode}): {''.join(err)}")
        seen.append(line)
        if '"loss"' in line:
            return seen
    p.kill()
    pytest.fail("no training step logged in time")


def finish(p, lines, err, seen):
    p.wait(timeout=60)
    while True:
        line = lines.get(timeout=10)
        if line is None:
            break
        seen.append(line)
    time.sleep(0.1)
    return [json.loads(s) for s in seen if s.strip().startswith("{")], "".join(err)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
@pytest.mark.parametrize("mode", list(MODES))
def test_signal_stops_checkpoints_and_exits_zero(tmp_path, mode, sig):
    out = tmp_path / "run"
    p, lines, err = start(*MODES[mode], "--steps", 10**6, "--out", out)
    seen = wait_training(p, lines, err)
    time.sleep(0.3)
    t_sig = time.monotonic()
    p.send_signal(sig)
    try:
        recs, stderr = finish(p, lines, err, seen)
    except subprocess.TimeoutExpired:
        p.kill()
        raise
    elapsed = time.monotonic() - t_sig
    assert p.returncode == 0, stderr
    assert elapsed < STOP_WITHIN_S, f"took {elapsed:.1f} s to stop"
    assert "Traceback" not in stderr
    summary = recs[-1]
    assert summary.get("summary") is True
    name = signal.Signals(sig).name
    assert summary["stopped"] == f"received {name}"
    n = summary["steps"]
    assert 0 < n < 10**6
    assert f"received {name}: checkpoint written at step {n}" in stderr
    assert summary["checkpoint"] == ck.checkpoint_path(out, n)
    n_stages = {"bp": 1, "rgc-sync": 2, "rgc-async": 4, "pipe-async": 4}[mode]
    arrays, meta = ck.load(summary["checkpoint"], expect={"mode": mode, "n_stages": n_stages})
    assert meta["step"] == n and np.isfinite(arrays["params"]).all()
    logged = [r["step"] for r in recs if "loss" in r]
    assert logged and max(logged) <= n
    assert np.isfinite(summary["val_bpb"])
    # --resume continues from exactly that checkpoint
    p, lines, err = start(*MODES[mode], "--steps", n + 3, "--out", out, "--resume", "--log-every", 1)
    recs, stderr = finish(p, lines, err, [])
    assert p.returncode == 0, stderr
    assert f"resumed from {summary['checkpoint']} (step {n})" in stderr
    assert [r["step"] for r in recs if "loss" in r] == [n + 1, n + 2, n + 3]
    assert recs[-1]["steps"] == n + 3 and recs[-1]["stopped"] is None


def test_signal_without_out_says_nothing_was_saved():
    p, lines, err = start("--steps", 10**6, "--no-save")
    seen = wait_training(p, lines, err)
    p.send_signal(signal.SIGTERM)
    recs, stderr = finish(p, lines, err, seen)
    assert p.returncode == 0, stderr
    assert "received SIGTERM: stopped at step" in stderr and "nothing saved" in stderr
    assert recs[-1]["stopped"] == "received SIGTERM" and recs[-1]["checkpoint"] is None
