"""Reliability of nbrgc-train end to end: nothing lost, nothing hung, nothing silently wrong.

* corrupt / truncated / wrong-version checkpoints are named and skipped on --resume; an intact
  checkpoint of another run (wrong config) is refused with its name;
* SIGKILL at random moments, each followed by --resume: training always continues from the newest
  complete checkpoint and logs exactly the losses of an uninterrupted run;
* non-finite loss/gradients stop the run with one line naming the step and the stage, or are skipped
  with --on-nan skip; NaN parameters are never written over a good checkpoint;
* an exception in any rgc-async stage ends the run promptly with that stage's error, no thread left;
* the output folder, the memory bound and up-front validation of flags.

Faults are injected with ``NBRGC_FAULT`` (see :class:`nbrgc.faults.FaultHook`). Everything uses the
tiny preset and one thread; the subprocesses load the cached kernels.
"""
import json
import os
import random
import shutil
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
TINY = ["--config", "tiny", "--quiet", "--threads", "1", "--eval-batches", "1"]
ASYNC4 = ["--mode", "rgc-async", "--config", "tiny", "--n-layer", "4", "--n-stages", "4",
          "--stage-threads", "1,1,1,1"]


def cli(*args, env=None, timeout=120):
    """Run nbrgc-train; CompletedProcess with text stdout/stderr."""
    e = dict(os.environ, PYTHONUNBUFFERED="1")
    e.pop("NBRGC_FAULT", None)
    e.update(env or {})
    return subprocess.run([*TRAIN, *TINY, *map(str, args)], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout, env=e)


def records(stdout):
    return [json.loads(line) for line in stdout.splitlines() if line.strip().startswith("{")]


def steps_of(recs):
    """{step: record} of the training log lines."""
    return {r["step"]: r for r in recs if "loss" in r}


def assert_one_line_error(p, *needles):
    """Non-zero exit, no traceback, the last stderr line is the one ``error:`` line."""
    assert p.returncode != 0, p.stderr
    assert "Traceback" not in p.stderr, p.stderr
    errors = [line for line in p.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and p.stderr.strip().splitlines()[-1] == errors[0], p.stderr
    for n in needles:
        assert n in errors[0], (n, errors[0])
    return errors[0]


def same_losses(got, want, keys=("loss", "lr", "grad_norm")):
    """Log lines of the same step agree exactly on the training quantities."""
    for step, r in got.items():
        for k in keys:
            assert r[k] == want[step][k], (step, k, r[k], want[step][k])


# --------------------------------------------------------------------------- checkpoints
N_REF = 8
BASE = ["--steps", N_REF, "--ckpt-every", 2, "--eval-every", 4, "--keep", 4, "--json", "--log-every", 1]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """An uninterrupted bp run of N_REF steps with checkpoints at 2, 4, 6, 8: (out dir, log lines)."""
    out = tmp_path_factory.mktemp("ref") / "run"
    p = cli(*BASE, "--out", out)
    assert p.returncode == 0, p.stderr
    assert [os.path.basename(c) for c in ck.list_checkpoints(out)] == \
        [f"ckpt-{s:09d}.nbrgc" for s in (2, 4, 6, 8)]
    return out, steps_of(records(p.stdout))


def _truncate(path):
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)


def _flip_payload(path):
    with open(path, "r+b") as f:
        f.seek(-5, os.SEEK_END)
        b = f.read(1)
        f.seek(-5, os.SEEK_END)
        f.write(bytes([b[0] ^ 0x40]))


def _version(path):
    with open(path, "r+b") as f:
        f.seek(8)
        f.write((ck.FORMAT_VERSION + 1).to_bytes(4, "little"))


def _header(path):
    with open(path, "r+b") as f:
        f.seek(30)
        b = f.read(1)
        f.seek(30)
        f.write(bytes([b[0] ^ 0x01]))


def _empty(path):
    open(path, "wb").close()


CORRUPTIONS = {"truncated": (_truncate, "truncated"), "bitflip": (_flip_payload, "payload checksum mismatch"),
               "version": (_version, f"format version {ck.FORMAT_VERSION + 1}, expected"),
               "header": (_header, "header checksum mismatch"), "empty": (_empty, "truncated")}


