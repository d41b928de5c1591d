"""Real (hardware) atomics on elements of 1-D integer arrays, callable from ``nogil`` Numba code.

Numba has no atomic operations of its own: ``arr[i] += 1`` in two threads that both released the GIL
is a plain load/add/store and loses updates. The intrinsics here lower straight to LLVM's
``atomicrmw`` / ``cmpxchg`` / atomic ``load`` / ``store`` with sequentially consistent ordering, so
they are safe across any mix of Python threads running ``@njit(nogil=True)`` code and Numba's own
parallel workers, and they double as full memory fences for the surrounding (plain) loads/stores.

Intrinsics (use them inside ``@numba.njit`` functions)::

    atomic_add(arr, idx, val)               -> old value   # fetch-and-add (val may be negative)
    atomic_load(arr, idx)                   -> value
    atomic_store(arr, idx, val)             -> None

``arr`` must be a C- or A-layout, aligned, writable (except for ``atomic_load``) 1-D array of dtype
``int64`` or ``int32``; ``idx`` is any integer (negative indices wrap, out-of-range ones raise
``IndexError``); values are cast to the array's dtype (wrapping, as in C).

Python-callable wrappers (each is ``@njit(nogil=True)``, so calling one from Python compiles once per
type signature and releases the GIL while it runs)::

    fetch_add(arr, idx, val), load(arr, idx), store(arr, idx, val)

Example — the RGC round counter: K stage threads each post once; the poster that brings the counter
to K closes the round::

    @njit(nogil=True)
    def post(counter, k):
        if atomic_add(counter, 0, 1) == k - 1:   # I am the last poster of this round
            ... reduce the consensus buffer ...
            atomic_store(counter, 0, 0)
            return True
        return False
"""
import numba
from numba import types
from numba.core import cgutils
from numba.core.errors import TypingError
from numba.extending import intrinsic

__all__ = ["atomic_add", "atomic_load", "atomic_store", "fetch_add", "load", "store", "SUPPORTED_DTYPES"]

SUPPORTED_DTYPES = ("int64", "int32")
_ORDER = "seq_cst"
_DTYPES = (types.int64, types.int32)


# ----------------------------------------------------------------------------------------- typing helpers

def _check_array(fname, arr, write):
    if not isinstance(arr, types.Array) or arr.ndim != 1:
        raise TypingError(f"{fname}: expected a 1-D int64/int32 array, got {arr}")
    if arr.dtype not in _DTYPES:
        raise TypingError(f"{fname}: array dtype must be int64 or int32, got {arr.dtype}")
    if arr.layout not in ("C", "A"):
        raise TypingError(f"{fname}: array layout must be C or A, got {arr.layout}")
    if not arr.aligned:
        raise TypingError(f"{fname}: array must be aligned (atomics need natural alignment)")
    if write and not arr.mutable:
        raise TypingError(f"{fname}: array is read-only")


def _check_int(fname, what, ty):
    if not isinstance(ty, (types.Integer, types.Boolean)):
        raise TypingError(f"{fname}: {what} must be an integer, got {ty}")


def _elem_ptr(context, builder, aryty, ary, idxty, idx):
    """Pointer to ``ary[idx]`` (negative indices wrap; out of bounds raises IndexError)."""
    arr = context.make_array(aryty)(context, builder, ary)
    i = context.cast(builder, idx, idxty, types.intp)
    return cgutils.get_item_pointer(context, builder, aryty, arr, [i], wraparound=True, boundscheck=True)


def _align(context, dtype):
    return context.get_abi_sizeof(context.get_data_type(dtype))


# ------------------------------------------------------------------------------------------- intrinsics

@intrinsic
def atomic_add(typingctx, arr, idx, val):
    """Atomically ``arr[idx] += val``; returns the value before the addition (seq_cst)."""
    _check_array("atomic_add", arr, True)
    _check_int("atomic_add", "idx", idx)
    _check_int("atomic_add", "val", val)
    dtype = arr.dtype

    def codegen(context, builder, sig, args):
        aryty, idxty, valty = sig.args
        ptr = _elem_ptr(context, builder, aryty, args[0], idxty, args[1])
        v = context.cast(builder, args[2], valty, dtype)
        return builder.atomic_rmw("add", ptr, v, _ORDER)

    return dtype(arr, idx, val), codegen


@intrinsic
def atomic_load(typingctx, arr, idx):
    """Sequentially consistent atomic load of ``arr[idx]``."""
    _check_array("atomic_load", arr, False)
    _check_int("atomic_load", "idx", idx)
    dtype = arr.dtype

    def codegen(context, builder, sig, args):
        aryty, idxty = sig.args
        ptr = _elem_ptr(context, builder, aryty, args[0], idxty, args[1])
        return builder.load_atomic(ptr, _ORDER, _align(context, dtype))

    return dtype(arr, idx), codegen


@intrinsic
def atomic_store(typingctx, arr, idx, val):
    """Sequentially consistent atomic store ``arr[idx] = val``."""
    _check_array("atomic_store", arr, True)
    _check_int("atomic_store", "idx", idx)
    _check_int("atomic_store", "val", val)
    dtype = arr.dtype

    def codegen(context, builder, sig, args):
        aryty, idxty, valty = sig.args
        ptr = _elem_ptr(context, builder, aryty, args[0], idxty, args[1])
        v = context.cast(builder, args[2], valty, dtype)
        builder.store_atomic(v, ptr, _ORDER, _align(context, dtype))
        return context.get_dummy_value()

    return types.none(arr, idx, val), codegen


# -------------------------------------------------------------------------------- Python-callable wrappers

@numba.njit(nogil=True)
def fetch_add(arr, idx, val):
    """Atomic fetch-and-add on ``arr[idx]``; returns the old value."""
    return atomic_add(arr, idx, val)


@numba.njit(nogil=True)
def load(arr, idx):
    """Atomic (seq_cst) load of ``arr[idx]``."""
    return atomic_load(arr, idx)


@numba.njit(nogil=True)
def store(arr, idx, val):
    """Atomic (seq_cst) store ``arr[idx] = val``."""
    atomic_store(arr, idx, val)
