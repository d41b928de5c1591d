"""nbrgc-train --distributed mpi on loopback: 2 and 4 ranks started by the environment's mpiexec.

Data-parallel BP matches one process at the same global batch (1e-5 relative); RGC stages on
ranks give the same losses, bit for bit, as one process with a worker per stage and the same
thread groups; a failing rank ends the job with one line naming it and the step; a resume under
the same rank count continues exactly. Skipped where mpi4py or mpiexec is missing.
"""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("mpi4py", reason="the [mpi] extra is not installed")
MPIEXEC = shutil.which("mpiexec", path=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
if MPIEXEC is None:
    pytest.skip("no mpiexec (pip install -e '.[mpi]')", allow_module_level=True)

ROOT = Path(__file__).resolve().parents[1]
TRAIN = [sys.executable, str(ROOT / "bin" / "nbrgc-train")]
TINY = ["--config", "tiny", "--n-layer", "4", "--d-model", "32", "--n-head", "2", "--ctx", "16",
        "--batch", "4", "--json", "--quiet", "--log-every", "1", "--eval-batches", "2"]


def _env(**extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI", "OMPI_", "PMIX"))}
    env.pop("NBRGC_FAULT", None)
    env.update(extra)
    return env


def run(args, ranks=None, env=None, timeout=240):
    cmd = ([MPIEXEC, "-n", str(ranks)] if ranks else []) + TRAIN + TINY + [str(a) for a in args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env or _env())


def losses(proc):
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [json.loads(l) for l in proc.stdout.splitlines() if l.startswith("{") and '"loss"' in l]


def test_data_parallel_bp_matches_one_process():
    common = ["--mode", "bp", "--steps", "5", "--threads", "1"]
    one = losses(run(common))
    two = losses(run(common + ["--distributed", "mpi"], ranks=2))
    assert [r["step"] for r in two] == [r["step"] for r in one]
    for a, b in zip(two, one):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-5)
        assert set(a) == set(b)  # rank 0 logs what one process logs


@pytest.mark.parametrize("ranks", [2, 4])
def test_rgc_stages_on_ranks_equal_one_process_bitwise(ranks):
    common = ["--mode", "rgc-async", "--n-stages", "4", "--stage-threads", "1,1,1,1", "--steps", "6",
              "--max-staleness", "1"]
    one = losses(run(common + ["--threads", "4"]))
    many = losses(run(common + ["--distributed", "mpi", "--threads", str(4 // ranks)], ranks=ranks))
    assert len(many) == len(one) == 6
    for a, b in zip(many, one):
        assert a["stage_bpb"] == b["stage_bpb"]
        assert a["loss"] == b["loss"]


@pytest.mark.parametrize("ranks,extra", [
    (2, []),
    (4, ["--boundary-delay", "2", "--max-staleness", "2", "--aux-weight", "0.5"]),
    (2, ["--mode", "rgc-async", "--horizon", "stage", "--readout-blocks", "1"]),
], ids=["pipelined-bp-2", "delay-2-aux-4", "rgc-horizon-readout-2"])
def test_pipeline_stages_on_ranks_equal_one_process_bitwise(ranks, extra):
    """pipe-async's boundary gradients travel between ranks as messages: the same bits as one
    process (which are pipe-sync's, tests/test_pipe_async.py)."""
    common = ["--mode", "pipe-async", "--n-stages", "4", "--stage-threads", "1,1,1,1", "--steps", "8"]
    common += extra
    one = losses(run(common + ["--threads", "4"]))
    many = losses(run(common + ["--distributed", "mpi", "--threads", str(4 // ranks)], ranks=ranks))
    assert len(many) == len(one) == 8
    for a, b in zip(many, one):
        assert a["stage_bpb"] == b["stage_bpb"]
        assert a["loss"] == b["loss"]


def test_pipeline_resume_under_the_same_ranks_continues_exactly(tmp_path):
    """A checkpoint holds the messages in flight between the ranks (from the rank that wrote them);
    a resume posts receives only for the messages written after it."""
    common = ["--mode", "pipe-async", "--n-stages", "2", "--stage-threads", "1,1", "--steps", "7",
              "--boundary-delay", "2", "--horizon", "all", "--aux-weight", "1", "--distributed", "mpi",
              "--threads", "1"]
    whole = losses(run(common, ranks=2))
    out = tmp_path / "run"
    cut = run(common + ["--out", out, "--ckpt-every", "3", "--eval-every", "3"], ranks=2,
              env=_env(NBRGC_FAULT="raise:0:4"), timeout=120)
    assert cut.returncode != 0
    rest = losses(run(common + ["--out", out, "--ckpt-every", "3", "--eval-every", "3", "--resume"],
                      ranks=2))
    assert [r["step"] for r in rest] == [4, 5, 6, 7]
    assert [r["loss"] for r in rest] == [r["loss"] for r in whole[3:]]
    one = losses(run([a for a in common if a not in ("--distributed", "mpi")]))
    assert [r["loss"] for r in one] == [r["loss"] for r in whole]


def test_a_failing_rank_ends_the_job_with_one_line():
    p = run(["--mode", "rgc-async", "--n-stages", "2", "--steps", "8", "--distributed", "mpi",
             "--threads", "1"], ranks=2, env=_env(NBRGC_FAULT="raise:1:3"), timeout=120)
    assert p.returncode != 0
    lines = [l for l in p.stderr.splitlines() if l.startswith("error:")]
    assert lines == ["error: rank 1 at step 3: stage 1 failed: RuntimeError: injected fault in stage 1 "
                     "at step 3 (NBRGC_FAULT)"]
    assert not any(r["step"] > 3 for r in losses_of(p.stdout))


def losses_of(stdout):
    return [json.loads(l) for l in stdout.splitlines() if l.startswith("{") and '"loss"' in l]


def test_resume_under_the_same_ranks_continues_exactly(tmp_path):
    common = ["--mode", "rgc-async", "--n-stages", "2", "--stage-threads", "1,1", "--steps", "6",
              "--distributed", "mpi", "--threads", "1"]
    whole = losses(run(common, ranks=2))
    out = tmp_path / "run"
    cut = run(common + ["--out", out, "--ckpt-every", "3", "--eval-every", "3"], ranks=2,
              env=_env(NBRGC_FAULT="raise:0:4"), timeout=120)
    assert cut.returncode != 0
    rest = losses(run(common + ["--out", out, "--ckpt-every", "3", "--eval-every", "3", "--resume"], ranks=2))
    assert [r["step"] for r in rest] == [4, 5, 6]
    assert [r["loss"] for r in rest] == [r["loss"] for r in whole[3:]]
    assert (out / "mpi.json").exists() and (out / "run.json").exists()


def test_one_line_refusals():
    p = run(["--mode", "bp", "--steps", "2", "--distributed", "mpi"])
    assert p.returncode == 2 and p.stderr.strip().splitlines() == [
        "error: --distributed mpi: this process was not started by mpiexec; run mpiexec -n R "
        "nbrgc-train ... --distributed mpi"]
    p = run(["--mode", "rgc-async", "--n-stages", "4", "--steps", "2", "--distributed", "mpi"], ranks=3)
    errors = [l for l in p.stderr.splitlines() if l.startswith("error:")]
    assert p.returncode != 0 and errors == [
        "error: --distributed mpi with rgc-async: 3 ranks cannot share 4 stages equally; start 1, 2, "
        "4 ranks or change --n-stages"]


def _rank_pid(marker, rank):
    """The pid of the rank whose command line holds ``marker`` and whose PMI_RANK is ``rank``."""
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            if marker not in (d / "cmdline").read_bytes().decode(errors="replace"):
                continue
            env = (d / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"PMI_RANK={rank}".encode() in env:
            return int(d.name)
    return None


@pytest.mark.parametrize("sig", ["SIGKILL", "SIGSTOP"])
def test_a_killed_or_silent_rank_ends_the_job(tmp_path, sig):
    import signal
    import time
    marker = str(tmp_path / "marker")
    cmd = [MPIEXEC, "-n", "2"] + TRAIN + TINY + ["--mode", "rgc-async", "--n-stages", "2", "--steps", "100000",
                                                 "--distributed", "mpi", "--threads", "1", "--data-dir", marker]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=_env(NBRGC_MPI_TIMEOUT="5"))
    try:
        first = p.stdout.readline()  # rank 0 trains: the first log line
        assert first.startswith("{"), p.stderr.read()[-2000:]
        import threading  # keep reading: a full pipe would block rank 0 and hide its own timeout
        threading.Thread(target=p.stdout.read, daemon=True).start()
        pid = _rank_pid(marker, 1)
        assert pid is not None
        t0 = time.monotonic()
        os.kill(pid, getattr(signal, sig))
        p.wait(timeout=60)  # a hang fails here
        assert time.monotonic() - t0 < 30
        assert p.returncode != 0
        if sig == "SIGSTOP":  # the waiting rank names the silent one's absence and the step
            err = p.stderr.read()
            lines = [l for l in err.splitlines() if l.startswith("error:")]
            assert len(lines) == 1 and "did not answer within 5 s at step" in lines[0], err[-2000:]
    finally:
        if p.poll() is None:
            p.kill()
        pid = _rank_pid(marker, 1)
        if pid is not None:
            os.kill(pid, signal.SIGKILL)