def _copy_run(reference, tmp_path, upto):
    """A copy of the reference run folder holding only its checkpoints <= ``upto``."""
    out = tmp_path / "run"
    shutil.copytree(reference[0], out)
    for c in ck.list_checkpoints(out):
        if int(os.path.basename(c)[5:14]) > upto:
            os.remove(c)
    return out


@pytest.mark.parametrize("kind", list(CORRUPTIONS))
def test_corrupt_newest_checkpoint_is_named_and_the_previous_one_used(reference, tmp_path, kind):
    out = _copy_run(reference, tmp_path, upto=6)
    bad, good = ck.checkpoint_path(out, 6), ck.checkpoint_path(out, 4)
    corrupt, reason = CORRUPTIONS[kind]
    corrupt(bad)
    p = cli(*BASE, "--out", out, "--resume")
    assert p.returncode == 0, p.stderr
    assert f"skipping checkpoint: {bad}: " in p.stderr and reason in p.stderr, p.stderr
    assert f"resumed from {good} (step 4)" in p.stderr, p.stderr
    got = steps_of(records(p.stdout))
    assert sorted(got) == [5, 6, 7, 8]
    same_losses(got, reference[1])
    # the rewritten step-6 checkpoint replaced the corrupt file and loads
    ck.load(ck.checkpoint_path(out, 6))


def test_every_checkpoint_corrupt_starts_over_with_each_named(reference, tmp_path):
    out = _copy_run(reference, tmp_path, upto=4)
    _truncate(ck.checkpoint_path(out, 4))
    _flip_payload(ck.checkpoint_path(out, 2))
    p = cli(*BASE, "--out", out, "--resume")
    assert p.returncode == 0, p.stderr
    for s in (2, 4):
        assert f"skipping checkpoint: {ck.checkpoint_path(out, s)}: " in p.stderr
    assert "starting from step 0" in p.stderr
    got = steps_of(records(p.stdout))
    assert sorted(got) == list(range(1, N_REF + 1))
    same_losses(got, reference[1])


def test_checkpoint_of_another_run_is_refused_by_name(reference, tmp_path):
    """An intact checkpoint with another model config is not silently skipped (the folder holds
    another run's work): --resume stops with one line naming the file and the first difference."""
    other = tmp_path / "other"
    p = cli("--steps", 2, "--n-layer", 4, "--out", other)
    assert p.returncode == 0, p.stderr
    out = _copy_run(reference, tmp_path, upto=4)
    foreign = ck.checkpoint_path(out, 6)
    shutil.copy(ck.checkpoint_path(other, 2), foreign)  # intact, newest by name, another config
    p = cli(*BASE, "--out", out, "--resume")
    assert_one_line_error(p, str(foreign), "model_config.n_layer mismatch")
    # another mode on --resume: refused with the checkpoint named
    out2 = _copy_run(reference, tmp_path / "b", upto=4)
    p = cli(*BASE, "--out", out2, "--resume", "--mode", "rgc-sync", "--n-stages", 2)
    assert_one_line_error(p, str(ck.checkpoint_path(out2, 4)), "mismatch")
    # another model config on --resume: refused from run.json before anything is touched
    p = cli(*BASE, "--out", out2, "--resume", "--n-layer", 4)
    assert_one_line_error(p, "another model config")


# --------------------------------------------------------------------------- SIGKILL
KILL_STEPS = 300
KILL_ARGS = ["--steps", KILL_STEPS, "--ckpt-every", 2, "--eval-every", 1000, "--keep", 2, "--batch", 16,
             "--json", "--log-every", 1]


def _env():
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.pop("NBRGC_FAULT", None)
    return env


class Proc:
    """A CLI process whose stdout/stderr are read by threads (the first stdout line is timed)."""

    def __init__(self, *args):
        self.t0 = time.monotonic()
        self.p = subprocess.Popen([*TRAIN, *TINY, *map(str, args)], cwd=REPO, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, env=_env())
        self.out, self.err, self.t_first = [], [], None
        self._threads = [threading.Thread(target=self._read_out, daemon=True),
                         threading.Thread(target=lambda: self.err.append(self.p.stderr.read()), daemon=True)]
        for th in self._threads:
            th.start()

    def _read_out(self):
        for line in self.p.stdout:
            if self.t_first is None:
                self.t_first = time.monotonic() - self.t0
            self.out.append(line)

    def wait(self, timeout=300):
        self.p.wait(timeout=timeout)
        for th in self._threads:
            th.join(10)
        self.t_total = time.monotonic() - self.t0
        return self.p.returncode, "".join(self.out), "".join(self.err)


