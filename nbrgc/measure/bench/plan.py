"""What a bench runs: the flag strings parsed into sweeps (modes, thread counts, stage groups, worker
counts, attention), the variants of every mode, and the interleaved order of the rounds."""
from ...config import MODES as NBRGC_MODES
from ...errors import ConfigError

BASE = "bp"
ALL_MODES = NBRGC_MODES + ("torch",)


def parse_int_list(text, what):
    try:
        vals = [int(p) for p in str(text).split(",") if p.strip()]
    except ValueError:
        raise ConfigError(f"{what} must be comma-separated integers, got {text!r}") from None
    if not vals or any(v < 1 for v in vals):
        raise ConfigError(f"{what} must list integers >= 1, got {text!r}")
    return vals


def arm_overrides(name):
    """The TrainConfig fields of a study arm benched by name (``pipe``, ``rgc-h1``, ...: the arms of
    nbrgc.measure.study.arms that are no mode of their own), or None for a mode. ``ARM:async`` is a
    pipe-sync arm on the stage worker threads (pipe-async: the same numerics, timed threaded)."""
    if name in ALL_MODES:
        return None
    from ..study.arms import ARMS
    base, _, how = name.partition(":")
    if base not in ARMS or "depth" in ARMS[base] or how not in ("", "async"):
        return None
    out = {k: v for k, v in ARMS[base].items() if k != "delay_warmup_frac"}
    if how:
        if out.get("mode") != "pipe-sync":
            return None
        out["mode"] = "pipe-async"
    return out


def parse_modes(text):
    modes = [m.strip().lower() for m in str(text).split(",") if m.strip()]
    if not modes:
        raise ConfigError("--modes is empty; choose from " + ", ".join(ALL_MODES))
    bad = [m for m in modes if m not in ALL_MODES and arm_overrides(m) is None]
    if bad:
        raise ConfigError(f"unknown mode {bad[0]!r} in --modes; choose from {', '.join(ALL_MODES)} "
                          "or a study arm (pipe, pipe-stash, rgc-h1, rgc-hall, rgc-readout, ...)")
    if len(set(modes)) != len(modes):
        raise ConfigError(f"--modes lists a mode twice: {text!r}")
    return modes


def parse_stage_groups(text, n_stages):
    """``"auto:2,1,1,1:1,1,1,1"`` -> ["auto", "2,1,1,1", "1,1,1,1"] (each checked for ``n_stages``)."""
    from ...config import parse_stage_threads
    specs = [s.strip() for s in str(text).split(":") if s.strip()]
    if not specs:
        raise ConfigError(f"--stage-groups is empty: {text!r}")
    out = []
    for s in specs:
        g = parse_stage_threads(s, n_stages)
        out.append("auto" if g is None else ",".join(map(str, g)))
    return out


def default_n_stages(n_layer, want=4):
    for k in range(min(want, n_layer), 0, -1):
        if n_layer % k == 0:
            return k
    return 1


def parse_worker_sweep(text):
    """``"auto,2,4"`` -> [0, 2, 4] (0: auto), for the --stage-workers sweep; each entry is read by
    :func:`nbrgc.config.parse_stage_workers`, the one parser of a worker count."""
    from ...config import parse_stage_workers
    out = []
    for p in [p.strip() for p in str(text).split(",") if p.strip()] or ["auto"]:
        try:
            out.append(parse_stage_workers(p))
        except ConfigError as exc:
            raise ConfigError(f"--stage-workers entries {exc}") from None
    if len(set(out)) != len(out):
        raise ConfigError(f"--stage-workers lists a value twice: {text!r}")
    return out


def parse_attention(text):
    """``"store,recompute"`` -> ["store", "recompute"] (the --attention sweep)."""
    from ...config import check_attention
    out = [check_attention(p.strip()) for p in str(text).split(",") if p.strip()]
    if not out or len(set(out)) != len(out):
        raise ConfigError(f"--attention must list store and/or recompute once each, got {text!r}")
    return out


def plan_variants(modes, stage_groups, stage_workers=(0,), attention=("store",)):
    """[(label, mode, stage_threads, stage_workers, attention)]: every nbrgc mode once per attention
    choice, rgc-async and pipe-async also once per stage-group spec and worker count (0: auto)."""
    out = []
    for m in modes:
        for a in (attention if m != "torch" else ["store"]):
            extra = [] if a == "store" else [f"{a} attention"]
            if m in ("rgc-async", "pipe-async"):
                for g in stage_groups:
                    for w in stage_workers:
                        tags = ([] if g == "auto" else [g]) + ([f"{w} workers"] if w else []) + extra
                        out.append((f"{m}[{'; '.join(tags)}]" if tags else m, m, g, w, a))
            else:
                out.append((f"{m}[{'; '.join(extra)}]" if extra else m, m, "auto", 0, a))
    return out


def interleaved(variants, threads_list, repeats):
    """The run order: for each thread count, rounds of A B C (every variant once per round)."""
    return [(t, r, v) for t in threads_list for r in range(repeats) for v in variants]
