"""Which BLAS library nbrgc's GEMMs call, chosen once at import (before any kernel compiles).

Two OpenBLAS builds are usually loaded in one process: SciPy's (LP64, exported through
``scipy.linalg.cython_blas``) and NumPy's own (``scipy-openblas``, ILP64, symbols ``scipy_sgemm_64_``).
They are separate builds, often of different OpenBLAS releases, and need not run a shape equally fast;
measured against each other, NumPy's was the faster on the weight-gradient shape ``X^T dY`` and equal on
the others (``benchmarks/README.md``). So ``auto`` takes NumPy's library when it exports the ILP64
symbols and SciPy's otherwise; ``NBRGC_BLAS=scipy`` or ``=numpy`` forces one (a clear error if it is
missing).

The choice is a compile-time constant of the kernels (the integer width of the Fortran arguments), so
:mod:`nbrgc.kernels.jitcache` folds :func:`cache_key` into the cache folder's name.
"""
import ctypes
import os

from ..errors import NbrgcError

_CHOICES = ("auto", "numpy", "scipy")
_chosen = None


class Blas:
    """name ('numpy' or 'scipy'), path of the shared library, ilp64, and the two GEMM addresses."""

    def __init__(self, name, path, ilp64, sgemm, dgemm):
        self.name, self.path, self.ilp64, self.sgemm, self.dgemm = name, path, ilp64, sgemm, dgemm

    def loaded_from(self, path):
        """Whether threadpoolctl's library file ``path`` is this BLAS."""
        path = (path or "").replace(os.sep, "/")
        if self.name == "scipy":  # self.path is the Cython wrapper; the library sits in scipy.libs
            return "/scipy" in path
        return os.path.realpath(path) == os.path.realpath(self.path)

    def describe(self):
        return f"{self.name}'s OpenBLAS ({'ILP64' if self.ilp64 else 'LP64'}, {self.path})"


def _numpy_openblas():
    """NumPy's bundled scipy-openblas, or None (other NumPy builds: Accelerate, MKL, system BLAS)."""
    import numpy  # noqa: F401  (loads the library so threadpoolctl can see it)
    from threadpoolctl import threadpool_info
    for info in threadpool_info():
        path = info.get("filepath") or ""
        if info.get("internal_api") != "openblas" or "numpy" not in path.replace(os.sep, "/"):
            continue
        try:
            lib = ctypes.CDLL(path)
            s, d = lib.scipy_sgemm_64_, lib.scipy_dgemm_64_
        except (OSError, AttributeError):
            continue
        addr = lambda f: ctypes.cast(f, ctypes.c_void_p).value  # noqa: E731
        return Blas("numpy", path, True, addr(s), addr(d))
    return None


def _scipy_blas():
    from numba.extending import get_cython_function_address
    import scipy.linalg.cython_blas as cb
    return Blas("scipy", getattr(cb, "__file__", "scipy.linalg.cython_blas"), False,
                get_cython_function_address("scipy.linalg.cython_blas", "sgemm"),
                get_cython_function_address("scipy.linalg.cython_blas", "dgemm"))


def choose():
    """The BLAS every GEMM uses (idempotent); honours NBRGC_BLAS."""
    global _chosen
    if _chosen is not None:
        return _chosen
    wanted = os.environ.get("NBRGC_BLAS", "auto").strip().lower() or "auto"
    if wanted not in _CHOICES:
        raise NbrgcError(f"NBRGC_BLAS={wanted!r}: must be one of {', '.join(_CHOICES)}")
    blas = None
    if wanted in ("auto", "numpy"):
        blas = _numpy_openblas()
        if blas is None and wanted == "numpy":
            raise NbrgcError("NBRGC_BLAS=numpy: this NumPy does not bundle scipy-openblas "
                             "(scipy_sgemm_64_ not found); use NBRGC_BLAS=scipy or auto")
    if blas is None:
        blas = _scipy_blas()
    _chosen = blas
    return blas


def cache_key():
    b = choose()
    return f"{b.name}:{int(b.ilp64)}"