def test_sigkill_at_random_moments_then_resume_loses_nothing(tmp_path):
    ref = Proc(*KILL_ARGS, "--out", tmp_path / "ref")
    rc, stdout, stderr = ref.wait()
    assert rc == 0, stderr
    want = steps_of(records(stdout))
    assert sorted(want) == list(range(1, KILL_STEPS + 1))
    # kill during start-up or in the first quarter of the training, attempt by attempt in turn:
    # start-up is most of a run's wall time, so one window over both mostly killed runs before
    # their first checkpoint, and then no resume from a checkpoint was tested at all
    startup = (0.7 * ref.t_first, ref.t_first)
    training = (ref.t_first, ref.t_first + (ref.t_total - ref.t_first) / 4)
    out = tmp_path / "run"
    rnd = random.Random(6)
    kills, finished, attempt, resumed = 0, False, 0, 0
    while not finished and kills < 10 and attempt < 40:
        found = ck.list_checkpoints(out) if out.is_dir() else []
        before = int(ck.load(found[-1])[1]["step"]) if found else 0
        proc = Proc(*KILL_ARGS, "--out", out, *(["--resume"] if attempt else []))
        time.sleep(rnd.uniform(*(training if attempt % 2 else startup)))
        if proc.p.poll() is None:
            proc.p.send_signal(signal.SIGKILL)
            kills += 1
        rc, stdout, stderr = proc.wait()
        finished = rc == 0
        assert finished or rc == -signal.SIGKILL, stderr
        got = steps_of(records(stdout))
        if attempt and before:  # it continued from the newest complete checkpoint there was
            assert f"resumed from {found[-1]} (step {before})" in stderr or not got, stderr
            resumed += bool(got)
        if got:
            assert min(got) == before + 1, (min(got), before)
            same_losses(got, want)
        for c in ck.list_checkpoints(out) if out.is_dir() else []:  # nothing partial under a final name
            ck.load(c)
        attempt += 1
    assert kills >= 5, f"only {kills} kills landed in {attempt} attempts"
    if not finished:  # the last resume runs to the end
        found = ck.list_checkpoints(out) if out.is_dir() else []
        before = int(ck.load(found[-1])[1]["step"]) if found else 0
        resumed += before > 0
        rc, stdout, stderr = Proc(*KILL_ARGS, "--out", out, "--resume").wait()
        assert rc == 0, stderr
        got = steps_of(records(stdout))
        if before == KILL_STEPS:  # the last kill landed after the final checkpoint, before the exit
            assert not got and "nothing to train" in stderr, stderr
        else:
            assert min(got) == before + 1 and max(got) == KILL_STEPS
            same_losses(got, want)
    assert resumed, "no run resumed from a checkpoint: the kills all landed before the first one"
    final, meta = ck.load(ck.checkpoint_path(out, KILL_STEPS))
    ref_final, ref_meta = ck.load(ck.checkpoint_path(tmp_path / "ref", KILL_STEPS))
    for name in ("params", "adam_m", "adam_v"):
        assert np.array_equal(final[name], ref_final[name]), name
    assert meta["batches"] == ref_meta["batches"]
    assert not [n for n in os.listdir(out) if n.startswith(".ckpt-")], os.listdir(out)


def test_resume_of_a_finished_run_trains_nothing_and_reports_it(tmp_path):
    """What a process killed after its final checkpoint (before it could exit) leaves behind: the
    resume trains nothing, says so, and still reports the final checkpoint and its evaluation."""
    out = tmp_path / "run"
    first = cli("--steps", 4, "--ckpt-every", 2, "--eval-every", 1000, "--out", out, "--json")
    assert first.returncode == 0, first.stderr
    again = cli("--steps", 4, "--ckpt-every", 2, "--eval-every", 1000, "--out", out, "--json",
                "--resume")
    assert again.returncode == 0, again.stderr
    assert "nothing to train" in again.stderr and not steps_of(records(again.stdout))
    summary = records(again.stdout)[-1]
    assert summary["summary"] and summary["tokens"] == 0 and summary["steps"] == 4
    assert summary["checkpoint"] == str(ck.checkpoint_path(out, 4))
    assert summary["val_bpb"] == records(first.stdout)[-1]["val_bpb"]


