"""The numerics version of a study run: a fingerprint of what the code computes, not of its text.

``scheme_fingerprint(mcfg, tc)`` trains the study's model config with the run's scheme (mode,
staleness, consensus, stage init, clipping, optimizer, schedule, every TrainConfig field that is not
about size or cadence) for a few steps on fixed synthetic bytes, with an evaluation drain inside,
evaluates the held-out stage losses and the sliding-window bpb, and hashes all of it. It runs in
FLOAT64 and rounds every figure to 8 significant digits, so two machines whose BLAS or compiled
kernels round float32 differently (OpenBLAS SkylakeX and Haswell kernels) get the same fingerprint,
while any change of the math moves some figure by far more than 1e-8 and changes it. By design a
change that only rounds float32 differently (a new GEMM split, a reordered sum) keeps the cache.

A study puts each arm's fingerprint in the cache key of its runs, so a continued study never reuses
a run made by code that computes differently, and a refactor that keeps the numbers keeps the runs.
"""
import hashlib
import json
from dataclasses import replace

import numpy as np

FP_BATCH, FP_SEQ, FP_STEPS, FP_DRAIN_AT = 2, 32, 4, 2
_SIG = 8


def _r(v):
    return float(f"{float(v):.{_SIG}g}")


def synthetic_bytes(n=8192, seed=20240513):
    """Fixed text-like bytes: printable ASCII with repeated words, so the model has something to
    learn in four steps."""
    rng = np.random.default_rng(seed)
    words = [bytes(rng.integers(97, 123, rng.integers(2, 9)).astype(np.uint8)) for _ in range(64)]
    out = bytearray()
    while len(out) < n:
        out += words[int(rng.integers(0, 64))] + b" "
    return np.frombuffer(bytes(out[:n]), np.uint8).copy()


def _schedule_points(tc):
    """The run's own learning-rate schedule at 21 points of its budget (warm-up, peak, cosine)."""
    from ...optim import lr_at
    pts = sorted({min(tc.steps - 1, round(i * (tc.steps - 1) / 20)) for i in range(21)} |
                 {max(0, tc.warmup - 1), tc.warmup})
    return [[int(s), _r(lr_at(s, tc) / tc.lr)] for s in pts if 0 <= s < tc.steps]


def _identity_init():
    try:
        from ...local import identity_init
    except ImportError:
        from ...errors import ConfigError
        raise ConfigError("stage_init identity is not implemented in this code (no "
                          "nbrgc.local.identity_init): leave the identity arms out of --arms") from None
    return identity_init


def scheme_figures(mcfg, tc):
    """The rounded figures the fingerprint hashes (a dict; see the module docstring)."""
    from ...data import Batches, eval_batches
    from ...evaluate import evaluate, sliding_bpb
    from ...local import split_stages
    from ...model import Model
    from ...optim import lr_at
    from ...schemes import make_scheme
    from ...threads import set_threads
    seq = min(FP_SEQ, mcfg.ctx)
    ftc = replace(tc, steps=FP_STEPS, batch=FP_BATCH, seq=seq, warmup=1, eval_every=FP_DRAIN_AT,
                  threads=1, stage_threads="auto", stage_workers=0, ckpt_every=0, seed=0, lr=2e-3)
    ftc.validate_for(mcfg)
    set_threads(1)
    data = synthetic_bytes()
    train, held = data[:6144], data[6144:]
    model = Model(mcfg, seed=0, dtype=np.float64, attention=ftc.attention)
    stages = split_stages(mcfg.n_layer, ftc.n_stages)  # 1 for bp (TrainConfig sets it)
    scheme = make_scheme(model, ftc, log=lambda m: None)
    if ftc.mode != "bp" and ftc.stage_init == "identity":
        _identity_init()(model, stages)
    batches = Batches(train, FP_BATCH, seq, seed=0)
    held_out = eval_batches(held, FP_BATCH, seq, 2, seed=1)
    per = stages[0][1] - stages[0][0]
    ws = model.workspace(FP_BATCH, seq, 0, per)
    steps, evals = [], []
    try:
        for s in range(FP_STEPS):
            x, y = batches.next()
            scheme.submit(s, x, y, lr_at(s, ftc))
            res = scheme.poll()
            if (s + 1) % FP_DRAIN_AT == 0 or s + 1 == FP_STEPS:
                res += scheme.drain()
                evals.append([_r(v) for v in evaluate(model, held_out, stages, ws)["val_stage_bpb"]])
            steps += [[r.step, _r(r.loss), [_r(v) for v in r.stage_losses], _r(r.grad_norm)] for r in res]
    finally:
        scheme.drain()
        scheme.close()
    flat = model.flat
    return {"steps": steps, "evals": evals,
            "sliding_bpb": _r(sliding_bpb(model, held, batch=2)["bpb"]),
            "params": [_r(np.abs(flat).sum()), _r(np.square(flat).sum())],
            "schedule": _schedule_points(tc)}


def digest(figures):
    return hashlib.sha256(json.dumps(figures, sort_keys=True).encode()).hexdigest()[:16]


def scheme_fingerprint(mcfg, tc):
    """16 hex digits: the numerics version of runs of ``tc``'s scheme on ``mcfg``."""
    return digest(scheme_figures(mcfg, tc))


def main(argv=None):
    """``python -m nbrgc.measure.study.fingerprint [preset]``: every arm's fingerprint on a preset (to compare
    machines or BLAS kernels, e.g. under OPENBLAS_CORETYPE=Haswell)."""
    import sys
    from ...config import preset, preset_batch
    from .arms import ARMS, fits, model_config, train_config
    name = (argv if argv is not None else sys.argv[1:]) or ["tiny"]
    mcfg = preset(name[0])
    from ..bench.plan import default_n_stages
    base = dict(batch=preset_batch(name[0]), n_stages=default_n_stages(mcfg.n_layer))
    for arm in (a for a in ARMS if fits(a, mcfg, base)):
        print(arm, scheme_fingerprint(model_config(arm, mcfg), train_config(arm, base, 0, 1e-3, 1000, 40)))


if __name__ == "__main__":
    main()
