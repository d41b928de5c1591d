"""How each backward GEMM is cut over a thread group: a fixed rule of the group size, never a timing.

A BLAS call's rounding depends on its shape: OpenBLAS's Haswell kernels round every row or column
block of a product differently from the whole product, its SkylakeX kernels only some small shapes.
So the same bits come from the same cut, on every machine. A cut chosen by timing at start-up would
make two runs of one seed, or a resumed run and the uninterrupted one, drift apart in the last bits;
the rule is therefore a function of the group size alone, so that two runs with the same thread groups
give the same bits on any BLAS kernel:

* an even group runs the weight and data gradients of each block's linear layer side by side on half
  the group each (``TASKS``, :func:`nbrgc.kernels.gemm._bwd_tasks`): at the presets' shapes that is
  faster than the better split of each product (``benchmarks/README.md``), and with 2 threads each
  product is one whole BLAS call, the same call as with 1 thread: 1 and 2 threads give the same bits
  in these products on any kernel (not in a whole step: the forward products and the LayerNorm sums
  are cut by the group size);
* an odd group cuts both products by rows;
* the head's products are always cut by rows: the decoder writes its data gradient over the
  product's input, which rules out running the two side by side.

Cutting every product into the same pieces whatever the group size would make all group sizes agree
to the bit, but one thread would then pay for the cut: pieces instead of one call are slower on a
single thread (``benchmarks/README.md``, "Tried and not kept").

Plan entries, in order: MLP-down (weight, data), MLP-up, attention output, qkv, head.
"""
import numba
import numpy as np

from .gemm import TASKS

N_SITES = 10
_BLOCK_SITES = 4  # MLP-down, MLP-up, attention output, qkv; the head is the fifth
_plans = {}  # by group size: made once, so a training step allocates nothing here


def plan_for(nt=None):
    """The split plan (int64, N_SITES, read-only) for the calling thread's group size (``nt``
    overrides it)."""
    nt = numba.get_num_threads() if nt is None else nt
    plan = _plans.get(nt)
    if plan is None:
        plan = np.zeros(N_SITES, np.int64)
        if nt >= 2 and nt % 2 == 0:
            plan[0:2 * _BLOCK_SITES:2] = TASKS
        plan.flags.writeable = False
        _plans[nt] = plan
    return plan