# --------------------------------------------------------------------------- divergence
@pytest.mark.parametrize("mode, where", [
    (["--mode", "bp"], "(global backprop)"),
    (["--mode", "rgc-sync", "--n-stages", 2], "(stage "),
    (ASYNC4, "(stage "),
])
def test_huge_lr_diverges_with_one_line_naming_step_and_stage(mode, where, tmp_path):
    out = tmp_path / "run"
    p = cli(*mode, "--steps", 6, "--eval-every", 100, "--lr", "1e30", "--out", out, timeout=60)
    line = assert_one_line_error(p, "non-finite", "at step ", where,
                                 "use --on-nan skip")
    assert "stage" in line or "backprop" in line
    assert ck.list_checkpoints(out) == []  # nothing diverged was saved


@pytest.mark.parametrize("mode, fault, msg", [
    (["--mode", "bp"], "nan:0:3", "non-finite loss at step 3 (global backprop)"),
    (["--mode", "rgc-sync", "--n-stages", 2], "nan:1:3", "non-finite loss at step 3 (stage 1)"),
    (ASYNC4, "nan:3:3", "stage 3 failed: DivergenceError: non-finite loss at step 3 (stage 3)"),
])
def test_injected_nan_stops_naming_step_and_stage(mode, fault, msg, tmp_path):
    out = tmp_path / "run"
    p = cli(*mode, "--steps", 8, "--ckpt-every", 2, "--eval-every", 100, "--out", out,
            env={"NBRGC_FAULT": fault}, timeout=60)
    assert_one_line_error(p, msg)
    # the checkpoint before the fault is the newest and is intact
    assert [int(os.path.basename(c)[5:14]) for c in ck.list_checkpoints(out)] == [2]
    arrays, _ = ck.load(ck.checkpoint_path(out, 2))
    assert np.isfinite(arrays["params"]).all()


@pytest.mark.parametrize("mode", [["--mode", "bp"], ["--mode", "rgc-sync", "--n-stages", 2], ASYNC4])
def test_on_nan_skip_skips_exactly_that_step(mode, tmp_path):
    p = cli(*mode, "--steps", 8, "--eval-every", 5, "--on-nan", "skip", "--json", "--log-every", 1,
            "--out", tmp_path / "run", env={"NBRGC_FAULT": "nan:0:3"}, timeout=60)
    assert p.returncode == 0, p.stderr
    recs = records(p.stdout)
    got = steps_of(recs)
    assert sorted(got) == list(range(1, 9))
    assert [s for s, r in got.items() if r.get("skipped")] == [4]
    assert all(np.isfinite(r["loss"]) for s, r in got.items() if s != 4)
    summary = recs[-1]
    assert summary["summary"] and np.isfinite(summary["val_bpb"]) and summary["checkpoint"]
    assert np.isfinite(ck.load(summary["checkpoint"])[0]["params"]).all()


def test_nan_parameters_never_overwrite_a_good_checkpoint(tmp_path):
    """Under --on-nan skip the trainer keeps going; should its parameters be NaN at a checkpoint
    (here injected for step 3, the checkpoint is after step 4), the save is refused with one line
    and the previous checkpoint stays the newest, intact."""
    out = tmp_path / "run"
    p = cli("--steps", 10, "--ckpt-every", 2, "--eval-every", 100, "--on-nan", "skip", "--out", out,
            env={"NBRGC_FAULT": "nan:0:3"}, timeout=60)
    assert_one_line_error(p, "refusing to save", "'params'", "non-finite", "ckpt-000000004")
    assert [int(os.path.basename(c)[5:14]) for c in ck.list_checkpoints(out)] == [2]
    assert np.isfinite(ck.load(ck.checkpoint_path(out, 2))[0]["params"]).all()
    assert not [n for n in os.listdir(out) if n.startswith(".ckpt-")]
    # and --resume continues from it
    p = cli("--steps", 10, "--ckpt-every", 2, "--eval-every", 100, "--out", out, "--resume")
    assert p.returncode == 0 and "(step 2)" in p.stderr, p.stderr


def test_fault_spec_is_validated():
    p = cli("--steps", 1, env={"NBRGC_FAULT": "boom"})
    assert_one_line_error(p, "NBRGC_FAULT")


