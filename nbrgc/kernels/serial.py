"""Small work runs in the calling thread: a parallel kernel brackets its ``prange`` region with
:func:`serial_below` and :func:`restore_threads`.

A 2-thread region costs about 3 µs idle, but on a busy machine it also waits for its second thread
to be scheduled, up to a time slice (~6 ms measured, benchmarks/contention.md); a region whose work
takes microseconds gains nothing worth that risk. Below :data:`SERIAL_WORK` the region's group is
set to 1 (``numba.set_num_threads`` is thread-local and read when a region starts), so every
iteration runs on the calling thread, and the previous group is restored after it. Every kernel
cuts its work by its ``nt`` argument (or per row), never by the group size, and no ``prange`` loop
holds a reduction variable, so the bits do not depend on this switch.

``work`` is the kernel's serial cost in units of one element of a streaming pass with some
arithmetic per element (LayerNorm, GELU, cross-entropy, AdamW: 0.4-0.7 ns each here); a plain copy,
add or sum element counts :data:`LIGHT` of one (~0.1 ns) and a GEMM multiply-add :data:`GEMM_MACS`
of them (~0.015 ns).
"""
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic
from numba.np.ufunc.parallel import _iget_num_threads as _get_group, _launch_threads

# Measured idle on this machine (group 2 against group 1, the same kernel and split): a 2-thread
# region starts paying at 4-8 µs of serial work (LayerNorm ~6k elements, GELU and cross-entropy
# ~5k, AdamW ~20k, GEMM ~2^19 multiply-adds; benchmarks/contention-threshold.json). At 2^15 units
# a kernel takes 10-20 µs serially, so running everything below it serially costs at most ~9 µs a
# call idle, against a stall of up to a time slice (~6 ms) per region on a busy machine. It
# serialises tiny's kernels except AdamW, its attention backward and its head's backward (those
# are at or above 2^15), and none of demo's or small's except their bias adds and embedding.
SERIAL_WORK = 1 << 15
LIGHT = 4      # plain copy/add/sum elements per unit of work
GEMM_MACS = 32  # GEMM multiply-adds per unit of work


# numba.get_num_threads/set_num_threads in jitted code call the threading layer through ctypes
# pointers, which Numba will not cache; _get_group (Numba's own, what its parallel regions use) and
# _set_group call the same functions by the symbol names the threading layer registers with LLVM,
# so the kernels stay cacheable.
@intrinsic
def _set_group(typingctx, n):
    _launch_threads()
    if not isinstance(n, types.Integer):
        return None

    def codegen(context, builder, sig, args):
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ir.VoidType(), [ir.IntType(32)]), "set_num_threads")
        builder.call(fn, [context.cast(builder, args[0], sig.args[0], types.int32)])
        return context.get_dummy_value()
    return types.none(n), codegen


@njit(nogil=True, cache=True, inline="always")
def serial_below(work):
    """Set the calling thread's group to 1 when ``work`` < SERIAL_WORK; returns the group to give
    :func:`restore_threads` after the region."""
    prev = _get_group()
    if prev > 1 and work < SERIAL_WORK:
        _set_group(1)
    return prev


@njit(nogil=True, cache=True, inline="always")
def restore_threads(prev):
    if _get_group() != prev:
        _set_group(prev)
