"""One study run, in its own process: ``python -m nbrgc.measure.study SPEC.json``.

The spec (written by the study) names the arm, phase, seed, learning rate, the full model and
training configs, the dataset, the run folder and the result file. The run is a normal ``Trainer``
run folder (checkpoints at every evaluation), resumed from its newest checkpoint when it exists.
When the training is complete the final parameters are scored on the test split with
:func:`nbrgc.evaluate.sliding_bpb` (main runs only: the sweep chooses by validation bpb and never
looks at the test split) and the result is written atomically to the result file. Before training
it recomputes its arm's numerics fingerprint and refuses to run when it differs from the one in its
key: a source edited while a long study runs must not file results under the old version.

Exit status: 0 result written; 3 stopped by SIGINT/SIGTERM after a checkpoint (run it again to
resume); 4 another process holds the run folder; 2 a one-line error (e.g. diverged runs are results,
not errors: they are written with ``"diverged": true``).
"""
import fcntl
import json
import math
import os
import sys
import time

from ...atomic import write_json
from ...errors import DivergenceError, NbrgcError
from ..runlog import val_curve

EXIT_OK, EXIT_ERROR, EXIT_STOPPED, EXIT_BUSY = 0, 2, 3, 4


class RunStopped(NbrgcError):
    """The run was stopped after checkpointing; running it again resumes it."""


class RunBusy(NbrgcError):
    """Another process holds the run folder's lock."""


def load_result(path, key):
    """The result in ``path`` when its key is ``key``, else None (missing, unreadable, another key)."""
    try:
        with open(path) as f:
            res = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(res, dict) or res.get("key") != json.loads(json.dumps(key)):
        return None
    return res


def check_numerics(mcfg, spec):
    """Refuse to train when this process's code computes differently from the code the study
    fingerprinted when it started (e.g. a source edited while a long study runs): its result would be
    filed under the wrong numerics version."""
    from ...config import TrainConfig
    from . import fingerprint
    if "fingerprint_config" not in spec:
        return
    got = fingerprint.scheme_fingerprint(mcfg, TrainConfig(**spec["fingerprint_config"]))
    want = spec["key"]["code_version"]
    if got != want:
        raise NbrgcError(f"the code computes differently from when the study started (numerics "
                         f"fingerprint {got}, the study's {want}): run the study again to restart "
                         "with this code")


def run_one(spec, log=None):
    """Train (or resume) the run ``spec`` describes, score it and write its result; returns it."""
    from ...config import ModelConfig, TrainConfig
    from ...data import load_dataset
    from ...evaluate import sliding_bpb
    from ...trainer import Trainer
    log = log or (lambda m: print(m, file=sys.stderr, flush=True))
    work = spec["work"]
    os.makedirs(work, exist_ok=True)
    lock = open(os.path.join(work, "lock"), "w")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        lock.close()
        raise RunBusy(f"{work} is in use by another process") from None
    try:
        mcfg = ModelConfig.from_dict(spec["model_config"])
        tc = TrainConfig(**spec["train_config"])
        ds = spec.get("dataset_obj") or load_dataset(spec["dataset"], data_dir=spec.get("data_dir"),
                                                     log=lambda m: None, seq=tc.seq or mcfg.ctx)
        seq = tc.validate_for(mcfg)
        check_numerics(mcfg, spec)
        resume = os.path.exists(os.path.join(work, "run.json"))
        t0 = time.perf_counter()
        trainer = Trainer(mcfg, tc, ds, work, resume=resume, json_lines=False, progress=False,
                          log=log if spec.get("verbose") else (lambda m: None),
                          data_spec=spec["key"]["data"]["name"])
        diverged = None
        try:
            summary = trainer.run()
        except DivergenceError as exc:
            summary, diverged = None, str(exc)
        if summary is not None and summary.get("stopped"):
            raise RunStopped(f"{summary['stopped']}: checkpointed at step {summary['steps']}")
        curve = val_curve(os.path.join(work, "log.jsonl"), tc.batch * seq)
        res = {"key": spec["key"], "name": spec["name"], "arm": spec["arm"], "phase": spec["phase"],
               "seed": spec["seed"], "lr": spec["lr"], "steps": tc.steps,
               "tokens": tc.steps * tc.batch * seq, "code_version": spec["key"]["code_version"],
               "diverged": diverged is not None, "error": diverged,
               "val_bpb": None, "val_stage_bpb": None, "test_bpb": None, "test": None,
               "train_tokens_per_s": None, "wall_s": None, "this_call_s": None, "resumed": resume,
               "curve": [p[:3] for p in curve],
               "stage_curve": [p[3] for p in curve] if any(p[3] for p in curve) else None}
        if summary is not None:
            val = summary.get("val_bpb")
            if val is None or not math.isfinite(val):
                raise NbrgcError(f"{spec['name']}: no finite validation bpb at the end of the run")
            res.update(val_bpb=val, val_stage_bpb=summary.get("val_stage_bpb"),
                       train_tokens_per_s=summary.get("tokens_per_s"), wall_s=summary.get("wall_s"),
                       peak_rss_mib=summary.get("peak_rss_mib"))
            if spec.get("score_test"):
                t = sliding_bpb(trainer.model, ds.test, batch=16, n_bytes=spec.get("test_bytes"))
                res["test_bpb"], res["test"] = t["bpb"], {k: t[k] for k in ("bytes_scored", "windows",
                                                                            "stride", "ctx")}
        from ..machine import describe_machine, machine_line
        res["machine"] = machine_line(describe_machine())  # a study's runs may span machines
        res["this_call_s"] = time.perf_counter() - t0
        os.makedirs(os.path.dirname(spec["result"]) or ".", exist_ok=True)
        write_json(spec["result"], res)
        return res
    finally:
        lock.close()


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m nbrgc.measure.study SPEC.json", file=sys.stderr)
        return EXIT_ERROR
    try:
        with open(argv[0]) as f:
            spec = json.load(f)
        res = run_one(spec)
    except RunStopped as exc:
        print(f"stopped: {exc}", file=sys.stderr)
        return EXIT_STOPPED
    except RunBusy as exc:
        print(f"busy: {exc}", file=sys.stderr)
        return EXIT_BUSY
    except (NbrgcError, OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print("stopped: interrupted before the first checkpoint", file=sys.stderr)
        return EXIT_STOPPED
    print(json.dumps({"val_bpb": res["val_bpb"], "test_bpb": res["test_bpb"],
                      "diverged": res["diverged"]}))
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
