"""The compile phase covers the run: after warm_up, a training run (its steps, evaluations and the
closing sample) needs no kernel signature the phase did not already compile or load."""
import io
import os
import subprocess
import sys

import pytest

import nbrgc  # noqa: F401
from nbrgc.kernels.warmup import PHRASE, warm_up


@pytest.mark.parametrize("mode,attention,cold", [("bp", "store", True), ("bp", "recompute", False),
                                                 ("rgc-async", "store", False)])
def test_warm_up_covers_a_run(mode, attention, cold, tmp_path):
    """``cold``: an empty cache, where a second process compiles the blocks' backward and this
    one loads it from the cache (the path a first run on a machine takes)."""
    code = f"""
import gc, io, sys
from numba.core.dispatcher import Dispatcher
import nbrgc
from nbrgc.config import TrainConfig, preset
from nbrgc.kernels.warmup import warm_up
from nbrgc.trainer import Trainer
def sigs():
    return {{(d.py_func.__module__ + '.' + d.py_func.__qualname__, str(s)) for d in gc.get_objects()
            if isinstance(d, Dispatcher) for s in d.overloads}}
status = io.StringIO()
warm_up(attention={attention!r}, mode={mode!r}, stream=status)
if {cold!r} and "in a second process" not in status.getvalue():
    print("no parallel compile on a cold cache:", status.getvalue())
    sys.exit(2)
before = sigs()
tc = TrainConfig(mode={mode!r}, steps=2, batch=2, n_stages=1 if {mode!r} == 'bp' else 2, eval_every=1,
                 eval_batches=1, attention={attention!r})
t = Trainer(preset('tiny'), tc, 'default', None, progress=False, log=lambda m: None)
t.run()
from nbrgc.sample import generate
generate(t.model, b'ab', 4, temperature=0.8, top_k=4, seed=0)
new = sorted(n for n, s in sigs() - before if n.startswith('nbrgc.'))
print(new)
sys.exit(1 if new else 0)
"""
    env = dict(os.environ, NBRGC_CACHE=str(tmp_path)) if cold else None
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                       env=env)
    assert p.returncode == 0, p.stdout + p.stderr[-3000:]


def test_status_lines():
    out = io.StringIO()  # not a terminal: no in-place redraws, only whole lines
    dt, n = warm_up(stream=out)
    lines = out.getvalue().splitlines()
    assert lines[-1].startswith("kernels ready in ") and dt >= 0
    assert (lines[0] == f"{PHRASE} ...") == (n > 0)
    assert warm_up(stream=out, quiet=True)[1] == 0  # everything is loaded now
