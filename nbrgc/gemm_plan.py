"""How each backward GEMM is cut over a thread group: a fixed rule of the group size, never a timing.

The first version of this module timed the row and column splits at start-up and kept the faster.
That made results depend on how busy the machine was at that moment: at small shapes OpenBLAS can
round a 32-row block and a 64-row block of the same product differently (a 64-row, batch-4 ``tiny``
model shows it), so two runs of one seed could drift apart in the last bits, and a resumed run could
differ from the uninterrupted one. The rule now:

* an even group runs the weight and data gradients of each block's linear layer side by side on half
  the group each (``TASKS``, :func:`nbrgc.kernels.gemm._bwd_tasks`). Measured at the presets' shapes it
  was 0.7-5% faster than the better split of each product (``benchmarks/README.md``), and with 2 threads
  each product is one whole BLAS call, so 1 and 2 threads give the same bits;
* an odd group cuts both products by rows;
* the head's products are always cut by rows: the decoder writes its data gradient over the
  product's input, which rules out running the two side by side.

Plan entries, in order: MLP-down (weight, data), MLP-up, attention output, qkv, head.
"""
import numba
import numpy as np

from .kernels.gemm import TASKS

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
