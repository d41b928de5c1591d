"""Where Numba caches our compiled kernels.

Numba keys a cached function on its own source file only: when a kernel it calls changes, the caller's
stale machine code is still loaded. We therefore cache into a folder named by a hash of every kernel
source, so an edited or upgraded package never runs old code. A user who sets NUMBA_CACHE_DIR keeps
full control (and that caveat).
"""
import hashlib
import os


def configure():
    import numba
    if os.environ.get("NUMBA_CACHE_DIR"):
        return numba.config.CACHE_DIR
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "kernels")  # all jitted code
    from .blas import cache_key
    h = hashlib.sha256(numba.__version__.encode() + cache_key().encode())
    for root, _, files in sorted(os.walk(here)):
        for name in sorted(files):
            if name.endswith(".py"):
                with open(os.path.join(root, name), "rb") as f:
                    h.update(name.encode() + f.read())
    base = os.environ.get("NBRGC_CACHE", os.path.join(os.path.expanduser("~"), ".cache", "nbrgc"))
    path = os.path.join(base, "numba", h.hexdigest()[:16])
    try:
        os.makedirs(path, exist_ok=True)
    except OSError:
        return numba.config.CACHE_DIR  # read-only home: Numba falls back to its own locations
    numba.config.CACHE_DIR = path
    return path
