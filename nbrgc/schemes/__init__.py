"""Training schemes over the same Model API. Each takes micro-batches through ``submit`` and hands back
finished steps through ``poll``; ``drain`` waits until nothing is in flight (before evaluation and
checkpoints). Synchronous schemes finish a step inside ``submit``."""
from dataclasses import dataclass, field


@dataclass
class StepResult:
    step: int
    loss: float                      # the last stage's loss (the full network's); BP: the loss
    stage_losses: list = field(default_factory=list)
    grad_norm: float = 0.0           # BP: global norm; RGC: max over stages
    skipped: bool = False


def make_scheme(model, tc, **kw):
    if tc.mode == "bp":
        from .bp import BP
        return BP(model, tc, **kw)
    if tc.mode == "pipe-sync" or (tc.mode == "rgc-sync" and not tc.is_plain_rgc()):
        from .pipe_sync import PipeSync
        if tc.mode == "rgc-sync":  # the synchronous reference: no staleness, no delay
            return PipeSync(model, tc, staleness=0, delay=0, **kw)
        return PipeSync(model, tc, **kw)
    if tc.mode == "rgc-sync":
        from .rgc_sync import RGCSync
        return RGCSync(model, tc, **kw)
    from .rgc_async import RGCAsync
    return RGCAsync(model, tc, **kw)
