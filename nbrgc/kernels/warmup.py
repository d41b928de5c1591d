"""Compile (or load from Numba's cache) the kernels a run uses, before it starts, in one visible phase.

Without this, each kernel compiles on its first call, inside the first training step, where a
progress bar at 0% looks like a hang. :func:`warm_up` instead calls every Model entry point a run
uses once, on a one-layer model of a few bytes with the run's dtype and attention handling: the
argument types, which are all that compiled code depends on, are those of the real run, so its
steps then only load nothing and compile nothing. Numba's own cache (``cache=True``, see
:mod:`nbrgc.kernels.jitcache`) keeps the machine code, so this is slow once per machine and version.

The Python API needs no call: a Trainer calls :func:`ensure_cached`, the quiet form; other entry
points compile lazily on first use.
"""
import os
import subprocess
import sys
import time

import numpy as np

PHRASE = "compiling kernels (once per machine and version)"


class _Status:
    """One stderr line, rewritten in place on a terminal (a line per step elsewhere)."""

    def __init__(self, stream, quiet=False):
        self.stream = stream
        if quiet:
            self.show = lambda text, final=False: None
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


# On a machine's first run of a version, two helper processes compile the kernels into the cache (the
# backward kernels, the decoder's included, and the update in one; the forward, evaluation and the
# rest in the other: about half the work each, measured, and Numba compiles in the calling thread
# only), and this process then loads them all. Loading matters as much as the
# second core: a kernel compiled in this process can round its reassociated reductions differently
# from the same kernel loaded from the cache (docs/schemes.md), so a first run computing with freshly
# compiled code would not repeat its own results on the second run.
PARTS = ("backward and update", "the rest")
# PARTS[0]'s steps, in the order it compiles them: the blocks' backward first, so that by the time it
# reaches the decoder, the other helper has cached the forward kernels the two share (a kernel the
# other process has cached is loaded, not compiled again). The evaluation runs the decoder's kernel
# without its backward, so it comes after the decoder, in the same helper.
_FIRST = ("AdamW", "gradient norm", "embedding backward", "blocks backward",
          "decoder forward and backward", "evaluation")


def steps(dtype=np.float32, attention="store", mode="bp", skip_forward=False, optimizer="adamw"):
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
        # the decoder's loss alone, on a block output (sampling, Model.logits, calls the same kernels)
        ("evaluation", lambda: model.decoder_loss(ws.resid[1], x, ws)),
    ]
    if optimizer == "muon":
        from ..optim import Muon
        muon = Muon(model.flat, model.grad_flat, M, V, model.decay_mask, 0, model.layout.size,
                    model.layout)
        out.append(("Muon", lambda: muon.step(1e-3)))
    if mode != "bp":
        from .atomics import fetch_add, store
        counters = np.zeros(1, np.int64)
        out.append(("stage rounds", lambda: (fetch_add(counters, 0, 1), store(counters, 0, 0))))
    return out


def _marker(dtype, attention, mode, optimizer="adamw"):
    """The file that says this version's kernels for a run of this kind are in the cache."""
    import numba
    d = numba.config.CACHE_DIR
    kind = f"{np.dtype(dtype).name}-{attention}-{mode}" + ("" if optimizer == "adamw" else f"-{optimizer}")
    return os.path.join(d, f"warm-{kind}") if d else None


def _spawn(dtype, attention, mode, part, optimizer="adamw"):
    """``python -m nbrgc.kernels.warmup`` compiling one of PARTS into the shared cache. The two may
    write one kernel's cache index at once (a kernel both parts use with different signatures); a
    lost entry only means this process compiles that kernel itself."""
    # the package's parent folder first on the path: bin/ runs it from a checkout that pip has not
    # installed, and the helper must import this very copy
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
    env = dict(os.environ, NUMBA_NUM_THREADS=os.environ.get("NUMBA_NUM_THREADS", "1"), PYTHONPATH=path)
    return subprocess.Popen([sys.executable, "-m", "nbrgc.kernels.warmup", np.dtype(dtype).name,
                             attention, mode, part, optimizer], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)


