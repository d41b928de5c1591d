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


def executed_flops_per_token(mcfg, seq, mode, n_stages=1):
    """FLOPs per token a mode actually executes: RGC runs the decoder (final LN + head) once per
    stage, i.e. ``n_stages - 1`` more times than BP; pipe-sync with its default pipelined backprop
    reads the earlier stages' losses forward only (reported, not trained on) and recomputes the
    forward of every stage but the last for its late backward (features replay)."""
    base = flops_per_token(mcfg, seq)
    if n_stages <= 1 or mode not in ("rgc-sync", "rgc-async", "pipe-sync"):
        return base
    d, V = mcfg.d_model, mcfg.vocab
    dec = d * V + V + 2 * d
    if mode == "pipe-sync":
        blocks = (flops_per_token(mcfg, seq) - 6 * dec) / 3  # the forward of every block
        return base + 2 * dec * (n_stages - 1) + blocks * (n_stages - 1) / n_stages
    return base + 6 * dec * (n_stages - 1)


def gemm_shape_for(mcfg, batch, seq):
    """The relevant GEMM: tokens x d_model times d_model x 4 d_model (the MLP up-projection)."""
    return batch * seq, mcfg.d_model, 4 * mcfg.d_model
