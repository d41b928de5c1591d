"""Model FLOPs per token (the same for every mode, so GFLOP/s is proportional to throughput), the
FLOPs a mode really executes, and the GEMM shape a bench's peak is measured at."""


FLOPS_FORMULA = ("6*N + 6*L*T*d per token: N = non-embedding parameters (all but wte and wpe; the "
                 "untied head counts), L layers, T sequence length, d model width (forward + "
                 "backward; attention scores and mixing as 2*L*T*d forward)")


def non_embedding_params(mcfg):
    from ...model import Layout
    lay = Layout(mcfg)
    return lay.size - mcfg.vocab * mcfg.d_model - mcfg.ctx * mcfg.d_model


def flops_per_token(mcfg, seq):
    """Model FLOPs per trained token: ``6*N + 6*L*T*d`` (see :data:`FLOPS_FORMULA`)."""
    return 6 * non_embedding_params(mcfg) + 6 * mcfg.n_layer * seq * mcfg.d_model


def executed_flops_per_token(mcfg, seq, mode, n_stages=1, tc=None):
    """FLOPs per token a mode actually executes: RGC runs the decoder (final LN + head) once per
    stage, i.e. ``n_stages - 1`` more times than BP. pipe-sync and pipe-async (``tc`` gives
    their objective; by default pipelined backprop) reads every earlier stage's loss (forward only when its weight is 0),
    and with a horizon recomputes the forward of every stage but the last for the late backward
    (features replay), whose backward is extra where the stage also backpropagated its own loss.
    Readout blocks are left out (a few blocks' worth)."""
    base = flops_per_token(mcfg, seq)
    if n_stages <= 1 or mode not in ("rgc-sync", "rgc-async", "pipe-sync", "pipe-async"):
        return base
    d, V = mcfg.d_model, mcfg.vocab
    dec = d * V + V + 2 * d
    if mode in ("rgc-sync", "rgc-async") and (tc is None or tc.is_plain_rgc()):
        return base + 6 * dec * (n_stages - 1)
    lam = 0.0 if tc is None else tc.aux_weight
    horizon = "all" if tc is None else tc.horizon
    earlier = (n_stages - 1) / n_stages   # the share of the blocks in stages 0..K-2
    fwd = (base - 6 * dec) / 3            # the forward of every block
    extra = (n_stages - 1) * (2 if lam == 0 else 6) * dec
    if horizon != "0":
        extra += fwd * earlier * (1 if lam == 0 else 3)
    return base + extra


def gemm_shape_for(mcfg, batch, seq):
    """The relevant GEMM: tokens x d_model times d_model x 4 d_model (the MLP up-projection)."""
    return batch * seq, mcfg.d_model, 4 * mcfg.d_model
