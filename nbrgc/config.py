"""Model and training configuration: presets and up-front validation with one-line errors."""
from dataclasses import dataclass, asdict, fields, replace

from .errors import ConfigError

MODES = ("bp", "rgc-sync", "rgc-async", "pipe-sync", "pipe-async")
THREADED = ("rgc-async", "pipe-async")  # the modes whose stages run on worker threads
STAGED = ("rgc-sync", "rgc-async", "pipe-sync", "pipe-async")
PIPE = ("pipe-sync", "pipe-async")  # the modes of the pipeline's rule (nbrgc.schemes.pipe_rule)
ON_NAN = ("stop", "skip")


def _int(name, value, lo=None):
    if isinstance(value, bool) or not isinstance(value, int):
        try:
            if float(value) != int(value):
                raise ValueError
            value = int(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{name} must be an integer, got {value!r}") from None
    if lo is not None and value < lo:
        raise ConfigError(f"{name} must be >= {lo}, got {value}")
    return value


def _float(name, value, lo=None, hi=None, lo_open=False):
    try:
        value = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{name} must be a number, got {value!r}") from None
    if value != value or value in (float("inf"), float("-inf")):
        raise ConfigError(f"{name} must be finite, got {value}")
    if lo is not None and (value < lo or (lo_open and value == lo)):
        raise ConfigError(f"{name} must be {'>' if lo_open else '>='} {lo}, got {value}")
    if hi is not None and value > hi:
        raise ConfigError(f"{name} must be <= {hi}, got {value}")
    return value


@dataclass(frozen=True)
class ModelConfig:
    n_layer: int
    d_model: int
    n_head: int
    ctx: int
    vocab: int = 256

    def __post_init__(self):
        for name, lo in (("n_layer", 1), ("d_model", 1), ("n_head", 1), ("ctx", 1), ("vocab", 2)):
            object.__setattr__(self, name, _int(name, getattr(self, name), lo))
        if self.d_model % self.n_head:
            raise ConfigError(f"d_model ({self.d_model}) must be divisible by n_head ({self.n_head})")

    def to_dict(self):
        return asdict(self)

    @classmethod
    def from_dict(cls, d):
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ConfigError(f"unknown model config field(s): {', '.join(sorted(unknown))}")
        return cls(**d)


PRESETS = {
    "tiny": ModelConfig(n_layer=2, d_model=32, n_head=2, ctx=16),
    "small": ModelConfig(n_layer=8, d_model=128, n_head=4, ctx=128),
    "paper": ModelConfig(n_layer=24, d_model=256, n_head=8, ctx=256),
    # the method paper's depth and stage size (4 stages of 6 blocks) at about small's cost per token
    "deep": ModelConfig(n_layer=24, d_model=64, n_head=2, ctx=128),
    # nbrgc-train's default: the smallest model whose samples read as text after a minute on 2 cores
    "demo": ModelConfig(n_layer=4, d_model=64, n_head=4, ctx=64),
}
PRESET_BATCH = {"tiny": 4, "small": 16, "paper": 8, "deep": 16, "demo": 16}
DEFAULT_PRESET = "demo"
# nbrgc-train's --lr for a preset: demo's short run learns text at 1e-2; the rest train at TrainConfig.lr
PRESET_LR = {"demo": 1e-2}
BATCH_OF_CUSTOM_MODEL = 8  # a ModelConfig that is no preset


def preset_batch(name):
    """Sequences per step for a preset name (a name that is no preset: the custom models' batch)."""
    return PRESET_BATCH.get(name, BATCH_OF_CUSTOM_MODEL)


def preset_lr(name):
    """nbrgc-train's default peak learning rate for a preset name."""
    return PRESET_LR.get(name, TrainConfig.lr)


def batch_for(mcfg):
    """The batch of the preset ``mcfg`` equals, else the custom models' batch."""
    return preset_batch(next((name for name, cfg in PRESETS.items() if cfg == mcfg), None))


def preset(name, **overrides):
    """A preset ModelConfig with field overrides (``None`` values are ignored)."""
    if name not in PRESETS:
        raise ConfigError(f"unknown config preset {name!r}; choose from {', '.join(PRESETS)}")
    overrides = {k: v for k, v in overrides.items() if v is not None}
    try:
        return replace(PRESETS[name], **overrides)
    except TypeError as exc:
        raise ConfigError(str(exc)) from None


#: Defaults that follow from other settings (``None`` in :class:`TrainConfig`), worded as
#: nbrgc-train's --help shows them.
DERIVED_DEFAULTS = {
    "batch": "the preset's",
    "warmup": "5% of steps",
    "eval_every": "steps/5",
}


def default_warmup(steps):
    return max(0, steps // 20)


def default_eval_every(steps):
    return max(1, steps // 5)


@dataclass(frozen=True)
class TrainConfig:
    """Every training setting; nbrgc-train's flags are these fields (``-`` for ``_``) with these
    defaults. ``None`` marks a default derived from other settings (:data:`DERIVED_DEFAULTS`):
    ``warmup`` and ``eval_every`` are filled in from ``steps`` at construction, ``batch`` by
    :meth:`for_model` (the Trainer calls it)."""
    mode: str = "bp"
    steps: int = 600
    batch: int = None             # None: the preset's (batch_for)
    seq: int = 0                  # 0: the model's ctx
    lr: float = 1e-3
    min_lr_frac: float = 0.1      # cosine decays to lr * min_lr_frac
    warmup: int = None            # None: 5% of steps
    weight_decay: float = 0.1
    optimizer: str = "adamw"      # adamw | muon (Muon on the blocks' matrices, AdamW on the rest)
    muon_momentum: float = 0.95   # Muon's (Nesterov) momentum on the matrices
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    grad_clip: float = 1.0        # 0 disables clipping
    eval_every: int = None        # None: steps/5; 0: only at the end
    eval_batches: int = 8
    log_every: int = 10
    seed: int = 0
    threads: int = 0              # 0: all cores
    n_stages: int = 4
    stage_threads: str = "auto"   # "auto" or comma list, one per stage
    stage_workers: int = 0        # rgc-async, pipe-async: worker threads the stages share; 0: auto
    max_staleness: int = 1
    on_nan: str = "stop"          # stop | skip
    attention: str = "store"      # store | recompute (the attention probabilities for the backward)
    keep: int = 3
    ckpt_every: int = 0           # 0: only at eval points and at the end
    consensus: str = "uniform"    # RGC decoder consensus: uniform | depth (stage k weighs k + 1) | last
    stage_init: str = "standard"  # RGC: standard | identity (stages after the first start as identity)
    # the objective between RGC and BP (nbrgc.horizon), None: the mode's (pipe-sync/async: all and 0,
    # pipelined backprop; the others: 0 and 1, RGC)
    horizon: str = None           # blocks below a stage's input its loss reaches: an int or "all"
    aux_weight: float = None      # weight of the stages' own losses beside the last one's
    boundary_delay: int = 1       # pipe-sync/async: steps a boundary gradient takes per hop
    delay_warmup: int = 0         # pipe-sync/async: the first N steps run with no boundary delay
    replay_weights: str = "current"  # pipe-sync/async: current | stashed | predicted | momentum (nbrgc.schemes.pipe_rule)
    readout_blocks: int = 0       # staged modes: private blocks before each stage's readout
    delay_lr_power: float = 0.0   # pipe-sync/async: a delayed stage steps at lr / (1 + D_k)^p
    grad_delay: int = 0           # bp: each gradient computed on the weights of N updates ago

    def __post_init__(self):
        if self.mode not in MODES:
            from .schemes import registered
            if registered(self.mode) is None:
                raise ConfigError(f"mode must be one of {', '.join(MODES)} (or a mode registered "
                                  f"with nbrgc.register_scheme), got {self.mode!r}")
        derived = {"batch": None, "warmup": default_warmup, "eval_every": default_eval_every}
        for name, lo in (("steps", 1), ("batch", 1), ("seq", 0), ("warmup", 0), ("eval_every", 0),
                         ("eval_batches", 1), ("log_every", 1), ("seed", 0), ("threads", 0),
                         ("n_stages", 1), ("stage_workers", 0), ("max_staleness", 0), ("keep", 1),
                         ("ckpt_every", 0)):
            value = getattr(self, name)
            if value is None and name in derived:
                if derived[name] is None:
                    continue
                value = derived[name](self.steps)
            object.__setattr__(self, name, _int(name, value, lo))
        if self.on_nan not in ON_NAN:
            raise ConfigError(f"on_nan must be {' or '.join(ON_NAN)}, got {self.on_nan!r}")
        object.__setattr__(self, "lr", _float("lr", self.lr, 0.0, lo_open=True))
        object.__setattr__(self, "min_lr_frac", _float("min_lr_frac", self.min_lr_frac, 0.0, 1.0))
        object.__setattr__(self, "weight_decay", _float("weight_decay", self.weight_decay, 0.0))
        if self.optimizer not in OPTIMIZERS:
            raise ConfigError(f"optimizer must be one of {', '.join(OPTIMIZERS)}, got {self.optimizer!r}")
        object.__setattr__(self, "muon_momentum", _float("muon_momentum", self.muon_momentum, 0.0, 1.0))
        if self.muon_momentum >= 1.0:
            raise ConfigError("muon_momentum must be < 1")
        object.__setattr__(self, "beta1", _float("beta1", self.beta1, 0.0, 1.0))
        object.__setattr__(self, "beta2", _float("beta2", self.beta2, 0.0, 1.0))
        if self.beta1 >= 1.0 or self.beta2 >= 1.0:
            raise ConfigError("beta1 and beta2 must be < 1")
        object.__setattr__(self, "eps", _float("eps", self.eps, 0.0, lo_open=True))
        object.__setattr__(self, "grad_clip", _float("grad_clip", self.grad_clip, 0.0))
        check_attention(self.attention)
        if self.consensus not in CONSENSUS:
            raise ConfigError(f"consensus must be one of {', '.join(CONSENSUS)}, got {self.consensus!r}")
        if self.stage_init not in STAGE_INIT:
            raise ConfigError(f"stage_init must be one of {', '.join(STAGE_INIT)}, got {self.stage_init!r}")
        pipe = self.base_mode in PIPE
        h = ("all" if pipe else "0") if self.horizon is None else str(self.horizon).strip().lower()
        if h not in ("all", "stage") and not h.isdigit():
            raise ConfigError(f"horizon must be a number of blocks >= 0, 'stage' or 'all', got "
                              f"{self.horizon!r}")
        object.__setattr__(self, "horizon", h)
        aux = (0.0 if pipe else 1.0) if self.aux_weight is None else self.aux_weight
        object.__setattr__(self, "aux_weight", _float("aux_weight", aux, 0.0))
        object.__setattr__(self, "boundary_delay", _int("boundary_delay", self.boundary_delay, 0))
        object.__setattr__(self, "delay_warmup", _int("delay_warmup", self.delay_warmup, 0))
        object.__setattr__(self, "readout_blocks", _int("readout_blocks", self.readout_blocks, 0))
        object.__setattr__(self, "delay_lr_power", _float("delay_lr_power", self.delay_lr_power, 0.0))
        object.__setattr__(self, "grad_delay", _int("grad_delay", self.grad_delay, 0))
        if self.grad_delay and self.base_mode != "bp":
            raise ConfigError("--grad-delay delays backprop's whole gradient (--mode bp); the "
                              "pipeline's per-stage delays are --boundary-delay (--mode pipe-sync, pipe-async)")
        if self.replay_weights not in REPLAY_WEIGHTS:
            raise ConfigError(f"replay_weights must be one of {', '.join(REPLAY_WEIGHTS)}, got "
                              f"{self.replay_weights!r}")
        if self.mode == "bp" and self.n_stages != 1:
            object.__setattr__(self, "n_stages", 1)

    def for_model(self, mcfg):
        """This config with the defaults that depend on the model filled in (``batch``)."""
        return self if self.batch is not None else replace(self, batch=batch_for(mcfg))

    def validate_for(self, mcfg):
        """Checks that need both configs."""
        seq = self.seq or mcfg.ctx
        if seq > mcfg.ctx:
            raise ConfigError(f"seq ({seq}) must be <= ctx ({mcfg.ctx})")
        if self.mode != "bp" and mcfg.n_layer % self.n_stages:
            raise ConfigError(f"n_stages ({self.n_stages}) must divide n_layer ({mcfg.n_layer})")
        if self.mode == "bp" and self.readout_blocks:
            raise ConfigError("readout blocks serve the stages of the staged modes; bp has one "
                              "readout, the full network's")
        if self.base_mode in STAGED and self.n_stages > 1:
            from .horizon import check_coverage, resolve_horizon
            from .local import split_stages
            from .schemes.pipe_sync import stage_horizon
            stages = split_stages(mcfg.n_layer, self.n_stages)
            stage_horizon(self.horizon, stages)
            check_coverage(mcfg.n_layer, stages,
                           resolve_horizon(self.horizon, mcfg.n_layer, self.n_stages), self.aux_weight)
        if self.threaded:
            groups = parse_stage_threads(self.stage_threads, self.n_stages)
            if self.stage_workers > self.n_stages:
                raise ConfigError(f"stage_workers ({self.stage_workers}) must be <= n_stages "
                                  f"({self.n_stages}): a worker runs one or more whole stages")
            if groups is not None and self.stage_workers:
                worker_groups(groups, self.stage_workers)
        return seq

    @property
    def base_mode(self):
        """The built-in mode whose settings apply: ``mode`` itself, or the one a registered mode is
        like (nbrgc.register_scheme)."""
        if self.mode in MODES:
            return self.mode
        from .schemes import registered
        return registered(self.mode)[1]

    @property
    def threaded(self):
        """Whether the stages run on worker threads (rgc-async, pipe-async, or a mode like them)."""
        return self.base_mode in THREADED

    @property
    def pipe_rule(self):
        """Whether the stages run the pipeline's rule (nbrgc.schemes.pipe_rule): the pipe modes, and
        the RGC modes with an objective other than RGC's own."""
        return self.base_mode in PIPE or (self.base_mode in STAGED and not self.is_plain_rgc())

    def is_plain_rgc(self):
        """Whether the objective is RGC's own (horizon 0, aux_weight 1, no readout blocks)."""
        return self.horizon == "0" and self.aux_weight == 1.0 and not self.readout_blocks

    def to_dict(self):
        return asdict(self)

    @classmethod
    def from_dict(cls, d):
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in known})


ATTENTION = ("store", "recompute")
CONSENSUS = ("uniform", "depth", "last")
STAGE_INIT = ("standard", "identity")
OPTIMIZERS = ("adamw", "muon")
REPLAY_WEIGHTS = ("current", "stashed", "predicted", "momentum")


def check_attention(value):
    """``store``: keep each block's attention probabilities for the backward (fastest; B*H*T*T per
    block). ``recompute``: keep none, recompute them in the backward (the same bits, a few percent
    slower, the activation memory of long contexts cut by up to the T^2 term)."""
    if value not in ATTENTION:
        raise ConfigError(f"attention must be one of {', '.join(ATTENTION)}, got {value!r}")
    return value


def parse_stage_threads(spec, n_stages):
    """``"auto"`` -> None; ``"2,1,1,1"`` -> [2, 1, 1, 1] (one positive int per stage)."""
    if spec is None or str(spec).strip().lower() == "auto":
        return None
    parts = [p.strip() for p in str(spec).split(",") if p.strip()]
    try:
        groups = [int(p) for p in parts]
    except ValueError:
        raise ConfigError(f"stage_threads must be 'auto' or comma-separated integers, got {spec!r}") from None
    if len(groups) == 1:
        groups = groups * n_stages
    if len(groups) != n_stages:
        raise ConfigError(f"stage_threads lists {len(groups)} groups for {n_stages} stages")
    if any(g < 1 for g in groups):
        raise ConfigError(f"stage_threads groups must be >= 1, got {spec!r}")
    return groups


def parse_stage_workers(text):
    """``"auto"`` -> 0, ``"3"`` -> 3: a stage-worker count (a positive integer, or auto)."""
    s = str(text).strip()
    if s.lower() == "auto":
        return 0
    try:
        value = int(s)
    except ValueError:
        value = 0
    if value < 1:
        raise ConfigError(f"must be auto or a positive integer, got {text!r}")
    return value


def resolve_stage_workers(tc, budget):
    """How many worker threads run rgc-async's stages. Stage k runs on worker k mod W, and a worker
    runs its stages one after another, reusing one set of activation buffers: a stage's activations
    die when its step ends (no gradient crosses a stage boundary), so memory grows with the stages
    in flight, not with K. ``auto``: one worker per stage when the thread budget (or an explicit
    per-stage group list) allows it, else the most workers the budget allows that take equal shares
    of the stages (a divisor of K: 4 stages on 3 cores run on 2 workers, since 3 workers would leave
    two of them waiting half of each step for the one with two stages)."""
    K = tc.n_stages
    if tc.stage_workers:
        return min(tc.stage_workers, K)
    if parse_stage_threads(tc.stage_threads, K) is not None:
        return K
    return max(w for w in range(1, max(1, min(K, budget)) + 1) if K % w == 0)


def worker_groups(groups, n_workers):
    """Per-stage thread groups -> per-worker groups; the stages a worker runs must agree."""
    out = []
    for w in range(n_workers):
        stages = range(w, len(groups), n_workers)
        mine = sorted({groups[k] for k in stages})
        if len(mine) != 1:
            raise ConfigError(f"stage_threads gives stages {', '.join(map(str, stages))} (all on worker "
                              f"{w} of {n_workers}) different groups {mine}")
        out.append(mine[0])
    return out
