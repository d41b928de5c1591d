"""Where Numba caches our compiled kernels.

Numba keys a cached function on its own source file only: when a kernel it calls changes, the caller's
stale machine code is still loaded. We therefore cache into a folder named by a hash of everything the
machine code depends on: every source in this package, the Numba version, the BLAS choice (a
compile-time constant, :func:`nbrgc.kernels.blas.cache_key`) and the CPU Numba compiles for (its name
and feature string, as Numba takes them: ``NUMBA_CPU_NAME``/``NUMBA_CPU_FEATURES`` when set, else
LLVM's host CPU), so a home directory shared by two machines never loads code compiled for the other.
A user who sets NUMBA_CACHE_DIR keeps full control (and that caveat).
"""
import hashlib
import os


def cpu_key():
    """The target CPU Numba compiles for: ``name:features``."""
    import llvmlite.binding as llb
    from numba.core import config
    name = config.CPU_NAME or llb.get_host_cpu_name()
    features = config.CPU_FEATURES
    if features is None:
        features = llb.get_host_cpu_features().flatten()
    return f"{name}:{features}"


def cache_key():
    """16 hex digits naming the cache folder."""
    import numba
    from .blas import cache_key as blas_key
    here = os.path.dirname(os.path.abspath(__file__))  # this package: all jitted code
    h = hashlib.sha256("\0".join((numba.__version__, blas_key(), cpu_key())).encode())
    for root, _, files in sorted(os.walk(here)):
        for name in sorted(files):
            if name.endswith(".py"):
                with open(os.path.join(root, name), "rb") as f:
                    h.update(name.encode() + f.read())
    return h.hexdigest()[:16]


def configure():
    import numba
    if os.environ.get("NUMBA_CACHE_DIR"):
        return numba.config.CACHE_DIR
    base = os.environ.get("NBRGC_CACHE", os.path.join(os.path.expanduser("~"), ".cache", "nbrgc"))
    path = os.path.join(base, "numba", cache_key())
    try:
        os.makedirs(path, exist_ok=True)
    except OSError:
        return numba.config.CACHE_DIR  # read-only home: Numba falls back to its own locations
    numba.config.CACHE_DIR = path
    return path
