"""GEMM through the chosen OpenBLAS (NumPy's or SciPy's, see :mod:`nbrgc.kernels.blas`), split over the calling
thread's Numba group.

BLAS is pinned to one thread (see :mod:`nbrgc.threads`); parallelism comes from ``prange`` over
row (or column) blocks, so ``numba.set_num_threads`` in a stage worker governs its GEMMs too. We call
``?gemm`` directly rather than ``np.dot`` because it takes leading dimensions (column-sliced views
without copies) and ``beta`` (gradient accumulation in place).

The BLAS symbol is registered with LLVM by name (not embedded as an address), which keeps every
caller cacheable with ``cache=True``. Which library it names is chosen in :mod:`nbrgc.kernels.blas`; the
width of its integer arguments (``_BI``: 32-bit LP64 or 64-bit ILP64) is baked into the kernels, and
the cache folder is keyed on that choice.

Row-major ``C = alpha * op(A) @ op(B) + beta * C`` is column-major ``C^T = op(B)^T op(A)^T``, hence
the swapped operands in :func:`gemm`.
"""
import llvmlite.binding as llb
import numpy as np
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic, overload

from .blas import choose as _choose_blas
from .fastmath import cast_like
from .serial import GEMM_MACS, LIGHT, restore_threads, serial_below

_BLAS = _choose_blas()
llb.add_symbol("nbrgc_sgemm", _BLAS.sgemm)
llb.add_symbol("nbrgc_dgemm", _BLAS.dgemm)
_BI = np.int64 if _BLAS.ilp64 else np.int32

_sig = types.void(*([types.voidptr] * 13))
_sgemm = types.ExternalFunction("nbrgc_sgemm", _sig)
_dgemm = types.ExternalFunction("nbrgc_dgemm", _sig)


@intrinsic
def _addr_of(typingctx, val):
    """Pointer to a stack copy of a scalar (Fortran BLAS takes every argument by reference)."""
    def codegen(context, builder, sig, args):
        ptr = cgutils.alloca_once_value(builder, args[0])
        return builder.bitcast(ptr, cgutils.voidptr_t)
    return types.voidptr(val), codegen


@intrinsic
def _data_ptr(typingctx, arr):
    def codegen(context, builder, sig, args):
        a = context.make_array(sig.args[0])(context, builder, args[0])
        return builder.bitcast(a.data, cgutils.voidptr_t)
    return types.voidptr(arr), codegen


def _blas(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc):  # pragma: no cover - typing stub
    raise NotImplementedError


# Operands go as pointers and leading dimensions, so the many layouts and flags gemm is called with
# (each its own specialization, about 0.3 s of compile apiece) share one BLAS call per dtype.
@overload(_blas, nogil=True)
def _blas_impl(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc):
    fn = _sgemm if alpha == types.float32 else _dgemm

    def impl(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc):
        fn(_addr_of(ta), _addr_of(tb), _addr_of(m), _addr_of(n), _addr_of(k), _addr_of(alpha), a,
           _addr_of(lda), b, _addr_of(ldb), _addr_of(beta), c, _addr_of(ldc))
    return impl


