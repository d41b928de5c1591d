"""A run folder's ``log.jsonl`` read back as curves (what ``nbrgc-plot`` and the study draw).

The trainer appends one JSON object per line: training records (``step``, ``bpb``, and
``stage_bpb`` for RGC), evaluation records (``step``, ``val_bpb``, ``val_stage_bpb``) and a summary
(``summary: true``). One folder's log can hold more than one process's lines: a resumed run restarts
from its checkpoint and logs the steps after it again; ``--force`` starts over at step 1. So when a
training record's step is not past the previous one, everything logged from that step on is
dropped: what remains is the history of the run as it finally went. A line that does not parse (a
process killed mid-write) is skipped and counted.
"""
import json
import os

from ..errors import NbrgcError

LOG_FILE, RUN_FILE = "log.jsonl", "run.json"


class LogError(NbrgcError):
    """A run folder's log or run.json is missing or unusable."""


def _drop_from(points, step):
    return [p for p in points if p[0] < step]


def parse_log(lines):
    """``{"train": [(step, bpb, stage_bpb)], "val": [(step, val_bpb, val_stage_bpb)], "summary",
    "bad_lines"}`` from an iterable of log lines; ``stage_bpb`` entries are None for bp."""
    train, val, summary, bad, last = [], [], None, 0, None
    for line in lines:
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except ValueError:
            bad += 1
            continue
        if not isinstance(rec, dict):
            bad += 1
            continue
        if rec.get("summary"):
            summary = rec
            continue
        step = rec.get("step")
        if not isinstance(step, int) or isinstance(step, bool):
            bad += 1
            continue
        if rec.get("bpb") is not None:
            if last is not None and step <= last:
                train, val = _drop_from(train, step), _drop_from(val, step)
            last = step
            train.append((step, float(rec["bpb"]), rec.get("stage_bpb")))
        elif rec.get("val_bpb") is not None:
            val = _drop_from(val, step)
            val.append((step, float(rec["val_bpb"]), rec.get("val_stage_bpb")))
        else:
            bad += 1
    return {"train": train, "val": val, "summary": summary, "bad_lines": bad}


def read_log(path):
    """:func:`parse_log` of the file at ``path``; LogError (one line) when it cannot be read."""
    try:
        with open(path, encoding="utf-8") as f:
            return parse_log(f)
    except FileNotFoundError:
        raise LogError(f"{path}: no such log") from None
    except IsADirectoryError:
        raise LogError(f"{path} is a folder, not a log") from None
    except UnicodeDecodeError:
        raise LogError(f"{path} is not a text log (corrupt?)") from None
    except OSError as exc:
        raise LogError(f"cannot read {path}: {exc.strerror or exc}") from None


def tokens_per_step(run_json):
    """batch x sequence length of the run described by a parsed ``run.json``."""
    tc, mc = run_json.get("train_config"), run_json.get("model_config")
    if not isinstance(tc, dict) or not isinstance(mc, dict):
        raise ValueError("no train_config / model_config")
    batch, seq = int(tc["batch"]), int(tc.get("seq") or 0) or int(mc["ctx"])
    if batch < 1 or seq < 1:
        raise ValueError(f"batch {batch} x seq {seq}")
    return batch * seq


def load_run(run):
    """One run for plotting: ``run`` is a run folder (holding log.jsonl and run.json) or the path of
    its log.jsonl. Returns ``{"name", "mode", "n_stages", "tokens_per_step", "train", "val",
    "summary", "bad_lines"}``; LogError names what is missing or unusable."""
    run = os.fspath(run)
    if os.path.isdir(run):
        folder, log = run, os.path.join(run, LOG_FILE)
        if not os.path.exists(log):
            raise LogError(f"{run} holds no {LOG_FILE}: not a run folder (train with --out {run})")
    elif os.path.exists(run):
        folder, log = os.path.dirname(os.path.abspath(run)), run
    else:
        raise LogError(f"no such run folder or log: {run}")
    meta_path = os.path.join(folder, RUN_FILE)
    try:
        with open(meta_path, encoding="utf-8") as f:
            meta = json.load(f)
        tps = tokens_per_step(meta)
    except FileNotFoundError:
        raise LogError(f"{meta_path} is missing: cannot tell the tokens per step of {run}") from None
    except (OSError, ValueError, KeyError, TypeError, UnicodeDecodeError):
        raise LogError(f"{meta_path} is unreadable or not a run description (corrupt?)") from None
    rec = read_log(log)
    if not rec["train"] and not rec["val"]:
        raise LogError(f"{log} has no training or validation records"
                       + (f" ({rec['bad_lines']} unreadable line(s): corrupt?)" if rec["bad_lines"] else ""))
    tc = meta["train_config"]
    name = os.path.basename(os.path.normpath(folder)) or folder
    return dict(rec, name=name, mode=tc.get("mode", "?"),
                n_stages=int(tc.get("n_stages") or 1) if tc.get("mode") != "bp" else 1,
                tokens_per_step=tps)


def val_curve(log_path, tokens_per_step):
    """[[step, tokens, val_bpb, val_stage_bpb or None]] of one run's log (the study's curves); an
    unreadable log gives []."""
    try:
        val = read_log(log_path)["val"]
    except LogError:
        return []
    return [[s, s * tokens_per_step, v, st] for s, v, st in val]
