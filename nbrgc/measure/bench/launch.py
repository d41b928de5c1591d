"""Start one bench worker in a fresh process and collect its result, its wall time and its peak RSS
(the child's own ``ru_maxrss`` from ``wait4``)."""
import json
import os
import subprocess
import sys
import tempfile
import time

from ...errors import NbrgcError


def _child_env(spec):
    import nbrgc
    env = dict(os.environ)
    root = os.path.dirname(os.path.dirname(os.path.abspath(nbrgc.__file__)))
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    from ...threads import cpu_count
    need = max([int(spec.get("threads", 1))] + list(spec.get("groups") or []))
    if spec.get("mode") == "torch":
        env["NUMBA_NUM_THREADS"] = "1"  # nbrgc's Numba pool stays idle beside PyTorch's
    elif need > cpu_count() and "NUMBA_NUM_THREADS" not in os.environ:
        env["NUMBA_NUM_THREADS"] = str(need)  # an oversubscribed sweep point needs that many
    return env


def launch(spec, timeout=None):
    """Run one worker in a fresh process; returns its result dict plus ``peak_rss_mib`` (the child's
    ``ru_maxrss`` from ``wait4``) and ``process_wall_s``. Raises NbrgcError when the worker fails."""
    cmd = [sys.executable, "-m", "nbrgc.measure.bench", "--worker", json.dumps(spec)]
    if spec.get("mode") == "torch":
        # PyTorch loads first: with Numba's OpenMP pool started before it (importing nbrgc does),
        # PyTorch's own OpenMP runtime ran ~10x slower on `paper` here (15 s/step instead of 1.3).
        cmd = [sys.executable, "-c", "import sys, torch; from nbrgc.measure.bench.worker import worker_main; "
               "sys.exit(worker_main(sys.argv[1:]))", "--worker", json.dumps(spec)]
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        p = subprocess.Popen(cmd, stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                             env=_child_env(spec))
        try:
            while True:
                pid, status, ru = os.wait4(p.pid, os.WNOHANG)
                if pid:
                    break
                if timeout is not None and time.perf_counter() - t0 > timeout:
                    p.kill()
                    os.wait4(p.pid, 0)
                    p.returncode = -9
                    raise NbrgcError(f"{_what(spec)} ran past --timeout {timeout:g} s")
                time.sleep(0.02)
        except BaseException:
            if p.returncode is None:
                p.kill()
                try:
                    os.wait4(p.pid, 0)
                except ChildProcessError:
                    pass
                p.returncode = -9
            raise
        p.returncode = rc = os.waitstatus_to_exitcode(status)
        wall = time.perf_counter() - t0
        out.seek(0)
        err.seek(0)
        stdout = out.read().decode(errors="replace")
        stderr = err.read().decode(errors="replace")
    if rc != 0:
        lines = [ln for ln in stderr.strip().splitlines() if ln.strip()]
        last = lines[-1] if lines else f"exit status {rc}"
        if last.startswith("error: "):
            last = last[len("error: "):]
        raise NbrgcError(f"{_what(spec)} failed: {last}")
    lines = [ln for ln in stdout.strip().splitlines() if ln.startswith("{")]
    if not lines:
        raise NbrgcError(f"{_what(spec)} printed no result")
    res = json.loads(lines[-1])
    res["peak_rss_mib"] = ru.ru_maxrss / 1024.0
    res["process_wall_s"] = wall
    return res


def _what(spec):
    if spec.get("kind") == "gemm":
        return f"GEMM peak worker ({spec.get('threads')} threads)"
    if spec.get("kind") == "profile":
        return f"kernel profile worker ({spec.get('threads')} threads, {spec.get('attention')})"
    return f"worker for {spec.get('label', spec.get('mode'))} ({spec.get('threads')} threads, " \
           f"round {spec.get('round', 0) + 1})"
