"""Functions that only call already-optimised code link it without optimising it a second time.

Numba links the LLVM module of every function a compiled function calls into the caller's module and
runs the full optimisation pipeline over the result, so a kernel is optimised on its own and again
inside every function that calls it, at every level: a parallel kernel's loop body (its parfor
"gufunc", compiled and optimised as a library of its own) again inside the kernel, then again inside
each entry point that calls the kernel. Two kinds of library skip that second full pass here:

* the entry points (a range of blocks forward or backward, the decoder), whose own body is a
  sequence of kernel calls on views;
* the parallel kernels, whose own function only hands the loop body to the threading layer's
  scheduler, through a pointer (so nothing is inlined across that call anyway).

Their own functions keep Numba's function passes and the cheap module pass that lets reference
counts be pruned, plus GlobalDCE (as the full pipeline would) so linked functions nothing calls are
not emitted. The code they link runs as it was optimised in its own library. That is about a third of
the CPU a cold start spends compiling the demo's kernels (measured: benchmarks/README.md, "The first
run"). It also changes which of two equally valid float32 roundings some reassociated (fast-math)
reductions get, once, on purpose: the demo's validation bpb moved from 1.5310 to 1.5237 (AMD EPYC
Zen 4, SkylakeX kernels); the studies' numerics fingerprints did not.
"""
from numba.core import codegen, config

# The entry points' libraries (named by the function's qualified name): tests/test_warmup.py checks
# these are exactly nbrgc.kernels.blocks' entry points.
ENTRY_POINTS = frozenset((
    "blocks_fwd_store", "blocks_fwd_recompute", "blocks_bwd_store", "blocks_bwd_recompute",
    "decoder_fwd_bwd",
))
_GUFUNC = "__numba_parfor_gufunc"  # the library name Numba gives a parfor's loop body


def skips_second_pass(library):
    """True for an entry point's library or a parallel kernel's (one that links a parfor body)."""
    return library.name in ENTRY_POINTS or any(
        lib.name.startswith(_GUFUNC) for lib in library._linking_libraries)


def _cheap_only(self):
    mpm, mpb = self._codegen._module_pass_manager(
        loop_vectorize=self._codegen._loopvect, slp_vectorize=False, opt=self._codegen._opt_level,
        cost="cheap")
    mpm.add_global_dead_code_eliminate_pass()
    with self._recorded_timings.record("Module passes (cheap optimization for refprune)", mpb):
        mpm.run(self._final_module, mpb)
    if not config.LLVM_REFPRUNE_PASS:
        self._final_module = codegen.remove_redundant_nrt_refct(self._final_module)


def install():
    """Make those libraries skip the full module pass (once per process)."""
    lib = codegen.CPUCodeLibrary
    full = lib._optimize_final_module
    if getattr(full, "nbrgc_skips_second_pass", False):
        return

    def _optimize_final_module(self):
        if skips_second_pass(self):
            try:
                return _cheap_only(self)
            except (AttributeError, TypeError):  # another Numba's internals: optimise as it does
                pass
        return full(self)
    _optimize_final_module.nbrgc_skips_second_pass = True
    lib._optimize_final_module = _optimize_final_module
