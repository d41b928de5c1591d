"""Entry points link the kernels they call without optimising them a second time.

Numba links the LLVM module of every function a compiled function calls into the caller's module and
runs the full optimisation pipeline over the result, so each kernel is optimised once on its own and
again inside every function that calls it. Our entry points (a range of blocks forward or backward,
the decoder) call nearly every kernel, and their second pass was most of a cold start's compiling:
about 8 s of the 31 s of CPU the demo's kernels took (LLVM's pass timings, AMD EPYC Zen 4). An entry
point's own body is a sequence of calls on views; it is optimised function by function as before
(Numba's function passes) and by the cheap module pass that lets reference counts be pruned, and
the kernels it links keep the machine code they were optimised to on their own, which is also what a
kernel called alone (tests, the profile's replay) runs.
"""
from numba.core import codegen, config

# The libraries (named by the function's qualified name) that skip the second full pass.
ENTRY_POINTS = frozenset((
    "blocks_fwd_store", "blocks_fwd_recompute", "blocks_bwd_store", "blocks_bwd_recompute",
    "decoder_fwd_bwd",
))


def _cheap_only(self):
    mpm, mpb = self._codegen._module_pass_manager(
        loop_vectorize=self._codegen._loopvect, slp_vectorize=False, opt=self._codegen._opt_level,
        cost="cheap")
    mpm.add_global_dead_code_eliminate_pass()  # drop the linked functions nothing calls
    with self._recorded_timings.record("Module passes (cheap optimization for refprune)", mpb):
        mpm.run(self._final_module, mpb)
    if not config.LLVM_REFPRUNE_PASS:
        self._final_module = codegen.remove_redundant_nrt_refct(self._final_module)


def install():
    """Make the entry points' libraries skip the full module pass (once per process)."""
    lib = codegen.CPUCodeLibrary
    full = lib._optimize_final_module
    if getattr(full, "nbrgc_entry_points", False):
        return

    def _optimize_final_module(self):
        if self.name in ENTRY_POINTS:
            try:
                return _cheap_only(self)
            except (AttributeError, TypeError):  # another Numba's internals: optimise as it does
                pass
        return full(self)
    _optimize_final_module.nbrgc_entry_points = True
    lib._optimize_final_module = _optimize_final_module
