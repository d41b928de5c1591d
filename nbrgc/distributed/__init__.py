"""Training across processes with MPI (``nbrgc-train --distributed mpi`` under ``mpiexec``).

* ``bp``: data parallel. Every rank computes the gradient of its slice of the global batch, the
  flat gradient is summed with one all-reduce, and every rank takes the same AdamW step.
* ``rgc-async``: the stages on ranks. Rank r runs a contiguous share of the stages with the
  single-process pipeline's own stage loop (:class:`nbrgc.schemes.rgc_async.RGCAsync`); only the
  hand-offs between ranks and the consensus round are replaced (:mod:`.pipeline`).

Modules: :mod:`.launch` (is this an MPI job, one-line errors, the thread budget), :mod:`.link`
(counted sends, waits with deadlines), :mod:`.dp` (data-parallel BP), :mod:`.pipeline`
(RGC stages on ranks), :mod:`.run` (the trainer on ranks: rank 0 logs and writes).
"""
