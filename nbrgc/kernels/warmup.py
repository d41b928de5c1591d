"""Compile (or load from Numba's cache) the kernels a run uses, before it starts, in one visible phase.

Without this, each kernel compiles on its first call, inside the first training step, where a
progress bar at 0% looks like a hang. :func:`warm_up` instead calls every Model entry point a run
uses once, on a one-layer model of a few bytes with the run's dtype and attention handling: the
argument types, which are all that compiled code depends on, are those of the real run, so its
steps then only load nothing and compile nothing. Numba's own cache (``cache=True``, see
:mod:`nbrgc.kernels.jitcache`) keeps the machine code, so this is slow once per machine and version.

The Python API does not need this: kernels still compile lazily on first use.
"""
import os
import subprocess
import sys
import time

import numpy as np

PHRASE = "compiling kernels (once per machine and version)"


class _Status:
    """One stderr line, rewritten in place on a terminal (a line per step elsewhere)."""

    def __init__(self, stream):
        self.stream = stream
        self.tty = bool(getattr(stream, "isatty", lambda: False)())
        self.width = 0

    def show(self, text, final=False):
        if self.tty:
            pad = " " * max(0, self.width - len(text))
            self.stream.write("\r" + text + pad + ("\n" if final else ""))
            self.width = 0 if final else len(text)
        elif final:
            self.stream.write(text + "\n")
        self.stream.flush()


class _Compiles:
    """Counts real compiles (not cache loads: Numba fires no event for those) and reports the
    kernel being compiled."""

    def __init__(self, on_kernel):
        from numba.core import event
        self.event, self.on_kernel, self.n, self.depth = event, on_kernel, 0, 0
        outer = self

        class Listener(event.Listener):
            def on_start(self, ev):
                outer.n += 1
                outer.on_kernel(ev.data["dispatcher"].py_func.__name__)

            def on_end(self, ev):
                pass
        self.listener = Listener()

    def __enter__(self):
        self.event.register("numba:compile", self.listener)
        return self

    def __exit__(self, *exc):
        self.event.unregister("numba:compile", self.listener)


# On a cold cache a second process compiles the blocks' backward (about 40% of the compile time)
# while this one compiles the rest: Numba compiles in the calling thread only, so one process
# leaves the other core idle.
CHILD_PART = ("blocks backward",)
# Steps that need the child's output (they then only load it from the cache).
AFTER_CHILD = CHILD_PART + ("embedding backward",)


def steps(dtype=np.float32, attention="store", mode="bp", skip_forward=False):
    """[(what, callable)]: the Model entry points a run of ``mode`` calls, each on a model of a few
    bytes (the argument types are the run's). ``skip_forward`` gives the backward a workspace
    array of the right type instead of a forward's output (the child's part needs no forward)."""
    from ..config import ModelConfig
    from ..model import Model
    from ..optim import AdamW
    from .adamw import sumsq
    model = Model(ModelConfig(n_layer=1, d_model=8, n_head=1, ctx=2, vocab=16), dtype=dtype,
                  attention=attention)
    x = np.zeros((1, 2), np.int64)
    ws = model.workspace(1, 2)
    M, V = np.zeros_like(model.flat), np.zeros_like(model.flat)
    opt = AdamW(model.flat, model.grad_flat, M, V, model.decay_mask, 0, model.layout.size)
    h = [ws.resid[1]] if skip_forward else []
    out = [
        ("embedding", lambda: h.append(model.embed(x, ws))),
        ("blocks forward", lambda: h.append(model.forward_blocks(h[-1], 0, 1, ws))),
        ("decoder forward and backward", lambda: h.append(model.decoder_loss_and_grad(h[-1], x, ws)[1])),
        ("blocks backward", lambda: h.append(model.backward_blocks(h[-1], 0, 1, ws))),
        ("embedding backward", lambda: model.embed_backward(ws, h[-1])),
        ("gradient norm", lambda: sumsq(model.grad_flat)),
        ("AdamW", lambda: opt.step(1e-3)),
        ("evaluation", lambda: model.decoder_loss(model.forward_blocks(model.embed(x, ws), 0, 1, ws),
                                                  x, ws)),
        ("sampling", lambda: model.logits(x)),
    ]
    if mode != "bp":
        from .atomics import fetch_add, store
        counters = np.zeros(1, np.int64)
        out.append(("stage rounds", lambda: (fetch_add(counters, 0, 1), store(counters, 0, 0))))
    return out


def _spawn_child(dtype, attention, mode):
    """Start ``python -m nbrgc.kernels.warmup`` compiling CHILD_PART into the shared cache.
    Two processes may then write one kernel's cache index at once (a kernel both parts use with
    different signatures); a lost index entry costs only a recompile in a later run."""
    env = dict(os.environ, NUMBA_NUM_THREADS=os.environ.get("NUMBA_NUM_THREADS", "1"))
    return subprocess.Popen([sys.executable, "-m", "nbrgc.kernels.warmup", np.dtype(dtype).name,
                             attention, mode], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)


def warm_up(dtype=np.float32, attention="store", mode="bp", stream=None, quiet=False,
            parallel=True):
    """Compile or load every kernel a run uses, with a status line on ``stream`` (default stderr;
    none with ``quiet``); returns (seconds, kernels compiled in this process). On a cold cache
    (the first step compiles) and with ``parallel``, a child process compiles CHILD_PART beside
    it."""
    status = _Status(sys.stderr if stream is None else stream)
    if quiet:
        status.show = lambda text, final=False: None
    t0 = time.perf_counter()
    todo = steps(dtype, attention, mode)
    where = {"i": 0, "what": todo[0][0]}
    last = [0.0]

    def on_kernel(name):
        now = time.perf_counter()
        if status.tty and now - last[0] > 0.1:  # a redraw every 0.1 s at most
            last[0] = now
            status.show(f"{PHRASE}: {where['i'] + 1}/{len(todo)} {where['what']}: {name} ...")
        elif not status.tty and not last[0]:
            last[0] = now
            status.show(f"{PHRASE} ...", final=True)

    child, deferred = None, []
    with _Compiles(on_kernel) as compiles:
        for i, (what, call) in enumerate(todo):
            where.update(i=i, what=what)
            if child is not None and what in AFTER_CHILD:
                deferred.append((i, what, call))
                continue
            call()
            if i == 0 and compiles.n and parallel and (os.cpu_count() or 1) > 1:
                child = _spawn_child(dtype, attention, mode)
        if child is not None:
            status.show(f"{PHRASE}: waiting for the {', '.join(CHILD_PART)} (a second process) ...")
            err = child.communicate()[1]
            if child.returncode:  # this process compiles them itself; say why once
                status.show(f"parallel compile failed, continuing alone: "
                            f"{err.decode(errors='replace').strip().splitlines()[-1:]}", final=True)
            for i, what, call in deferred:
                where.update(i=i, what=what)
                call()
    dt = time.perf_counter() - t0
    how = "cached" if compiles.n == 0 else f"{compiles.n} compiled, cached for the next run"
    if child is not None and not child.returncode:
        how = how.replace(" compiled", f" compiled here and the {', '.join(CHILD_PART)} in a second "
                                       "process")
    status.show(f"kernels ready in {dt:.1f} s ({how})", final=True)
    return dt, compiles.n


def _child(dtype, attention, mode):
    for what, call in steps(np.dtype(dtype).type, attention, mode, skip_forward=True):
        if what in CHILD_PART:
            call()


if __name__ == "__main__":
    _child(*sys.argv[1:4])
