"""A vectorisable ``exp`` for float32 kernels.

Without Intel SVML, LLVM lowers ``np.exp`` to one libm call per element, which is what limited the
GELU and softmax loops. This version is plain arithmetic (range reduction to 2^n * e^r, |r| <= ln2/2,
degree-7 Taylor polynomial, 2^n built from the exponent bits), so the loops around it vectorise.
Relative error about 2e-7 — below float32 resolution at the scale of a loss. float64 inputs keep
``np.exp``: the gradient checks run in float64 and deserve the exact function.
"""
import numpy as np
from numba import types
from numba.extending import intrinsic, overload

# Reassociation and contraction let reductions and polynomials vectorise; no 'nnan'/'ninf', so a
# NaN still propagates to the divergence checks, and no 'afn', so float64 np.exp stays exact.
# Kernels also use error_model="numpy": Python's ZeroDivisionError check on every `/` is a branch
# that stops LLVM vectorising a loop (x / 0 gives inf, and the divergence checks catch it).
FLAGS = {"reassoc", "contract", "arcp", "nsz"}

_LOG2E = 1.4426950408889634
_LN2 = 0.6931471805599453


@intrinsic
def _int_bits_to_f32(typingctx, n):
    def codegen(context, builder, sig, args):
        from llvmlite import ir
        return builder.bitcast(args[0], ir.FloatType())
    return types.float32(types.int32), codegen


def fexp(x):  # pragma: no cover - replaced by the overload inside jitted code
    return np.exp(x)


@overload(fexp, inline="always")
def _fexp(x):
    if x == types.float32:
        lo, hi = np.float32(-87.0), np.float32(88.0)
        log2e, ln2 = np.float32(_LOG2E), np.float32(_LN2)
        c = [np.float32(1.0 / f) for f in (1, 1, 2, 6, 24, 120, 720, 5040)]
        c0, c1, c2, c3, c4, c5, c6, c7 = c

        def impl(x):
            x = min(max(x, lo), hi)
            n = np.floor(x * log2e + np.float32(0.5))
            r = x - n * ln2
            p = c7
            p = p * r + c6
            p = p * r + c5
            p = p * r + c4
            p = p * r + c3
            p = p * r + c2
            p = p * r + c1
            p = p * r + c0
            return p * _int_bits_to_f32((np.int32(n) + np.int32(127)) << np.int32(23))
        return impl
    return lambda x: np.exp(x)




@intrinsic
def fmax(typingctx, a, b):
    """max(a, b) as LLVM's ``maxnum``, which the loop vectoriser turns into packed max reductions;
    Numba's ``max`` and ``a if a > b else b`` are compare-and-branch and kept row maxima scalar (0.65
    against 0.13 ns per element here). A NaN argument is ignored here, but a NaN score still reaches
    the output through the ``exp`` that follows."""
    if not (isinstance(a, types.Float) and isinstance(b, types.Float)):
        return None
    out = a if a.bitwidth >= b.bitwidth else b

    def codegen(context, builder, sig, args):
        from llvmlite import ir
        from numba.core import cgutils
        x, y = (context.cast(builder, v, t, out) for v, t in zip(args, sig.args))
        ty = x.type
        name = "llvm.maxnum.f32" if ty == ir.FloatType() else "llvm.maxnum.f64"
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ty, [ty, ty]), name)
        return builder.call(fn, [x, y], fastmath=("nnan", "nsz"))
    return out(a, b), codegen


@intrinsic
def cast_like(typingctx, x, arr):
    """``x`` as a scalar of ``arr``'s dtype: keeps float32 loops in float32 without allocating. The
    same conversion as ``arr.dtype.type(x)`` in compiled code (Numba's ``context.cast``), emitted
    directly: an inlined ``@overload`` would be compiled in full, per signature, and thrown away."""
    if not isinstance(arr, types.Array) or not isinstance(x, (types.Number, types.Boolean)):
        return None
    dt = arr.dtype

    def codegen(context, builder, sig, args):
        return context.cast(builder, args[0], sig.args[0], dt)
    return dt(x, arr), codegen