# --------------------------------------------------------------------------- worker faults
@pytest.mark.parametrize("stage", [0, 3])
def test_rgc_async_stage_fault_via_cli_is_one_line_and_prompt(stage):
    # Prompt means: nothing trains past the fault (step t reads decoder version t - S, which needs
    # every stage's step t - S - 1, so no step after the failed one can complete), and the run ends
    # rather than waiting on the failed stage (the timeout catches a hang). No clock is asserted.
    p = cli(*ASYNC4, "--steps", 50, "--eval-every", 100, "--json", "--log-every", 1,
            env={"NBRGC_FAULT": f"raise:{stage}:5"}, timeout=120)
    assert_one_line_error(p, f"stage {stage} failed: RuntimeError: injected fault in stage {stage} at step 5")
    logged = [json.loads(x)["step"] for x in p.stdout.splitlines() if x.startswith("{") and '"loss"' in x]
    assert max(logged, default=0) <= 5, logged  # steps 0..4 (logged as 1..5) at most


def test_rgc_async_stage_fault_in_process_leaves_no_thread():
    """Trainer level: each of 4 stages fails in turn; StageError names it, within seconds, and no
    stage thread is left running (checked from a watchdog so a deadlock fails instead of hanging)."""
    from nbrgc.config import TrainConfig, preset
    from nbrgc.errors import StageError
    from nbrgc.faults import FaultHook
    from nbrgc.trainer import Trainer
    data = np.frombuffer(bytes(range(256)) * 40, np.uint8)
    mcfg = preset("tiny", n_layer=4)
    for stage in range(4):
        tc = TrainConfig(mode="rgc-async", n_stages=4, stage_threads="1,1,1,1", steps=40, batch=2,
                         eval_every=0, eval_batches=1, threads=1, warmup=0)
        tr = Trainer(mcfg, tc, data, progress=False, log=lambda m: None,
                     fault_hook=FaultHook(f"raise:{stage}:{3 + stage}"))
        box = {}

        def go():
            try:
                tr.run()
            except BaseException as exc:  # noqa: BLE001
                box["exc"] = exc
        t0 = time.monotonic()
        th = threading.Thread(target=go, daemon=True)
        th.start()
        th.join(30)
        assert not th.is_alive(), f"stage {stage}: the run did not end (deadlock)"
        assert time.monotonic() - t0 < 15
        exc = box.get("exc")
        assert isinstance(exc, StageError) and exc.stage == stage, exc
        assert isinstance(exc.cause, RuntimeError)
        assert not [t.name for t in threading.enumerate() if t.name.startswith("nbrgc-stage")]


# --------------------------------------------------------------------------- output folder, memory
def test_out_holding_another_run(tmp_path):
    out = tmp_path / "run"
    assert cli("--steps", 4, "--ckpt-every", 2, "--out", out).returncode == 0
    assert_one_line_error(cli("--steps", 4, "--out", out), "already holds a run", "--resume", "--force")
    assert_one_line_error(cli("--steps", 4, "--out", out, "--n-layer", 4), "already holds a run")
    # --force starts over: the old run's checkpoints go, so a later --resume cannot pick them up
    p = cli("--steps", 1, "--out", out, "--force")
    assert p.returncode == 0, p.stderr
    assert "--force: removed 3 checkpoint(s)" in p.stderr  # 2, 3, 4 (evaluated every step, keep 3)
    assert [os.path.basename(c) for c in ck.list_checkpoints(out)] == ["ckpt-000000001.nbrgc"]
    # an unreadable run.json
    (out / "run.json").write_text("{not json")
    assert_one_line_error(cli("--steps", 1, "--out", out, "--resume"), "run.json is unreadable", "--force")
    (out / "run.json").write_text("[1, 2]")
    assert_one_line_error(cli("--steps", 1, "--out", out, "--resume"), "run.json is unreadable")
    # a file where the folder should be
    f = tmp_path / "file"
    f.write_text("x")
    assert_one_line_error(cli("--steps", 1, "--out", f), "cannot use", "run folder")


