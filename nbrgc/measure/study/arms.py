"""The arms of a study and how each becomes a TrainConfig; parsing of the arm, seed and lr lists.

ARMS is the one table of what an arm means: every arm sets all four fields that tell the schemes
apart (mode, max_staleness, consensus, stage_init), so a later change of a TrainConfig default does
not silently change what an arm runs. An arm that also sets ``n_stages`` runs with that many stages
whatever the study's ``--n-stages``: ``rgc-async-k2`` asks how the cost of locality scales with the
number of boundaries (one instead of three: each stage does twice as much alone), ``rgc-async-k8``
the other way (seven: each stage does half as much).

An arm that sets ``depth`` (a fraction) trains the study's model with that fraction of its layers.
``bp-quarter`` and ``bp-half`` are diagnostics, not candidates: BP at the depth of one stage of a
4-stage and of a 2-stage split. Set beside each RGC stage's own read-out they say how much of what
RGC reaches its first stage reaches alone, and how much its later stages add.

The ``-muon`` arms train with ``--optimizer muon`` (Muon on the blocks' matrices, AdamW on the rest).
``pipe-2bw-muon`` is PipeDream-2BW's numerics (``bp --grad-delay 1``: every stage one step late, a
micro-batch's forward and backward on one weight version), the pipeline whose delay does not grow
with depth.
Each arm is judged against the BP arm of its own optimizer (:func:`reference_of`): the optimizer alone
moves bits per byte by more than any scheme does, so a Muon arm set against AdamW BP would measure the
optimizer, not the scheme. bp-muon itself is set against bp: what the optimizer gives.

The arms of the schemes between RGC and BP run ``pipe-sync`` (the pipeline's schedule, with its
delays, in one thread: the bits an asynchronous pipeline gives) and set every field of the objective
(horizon, aux_weight) and of the delays (max_staleness, boundary_delay, replay_weights,
delay_warmup_frac: the delay warm-up as a fraction of the run). CROSSES classes each arm by what
crosses a stage boundary backward: nothing, one hop, or everything, late.
"""
import math

from ...errors import ConfigError

BASE = "bp"
ARMS = {
    "bp": dict(mode="bp", max_staleness=1, consensus="uniform", stage_init="standard"),
    "rgc-sync": dict(mode="rgc-sync", max_staleness=1, consensus="uniform", stage_init="standard"),
    "rgc-async": dict(mode="rgc-async", max_staleness=1, consensus="uniform", stage_init="standard"),
    "rgc-async-s0": dict(mode="rgc-async", max_staleness=0, consensus="uniform", stage_init="standard"),
    "rgc-async-depthw": dict(mode="rgc-async", max_staleness=1, consensus="depth",
                             stage_init="standard"),
    "rgc-async-identity": dict(mode="rgc-async", max_staleness=1, consensus="uniform",
                               stage_init="identity"),
    "rgc-async-identity-depthw": dict(mode="rgc-async", max_staleness=1, consensus="depth",
                                      stage_init="identity"),
    "rgc-async-k2": dict(mode="rgc-async", max_staleness=1, consensus="uniform", stage_init="standard",
                         n_stages=2),
    "rgc-async-k8": dict(mode="rgc-async", max_staleness=1, consensus="uniform", stage_init="standard",
                         n_stages=8),
    "bp-quarter": dict(mode="bp", max_staleness=1, consensus="uniform", stage_init="standard",
                       depth=(1, 4)),
    "bp-half": dict(mode="bp", max_staleness=1, consensus="uniform", stage_init="standard",
                    depth=(1, 2)),
}
_PIPE = dict(mode="pipe-sync", consensus="uniform", stage_init="standard", boundary_delay=1,
             replay_weights="current", delay_warmup_frac=0.0, readout_blocks=0)
