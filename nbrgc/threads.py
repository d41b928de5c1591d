"""Thread-safe Numba threading layer, BLAS thread control, per-thread groups.

Imported first by the package. Numba's default ``workqueue`` layer aborts the process when two Python
threads launch ``parallel=True`` kernels at once, which the asynchronous RGC pipeline does by design, so
we select ``omp`` (needs the system libgomp) or ``tbb`` (needs the ``tbb`` wheel) before anything is
compiled, and refuse to run without one.

BLAS is pinned to one thread: every GEMM goes through :mod:`nbrgc.kernels.gemm`, which splits the
product over the *calling* thread's Numba group. That way ``numba.set_num_threads`` inside a stage
worker controls all of that stage's compute, and stage groups never oversubscribe the cores through a
shared BLAS pool.
"""
import ctypes
import glob
import math
import os
import sys
import time

from .errors import NbrgcError

_PREFERENCE = ("omp", "tbb")
_STARTED = time.monotonic()  # about when this process started: nbrgc imports this early
_layer = None


def _preload_tbb():
    # The tbb wheel puts libtbb.so.12 in <env>/lib, which the dynamic loader does not search.
    for root in {sys.prefix, sys.exec_prefix, os.path.dirname(os.path.dirname(sys.executable))}:
        for path in sorted(glob.glob(os.path.join(root, "lib", "libtbb.so*"))):
            try:
                ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
                return True
            except OSError:
                continue
    return False


def select_layer():
    """Select and launch a thread-safe Numba threading layer; return its name (idempotent)."""
    global _layer
    if _layer is not None:
        return _layer
    import numba
    from numba.np.ufunc import parallel

    wanted = os.environ.get("NBRGC_THREADING_LAYER", "").strip().lower()
    order = (wanted,) if wanted else _PREFERENCE
    if wanted and wanted not in _PREFERENCE:
        raise NbrgcError(f"NBRGC_THREADING_LAYER={wanted!r}: must be one of {', '.join(_PREFERENCE)} "
                         "(workqueue is not thread-safe)")
    if "tbb" in order:
        _preload_tbb()
    errors = []
    layer = None
    for name in order:
        numba.config.THREADING_LAYER = name
        try:
            parallel._launch_threads()
            layer = numba.threading_layer()
            break
        except (ValueError, OSError) as exc:
            errors.append(f"{name}: {exc}".replace("\n", " "))
    if layer is None:
        raise NbrgcError("no thread-safe Numba threading layer could be loaded (tried "
                         f"{', '.join(order)}): install libgomp (apt install libgomp1) or "
                         f"`pip install tbb` [{'; '.join(errors)}]")
    if layer not in _PREFERENCE:
        raise NbrgcError(f"Numba selected the {layer!r} threading layer, which is not thread-safe")
    _layer = layer
    return layer


def limit_blas(n=1):
    """Pin every loaded BLAS to ``n`` threads (process-wide); returns the threadpoolctl controller."""
    from threadpoolctl import threadpool_limits
    import scipy.linalg.cython_blas  # noqa: F401  (load SciPy's OpenBLAS so it is limited too)
    return threadpool_limits(limits=n, user_api="blas")


def cpu_count():
    """Cores this process may run on (affinity-aware)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - non-Linux
        return os.cpu_count() or 1


def others_load():
    """Roughly how many cores other processes keep busy: the 1-minute load average less this
    process's own share of it (its CPU time, children's included, over its life so far, weighted as
    the kernel's exponential average weights the last ``elapsed`` seconds); None where the system
    does not say."""
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):  # pragma: no cover - non-Unix
        return None
    t = os.times()
    elapsed = max(1e-3, time.monotonic() - _STARTED)
    rate = (t.user + t.system + t.children_user + t.children_system) / elapsed
    return max(0.0, load - rate * (1.0 - math.exp(-elapsed / 60.0)))


def runnable_others(samples=5, gap=0.01):
    """Runnable tasks on the machine now, less the one sampling: the fewest of a few samples of
    /proc/loadavg's running count (a moment's spinning thread of this process is not load); None
    where the system does not say."""
    counts = []
    for i in range(samples):
        try:
            with open("/proc/loadavg") as f:
                counts.append(int(f.read().split()[3].split("/")[0]) - 1)
        except (OSError, ValueError, IndexError):
            return None
        if i + 1 < samples:
            time.sleep(gap)
    return max(0, min(counts))


def busy_note(threads, cores):
    """A one-line note when other processes keep the cores busy, else None. A parallel region waits
    for all its threads, so on a busy machine each one waits for a descheduled thread: there fewer
    threads than cores ran faster (benchmarks/contention.md). Busy means both over the last minute
    (the load average less this process's share) and now (the load average lags: a process that
    just ended still counts there)."""
    if threads < 2:
        return None
    load = others_load()
    if load is None or load < cores - 0.5:
        return None
    now = runnable_others()
    if now is not None:
        if now < cores - 0.5:
            return None
        load = min(load, now)
    return (f"the machine is busy (other processes keep about {load:.1f} of {cores} cores busy): a "
            f"parallel kernel waits for threads they delay; --threads {max(1, threads // 2)} may be "
            "faster")


def set_threads(n):
    """Set the calling thread's Numba group size, clamped to what Numba launched."""
    import numba
    n = max(1, min(int(n), numba.config.NUMBA_NUM_THREADS))
    numba.set_num_threads(n)
    return n


def describe():
    """One line for run logs."""
    import numba
    from .kernels.blas import choose
    return (f"threading layer {select_layer()}, {numba.config.NUMBA_NUM_THREADS} Numba threads "
            f"launched, {cpu_count()} cores, GEMMs through {choose().describe()}, BLAS pinned to 1 "
            "thread (GEMMs split over Numba groups)")