def test_memory_bound_is_printed_and_enforced():
    p = cli("--steps", 1, "--max-memory", "0.1")
    line = assert_one_line_error(p, "this run needs about", "MiB but --max-memory allows 0.1 MiB")
    assert "lower --batch" in line
    p = cli("--steps", 1, "--max-memory", "100000", "--json")
    assert p.returncode == 0, p.stderr
    assert "expected memory:" in p.stderr
    summary = records(p.stdout)[-1]
    assert 0 < summary["expected_mib"] < 100000
    # without --max-memory, against what the machine has: an absurd model is refused up front
    t0 = time.monotonic()
    p = cli("--steps", 1, "--n-layer", 10**11)
    assert_one_line_error(p, "this run needs about", "are available")
    assert time.monotonic() - t0 < 30
    assert_one_line_error(cli("--steps", 1, "--eval-batches", 10**11), "this run needs about")
    assert_one_line_error(cli("--steps", 1, "--max-memory", "-5"), "--max-memory must be > 0")


# --------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("args, needle", [
    (["--n-layer", "3", "--mode", "rgc-sync", "--n-stages", "2"], "must divide n_layer"),
    (["--seq", "17"], "seq (17) must be <= ctx (16)"),
    (["--seq", "-1"], "--seq must be >= 0"),
    (["--d-model", "30", "--n-head", "4"], "divisible by n_head"),
    (["--n-layer", "0"], "n_layer must be >= 1"),
    (["--batch", "0"], "batch must be >= 1"),
    (["--batch", "0", "--tokens", "100"], "batch must be >= 1"),
    (["--batch", "abc"], "invalid int value"),
    (["--lr", "nan"], "not a finite number"),
    (["--lr", "0"], "lr must be > 0"),
    (["--time", "inf"], "not a finite number"),
    (["--time", "0"], "--time must be > 0"),
    (["--min-lr-frac", "2"], "min_lr_frac must be <= 1"),
    (["--mode", "fast"], "mode must be one of"),
    (["--on-nan", "maybe"], "on_nan must be stop or skip"),
    (["--config", "huge"], "unknown config preset"),
    (["--keep", "0"], "keep must be >= 1"),
    (["--mode", "rgc-async", "--n-stages", "2", "--stage-threads", "1,x"], "comma-separated integers"),
    (["--mode", "rgc-async", "--n-stages", "2", "--stage-threads", "1,1,1"], "3 groups for 2 stages"),
    (["--mode", "rgc-async", "--n-stages", "2", "--stage-threads", "0,1"], "must be >= 1"),
    (["--mode", "rgc-async", "--n-stages", "2", "--stage-threads", "1000,1000"], "far beyond"),
    (["--attention", "flash"], "attention must be one of store, recompute, got 'flash'"),
    (["--mode", "rgc-async", "--n-stages", "2", "--stage-workers", "0"], "auto or a positive integer"),
    (["--mode", "rgc-async", "--n-stages", "2", "--stage-workers", "3"], "must be <= n_stages (2)"),
    (["--mode", "rgc-async", "--n-stages", "2", "--stage-workers", "1", "--stage-threads", "2,1"],
     "stages 0, 1 (all on worker 0 of 1) different groups"),
    (["--threads", "100000"], "far beyond"),
    (["--resume"], "--resume needs --out"),
    (["--out", ""], "--out needs a folder name"),
    (["--bogus"], "unrecognized arguments"),
])
def test_bad_flags_one_line(args, needle):
    assert_one_line_error(cli("--steps", "1", *args, timeout=60), needle)


def test_bad_datasets_one_line(tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    short = tmp_path / "short.txt"
    short.write_bytes(b"abcdefgh")
    window = tmp_path / "window.txt"
    window.write_bytes(b"x" * 200)  # a 90/5/5 split, but the 5% val part is shorter than seq + 1
    (tmp_path / "nofiles").mkdir()
    cases = [(tmp_path / "missing.txt", "no such file or folder"), (empty, "is empty"),
             (short, "too short"), (window, "too short"), (tmp_path / "nofiles", "has no files"),
             ("text:", "text: needs a path"), ("nonsense", "unknown dataset")]
    for spec, needle in cases:
        assert_one_line_error(cli("--steps", 1, "--dataset", spec), needle)
    if os.geteuid() != 0:  # root reads anything
        locked = tmp_path / "locked.txt"
        locked.write_bytes(b"y" * 10000)
        locked.chmod(0)
        assert_one_line_error(cli("--steps", 1, "--dataset", locked))
