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


_REGISTRY = {}


def register_scheme(name, factory, like="pipe-sync"):
    """Make ``name`` a training mode: ``factory(model, tc, **kw)`` builds its scheme (typically a
    subclass of :class:`~nbrgc.schemes.pipe_sync.PipeSync` with its own stage rule, see
    docs/schemes.md, "Your own local-learning rule"); ``like`` is the built-in mode whose settings
    and checks apply to it (its horizon, aux_weight and delay defaults, its memory estimate)."""
    from ..config import MODES
    from ..errors import ConfigError
    if not isinstance(name, str) or not name or name in MODES:
        raise ConfigError(f"a registered mode needs a new name (not one of {', '.join(MODES)}), "
                          f"got {name!r}")
    if like not in MODES or like == "bp":
        raise ConfigError(f"like must be a staged built-in mode, got {like!r}")
    if not callable(factory):
        raise ConfigError(f"the factory of mode {name!r} must be callable")
    _REGISTRY[name] = (factory, like)


def registered(name):
    """(factory, like) of a registered mode, or None."""
    return _REGISTRY.get(name)


def make_scheme(model, tc, **kw):
    if tc.mode in _REGISTRY:
        return _REGISTRY[tc.mode][0](model, tc, **kw)
    if tc.mode == "bp":
        from .bp import BP
        return BP(model, tc, **kw)
    if tc.pipe_rule and tc.mode in ("pipe-sync", "rgc-sync"):
        from .pipe_sync import PipeSync
        if tc.mode == "rgc-sync":  # the synchronous reference: no staleness, no delay
            return PipeSync(model, tc, staleness=0, delay=0, **kw)
        return PipeSync(model, tc, **kw)
    if tc.mode == "rgc-sync":
        from .rgc_sync import RGCSync
        return RGCSync(model, tc, **kw)
    if tc.pipe_rule:  # pipe-async, or rgc-async with another objective
        from .pipe_async import PipeAsync
        return PipeAsync(model, tc, **kw)
    from .rgc_async import RGCAsync
    return RGCAsync(model, tc, **kw)