@njit(nogil=True, cache=True, error_model="numpy")
def gemm(ta, tb, alpha, A, B, beta, C):
    """Single-threaded ``C = alpha op(A) op(B) + beta C`` on row-major views with unit column stride."""
    M, N = C.shape
    K = A.shape[0] if ta else A.shape[1]
    if M == 0 or N == 0:
        return
    if K == 0:
        for i in range(M):
            for j in range(N):
                C[i, j] = beta * C[i, j] if beta != 0.0 else 0.0
        return
    isz = C.itemsize
    _blas(np.uint8(84 if tb else 78), np.uint8(84 if ta else 78), _BI(N), _BI(M), _BI(K),
          cast_like(alpha, C), _data_ptr(B), _BI(B.strides[0] // isz), _data_ptr(A),
          _BI(A.strides[0] // isz), cast_like(beta, C), _data_ptr(C), _BI(C.strides[0] // isz))


# Constants passed as plain runtime values: Numba would compile _split_gemm (and the gemm calls in
# it) once per literal combination, about 1 s of a cold start each; the branches they pick are as
# cheap at run time, and the BLAS calls, hence the bits, are the same.
_F, _T = np.bool_(False), np.bool_(True)
_i = np.int64


@njit(parallel=True, nogil=True, cache=True, error_model="numpy")
def _split_gemm(ta, tb, A, B, C, beta, nt, split, min_block):
    """C = op(A) op(B) + beta C with the rows (split 0) or the columns (split 1) of C cut into at most
    ``nt`` blocks of at least ``min_block``, one single-threaded BLAS call per block. Every element
    stays one full-length dot product inside one call, so any cut is within float32 dot-product
    rounding of the exact product; the same bits come only from the same cut, since a BLAS kernel may
    round a block of another shape differently (OpenBLAS's Haswell kernels do at every cut tested)."""
    M, N = C.shape
    K = A.shape[0] if ta else A.shape[1]
    n = M if split == 0 else N
    nb = max(1, min(nt, n // min_block))
    step = (n + nb - 1) // nb
    prev = serial_below(M * N * K // GEMM_MACS)
    for i in prange(nb):
        s = i * step
        e = min(n, s + step)
        if s < e:
            if split == 0:
                if ta:
                    gemm(ta, tb, 1.0, A[:, s:e], B, beta, C[s:e])
                else:
                    gemm(ta, tb, 1.0, A[s:e], B, beta, C[s:e])
            elif tb:
                gemm(ta, tb, 1.0, A, B[s:e], beta, C[:, s:e])
            else:
                gemm(ta, tb, 1.0, A, B[:, s:e], beta, C[:, s:e])
    restore_threads(prev)


@njit(nogil=True, cache=True, inline="always", error_model="numpy")
def matmul(A, B, C, beta, nt):
    """C = A @ B + beta C, rows of C split over ``nt`` threads."""
    _split_gemm(_F, _F, A, B, C, beta, nt, _i(0), _i(16))


@njit(nogil=True, cache=True, inline="always", error_model="numpy")
def matmul_nt(A, B, C, beta, nt, split=0):
    """C = A @ B.T + beta C (data gradients: dX = dY W^T), rows (split 0) or columns (split 1) of C
    over threads (see nbrgc.kernels.gemm_plan for which the model uses)."""
    _split_gemm(_F, _T, A, B, C, beta, nt, _i(split), _i(16))


@njit(nogil=True, cache=True, inline="always", error_model="numpy")
def matmul_tn(A, B, C, beta, nt, split=0):
    """C = A.T @ B + beta C (weight gradients: dW = X^T dY), rows (split 0) or columns (split 1) of C
    over threads."""
    _split_gemm(_T, _F, A, B, C, beta, nt, _i(split), _i(8 if split == 0 else 16))


@njit(parallel=True, nogil=True, cache=True, error_model="numpy")
def add_bias(Y, b):
    prev = serial_below(Y.size // LIGHT)
    for i in prange(Y.shape[0]):
        for j in range(Y.shape[1]):
            Y[i, j] += b[j]
    restore_threads(prev)


@njit(nogil=True, cache=True, error_model="numpy")
def _colsum_cols(dY, db, s, e):
    """db[s:e] += sum over rows of dY[:, s:e], rows in order (the same bits however columns are cut).
    Views indexed from 0: a loop over range(s, e) keeps the negative-index check and does not
    vectorise."""
    acc = db[s:e]
    for r in range(dY.shape[0]):
        row = dY[r, s:e]
        for j in range(e - s):
            acc[j] += row[j]


@njit(parallel=True, nogil=True, cache=True, error_model="numpy")
def colsum_acc(dY, db, nt):
    """db += sum over rows of dY, split over column blocks (no write races, rows read contiguously)."""
    M = dY.shape[1]
    nb = max(1, min(nt, M // 16))
    step = (M + nb - 1) // nb
    prev = serial_below(dY.size // LIGHT)
    for i in prange(nb):
        s = i * step
        _colsum_cols(dY, db, s, min(M, s + step))
    restore_threads(prev)


@njit(nogil=True, cache=True, inline="always", error_model="numpy")
def linear_fwd(X, W, b, Y, nt):
    """Y = X @ W + b."""
    matmul(X, W, Y, 0.0, nt)
    add_bias(Y, b)


TASKS = 2  # a plan value for a weight-gradient site: see _bwd_tasks


@njit(parallel=True, nogil=True, cache=True, error_model="numpy")
def _bwd_tasks(X, W, dY, dX, dW, db, nt, dx_beta):
    """dW += X^T dY and db += colsum(dY) on one half of the group while the other half forms
    dX = dY W^T + dx_beta dX. The two products are independent and equally large, so each runs on
    fewer threads in bigger pieces, in one parallel region instead of two: 0.7-5% faster than the
    better split of each at the presets' shapes on 2 threads, where each product is then one whole
    BLAS call (the same bits as one thread). dX must not alias X here."""
    K, M = dW.shape
    N = dX.shape[0]
    half = max(1, nt // 2)
    nw = max(1, min(half, K // 8))
    nx = max(1, min(max(1, nt - half), N // 16))
    sw = (K + nw - 1) // nw
    sx = (N + nx - 1) // nx
    prev = serial_below(2 * K * M * dY.shape[0] // GEMM_MACS)
    for t in prange(nw + nx):
        if t < nw:
            s = t * sw
            e = min(K, s + sw)
            if s < e:
                gemm(_T, _F, 1.0, X[:, s:e], dY, 1.0, dW[s:e])
            if t == 0:
                _colsum_cols(dY, db, 0, M)
        else:
            s = (t - nw) * sx
            e = min(N, s + sx)
            if s < e:
                gemm(_F, _T, 1.0, dY[s:e], W, dx_beta, dX[s:e])
    restore_threads(prev)


@njit(nogil=True, cache=True, inline="always", error_model="numpy")
def linear_bwd(X, W, dY, dX, dW, db, nt, dx_beta, split_w=0, split_x=0):
    """dW += X^T dY, db += colsum(dY), dX = dY W^T + dx_beta * dX.

    ``split_w``/``split_x`` say how each product is cut over the group (0 rows, 1 columns), or
    ``split_w == TASKS`` runs the two products side by side (:func:`_bwd_tasks`; dX must not alias
    X). Otherwise dX may alias X: the weight gradient is formed first."""
    if split_w == TASKS and nt >= 2:
        _bwd_tasks(X, W, dY, dX, dW, db, nt, dx_beta)
        return
    matmul_tn(X, dY, dW, 1.0, nt, 1 if split_w == 1 else 0)
    colsum_acc(dY, db, nt)
    matmul_nt(dY, W, dX, dx_beta, nt, split_x)
