"""The compile phase covers the run: after warm_up, a training run (its steps, evaluations and the
closing sample) needs no kernel signature the phase did not already compile or load."""
import io
import os
import subprocess
import sys

import pytest

import nbrgc  # noqa: F401
from nbrgc.kernels.warmup import PHRASE, warm_up


@pytest.mark.parametrize("mode,attention,cold,optimizer", [
    ("bp", "store", True, "adamw"), ("bp", "recompute", False, "adamw"),
    ("rgc-async", "store", False, "adamw"), ("bp", "store", False, "muon")])
def test_warm_up_covers_a_run(mode, attention, cold, optimizer, tmp_path):
    """After warm_up a run compiles nothing. ``cold``: an empty cache, where two helper processes
    compile and this one only loads (the path a first run on a machine takes); the same run again
    on the now warm cache then computes the same bits (code compiled in a process and the same code
    loaded from the cache can round reassociated reductions differently)."""
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
warm_up(attention={attention!r}, mode={mode!r}, stream=status, optimizer={optimizer!r})
if {cold!r} and sys.argv[1] == "first" and "compiled in helper processes" not in status.getvalue():
    print("no parallel compile on a cold cache:", status.getvalue())
    sys.exit(2)
before = sigs()
tc = TrainConfig(mode={mode!r}, steps=2, batch=2, n_stages=1 if {mode!r} == 'bp' else 2, eval_every=1,
                 eval_batches=1, attention={attention!r}, optimizer={optimizer!r})
t = Trainer(preset('demo'), tc, 'default', None, progress=False, log=lambda m: None)
print(repr(t.run()["val_bpb"]))
from nbrgc.sample import generate
generate(t.model, b'ab', 4, temperature=0.8, top_k=4, seed=0)
new = sorted(n for n, s in sigs() - before if n.startswith('nbrgc.'))
print(new)
sys.exit(1 if new else 0)
"""
    env = dict(os.environ, NBRGC_CACHE=str(tmp_path)) if cold else None
    outs = []
    for run in ("first", "again") if cold else ("first",):
        p = subprocess.run([sys.executable, "-c", code, run], capture_output=True, text=True,
                           timeout=600, env=env)
        assert p.returncode == 0, p.stdout + p.stderr[-3000:]
        outs.append(p.stdout)
    assert len(set(outs)) == 1, outs  # the same val bpb, to the last bit, and nothing compiled


def test_status_lines():
    out = io.StringIO()  # not a terminal: no in-place redraws, only whole lines
    dt, n = warm_up(stream=out)
    lines = out.getvalue().splitlines()
    assert lines[-1].startswith("kernels ready in ") and dt >= 0
    assert (lines[0] == f"{PHRASE} ...") == (n > 0)
    assert warm_up(stream=out, quiet=True)[1] == 0  # everything is loaded now


def test_a_trainer_on_an_empty_cache_repeats_its_own_bits(tmp_path):
    """The API path: a Trainer on an empty cache has helper processes compile (ensure_cached) and
    computes with the cached kernels, so a second process gives the same bits."""
    code = """
import sys
from nbrgc.config import TrainConfig, preset
from nbrgc.trainer import Trainer
tc = TrainConfig(mode="bp", steps=2, batch=2, eval_every=1, eval_batches=1)
print(repr(Trainer(preset('demo'), tc, 'default', None, progress=False, log=lambda m: None).run()["val_bpb"]))
"""
    env = dict(os.environ, NBRGC_CACHE=str(tmp_path))
    outs = []
    for _ in range(2):
        p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                           env=env)
        assert p.returncode == 0, p.stderr[-3000:]
        outs.append(p.stdout)
    assert outs[0] == outs[1], outs
    assert list(tmp_path.glob("numba/*/warm-float32-store-bp"))


def test_the_entry_points_that_skip_the_second_optimisation_are_the_entry_points():
    """nbrgc.kernels.linking names them as strings (it is installed before the kernels are
    imported): they must be exactly the block-range and decoder entry points' names (a library is
    named by its function's qualified name), and importing nbrgc installs it."""
    from nbrgc.kernels import blocks, linking
    entries = list(blocks.BLOCKS_FWD.values()) + list(blocks.BLOCKS_BWD.values()) + [blocks.decoder_fwd_bwd]
    assert linking.ENTRY_POINTS == {f.py_func.__qualname__ for f in entries}
    from numba.core import codegen
    assert getattr(codegen.CPUCodeLibrary._optimize_final_module, "nbrgc_skips_second_pass", False)


def test_a_parallel_kernel_links_its_loop_body_without_a_second_pass_and_others_keep_it():
    import numpy as np
    from numba import njit, prange
    from nbrgc.kernels import linking

    @njit(parallel=True)
    def parallel(x):
        for i in prange(x.shape[0]):
            x[i] += 1.0

    @njit
    def serial(x):
        x[0] += parallel_free(x)

    @njit
    def parallel_free(x):
        return x[1]

    x = np.zeros(4)
    parallel(x)
    serial(x)
    assert x.tolist() == [2.0, 1.0, 1.0, 1.0]
    lib = lambda f: next(iter(f.overloads.values())).library  # noqa: E731
    assert linking.skips_second_pass(lib(parallel))
    assert not linking.skips_second_pass(lib(serial))  # it links a callee, but no parfor body