ARMS.update({
    # asynchronous pipelined backprop: every gradient crosses, D_k = K-1-k steps late
    "pipe": dict(_PIPE, horizon="all", aux_weight=0.0, max_staleness=0),
    "pipe-stash": dict(_PIPE, horizon="all", aux_weight=0.0, max_staleness=0,
                       replay_weights="stashed"),
    # RGC (decoder staleness 1, as rgc-async) whose losses also reach one stage back, one step late
    "rgc-h1": dict(_PIPE, horizon="stage", aux_weight=1.0, max_staleness=1),
    # the same horizon with its gradient in the same step (no boundary delay): what the delay costs
    "rgc-h1-d0": dict(_PIPE, horizon="stage", aux_weight=1.0, max_staleness=1, boundary_delay=0),
    # the stage losses as auxiliaries of the late global gradient
    "rgc-hall": dict(_PIPE, horizon="all", aux_weight=1.0, max_staleness=1),
    # RGC with one private block in front of each earlier stage's readout
    "rgc-readout": dict(_PIPE, horizon="0", aux_weight=1.0, max_staleness=1, readout_blocks=1),
})
# --optimizer muon: AdamW breaks down under late gradients and Muon is reported to hold up
# (docs/schemes.md); bp-muon says what the optimizer alone gives, the others what it gives each scheme
ARMS.update({
    "bp-muon": dict(ARMS["bp"], optimizer="muon"),
    "pipe-muon": dict(ARMS["pipe"], optimizer="muon"),
    "rgc-async-muon": dict(ARMS["rgc-async"], optimizer="muon"),
    "pipe-2bw-muon": dict(ARMS["bp"], optimizer="muon", grad_delay=1),
})
DIAGNOSTIC = ("bp-quarter", "bp-half")
CROSSES = {a: ("everything" if a.startswith("bp") else "nothing") for a in ARMS}
CROSSES.update({"pipe": "everything, late", "pipe-stash": "everything, late", "pipe-muon": "everything, late",
                "pipe-2bw-muon": "everything, late",
                "rgc-hall": "everything, late", "rgc-h1": "one hop", "rgc-h1-d0": "one hop"})


def reference_of(arm):
    """The arm whose paired seeds ``arm``'s gap is measured against: BP with the same optimizer
    (bp for bp-muon itself); None for the base."""
    if arm == BASE:
        return None
    if ARMS[arm].get("optimizer", "adamw") == "muon" and arm != "bp-muon":
        return "bp-muon"
    return BASE


def with_references(arms):
    """``arms`` in the table's order, the base first, with every arm's reference added."""
    chosen = set(arms) | {BASE}
    chosen |= {reference_of(a) for a in list(chosen) if a != BASE}
    return [BASE] + [a for a in ARMS if a in chosen and a != BASE]


def parse_arms(text):
    """``"rgc-async,rgc-sync"`` -> ["bp", "rgc-sync", "rgc-async"] (bp always first, then the table's
    order, and each arm's reference: an arm trained with Muon brings bp-muon); ``"all"`` or None ->
    None: every arm of ARMS that fits the study's model (fits())."""
    if text is None or str(text).strip().lower() in ("", "all"):
        return None
    arms = [a.strip().lower() for a in str(text).split(",") if a.strip()]
    bad = [a for a in arms if a not in ARMS]
    if bad:
        raise ConfigError(f"unknown arm {bad[0]!r} in --arms; choose from {', '.join(ARMS)} (or all)")
    if len(set(arms)) != len(arms):
        raise ConfigError(f"--arms lists an arm twice: {text!r}")
    arms = with_references(arms)
    if len(arms) < 2:
        raise ConfigError("--arms needs at least one RGC arm besides bp (bp is always included)")
    return arms