def _compile_in_helpers(dtype, attention, mode, status, optimizer="adamw"):
    """Run the two helper processes to the end (at once on several cores, one after the other on
    one), with the elapsed time on the status line; returns the last error line of each that
    failed."""
    together = (os.cpu_count() or 1) > 1
    t0 = time.perf_counter()
    status.show(f"{PHRASE}, in {'two processes' if together else 'a second process'} ...",
                final=not status.tty)
    errors = []
    for group in ([PARTS] if together else [[p] for p in PARTS]):
        helpers = [_spawn(dtype, attention, mode, part, optimizer) for part in group]
        while any(h.poll() is None for h in helpers):
            time.sleep(0.2)
            if status.tty:
                status.show(f"{PHRASE}: {time.perf_counter() - t0:.0f} s ...")
        for h in helpers:
            err = h.stderr.read().decode(errors="replace").strip().splitlines()
            h.stderr.close()
            if h.returncode:
                errors.append(err[-1] if err else f"exit status {h.returncode}")
    return errors


def _mark(marker):
    try:
        with open(marker, "w"):
            pass
    except OSError:
        pass  # a read-only cache: the next run compiles in helpers again


def ensure_cached(dtype=np.float32, attention="store", mode="bp", optimizer="adamw"):
    """Make sure a run of this kind finds its kernels in the cache (helper processes compile them
    the first time for this version), so this process only loads them: what :class:`Trainer` calls
    before a run, quietly. True when they are (or were already) cached."""
    marker = _marker(dtype, attention, mode, optimizer)
    if marker is None or os.path.exists(marker):
        return marker is not None
    if _compile_in_helpers(dtype, attention, mode, _Status(sys.stderr, quiet=True), optimizer):
        return False
    _mark(marker)
    return True


def warm_up(dtype=np.float32, attention="store", mode="bp", stream=None, quiet=False,
            parallel=True, optimizer="adamw"):
    """Compile or load every kernel a run uses, with a status line on ``stream`` (default stderr;
    none with ``quiet``); returns (seconds, kernels compiled in this process). The first time for
    this version (no marker in the cache) and with ``parallel``, helper processes compile them (two
    at once where there are two cores) and this one loads them."""
    status = _Status(sys.stderr if stream is None else stream, quiet)
    t0 = time.perf_counter()
    marker = _marker(dtype, attention, mode, optimizer)
    helped, errors = False, []
    if parallel and marker and not os.path.exists(marker):
        errors = _compile_in_helpers(dtype, attention, mode, status, optimizer)
        helped = not errors
        if errors:  # this process compiles what is missing itself; say why once
            status.show(f"parallel compile failed, continuing alone: {errors[0]}", final=True)
    todo = steps(dtype, attention, mode, optimizer=optimizer)
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

    with _Compiles(on_kernel) as compiles:
        for i, (what, call) in enumerate(todo):
            where.update(i=i, what=what)
            call()
    if marker:
        _mark(marker)
    dt = time.perf_counter() - t0
    if helped:
        how = "compiled in helper processes, cached for the next run" + (
            f"; {compiles.n} more compiled here" if compiles.n else "")
    else:
        how = "cached" if compiles.n == 0 else f"{compiles.n} compiled, cached for the next run"
    status.show(f"kernels ready in {dt:.1f} s ({how})", final=True)
    return dt, compiles.n


def _child(dtype, attention, mode, part, optimizer="adamw"):
    first = part == PARTS[0]
    todo = dict(steps(np.dtype(dtype).type, attention, mode, skip_forward=first, optimizer=optimizer))
    for what in (_FIRST if first else [w for w in todo if w not in _FIRST]):
        todo[what]()


if __name__ == "__main__":
    _child(*sys.argv[1:6])