def parse_seeds(text):
    """``"5"`` -> [0, 1, 2, 3, 4]; ``"0,3,7"`` -> [0, 3, 7]."""
    s = str(text).strip()
    try:
        if "," in s:
            seeds = [int(v) for v in s.split(",") if v.strip()]
        else:
            n = int(s)
            if n < 1:
                raise ConfigError(f"--seeds must be >= 1, got {n}")
            seeds = list(range(n))
    except ValueError:
        raise ConfigError(f"--seeds must be a count or a comma list of seeds, got {text!r}") from None
    if not seeds or any(v < 0 for v in seeds) or len(set(seeds)) != len(seeds):
        raise ConfigError(f"--seeds must be distinct integers >= 0, got {text!r}")
    return seeds


def parse_lrs(text, at_least=3):
    """``"5e-4,1e-3,2e-3"`` -> [0.0005, 0.001, 0.002] (sorted; distinct, finite, > 0)."""
    parts = [p.strip() for p in str(text).split(",") if p.strip()]
    try:
        lrs = [float(p) for p in parts]
    except ValueError:
        raise ConfigError(f"--sweep-lrs must be a comma list of numbers, got {text!r}") from None
    if any(not math.isfinite(v) or v <= 0 for v in lrs):
        raise ConfigError(f"--sweep-lrs must hold finite learning rates > 0, got {text!r}")
    if len(set(lrs)) != len(lrs):
        raise ConfigError(f"--sweep-lrs lists a learning rate twice: {text!r}")
    if len(lrs) < at_least:
        raise ConfigError(f"--sweep-lrs needs at least {at_least} learning rates, got {len(lrs)}")
    return sorted(lrs)


def train_config(arm, base, seed, lr, steps, eval_every):
    """The TrainConfig of one run of ``arm``: ``base`` (TrainConfig fields shared by every run, plus
    ``warmup_frac``: the warm-up as a fraction of the run) with the arm's fields, this seed, learning
    rate, budget and evaluation cadence."""
    from ...config import TrainConfig
    if arm not in ARMS:
        raise ConfigError(f"unknown arm {arm!r}; choose from {', '.join(ARMS)}")
    d = {k: v for k, v in base.items() if k != "warmup_frac"}
    spec = ARMS[arm]
    d.update({k: v for k, v in spec.items() if k not in ("depth", "delay_warmup_frac")},
             seed=int(seed), lr=float(lr), steps=int(steps), eval_every=int(eval_every),
             warmup=int(round(base.get("warmup_frac", 0.05) * steps)))
    if "delay_warmup_frac" in spec:
        d["delay_warmup"] = int(round(spec["delay_warmup_frac"] * steps))
    if d["mode"] == "bp":
        d.update(n_stages=1, stage_threads="auto", stage_workers=0)
    return TrainConfig(**d)


def fits(arm, mcfg, base):
    """Whether ``arm``'s own stage count or depth fits ``mcfg`` (divides its layers): ``--arms all``
    leaves out, with a log line, the arms that set one that does not. An arm that follows the
    study's settings always fits here, so that a study's bad ``--n-stages`` is an error, not an
    empty study."""
    if not {"depth", "n_stages"} & set(ARMS.get(arm, {})):
        return True
    try:
        train_config(arm, base, 0, 1e-3, 1, 1).validate_for(model_config(arm, mcfg))
    except ConfigError:
        return False
    return True


def model_config(arm, mcfg):
    """The ModelConfig of ``arm``'s runs: the study's, with ``depth`` of its layers where the arm sets
    one (a whole number of layers, at least 1, or a ConfigError naming the arm)."""
    import dataclasses
    if arm not in ARMS:
        raise ConfigError(f"unknown arm {arm!r}; choose from {', '.join(ARMS)}")
    if "depth" not in ARMS[arm]:
        return mcfg
    num, den = ARMS[arm]["depth"]
    if (mcfg.n_layer * num) % den or mcfg.n_layer * num < den:
        raise ConfigError(f"arm {arm} trains {num}/{den} of the model's layers: n_layer "
                          f"{mcfg.n_layer} does not split so")
    return dataclasses.replace(mcfg, n_layer=mcfg.n_layer * num // den)
