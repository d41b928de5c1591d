"""One report for one study folder, whatever each invocation names.

A long study is continued piecewise: one command runs the confirmation seeds of one arm, another the
sweep of the next. Each invocation writes OUT/study.md, and a report of only the arms and seeds it
names would hide every other finished result. So the report covers the union of what this
invocation names and what the folder's previous report covered (when that report is of the same
study: same data, model, schedule and budget), and its reproducing command names that union, with
the phase left to its default (all: running it continues the whole study).
"""
import contextlib
import json
import os
import shlex

from .arms import ARMS


def previous_scope(st):
    """(arms, seeds) of OUT/study.json when it reports the same study as ``st``, else None."""
    path = os.path.join(st.out, "study.json")
    try:
        with open(path) as f:
            prev = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(prev, dict) or prev.get("data") != st.data_id:
        return None
    if prev.get("tokens_per_run") != st.steps * st.batch * st.seq:
        return None
    cfg = prev.get("config") or {}
    mine = dict(st.mcfg.to_dict(), preset=st.config, batch=st.batch, n_stages=st.base["n_stages"],
                steps=st.steps, eval_every=st.eval_every)
    if any(cfg.get(k) != v for k, v in mine.items()):
        return None
    arms = [a for a in prev.get("arms", {}) if a in ARMS]
    seeds = [int(s) for s in prev.get("seeds", [])]
    return arms, seeds


def _command(command, arms, seeds):
    """``command`` with --arms and --seeds set to ``arms`` and ``seeds`` and no --phase."""
    argv = shlex.split(command)
    out, skip = [], False
    for x in argv:
        if skip:
            skip = False
            continue
        name = x.split("=", 1)[0]
        if name in ("--arms", "--seeds", "--phase"):
            skip = "=" not in x
            continue
        out.append(x)
    if seeds == list(range(len(seeds))):
        text = str(len(seeds))  # a count: seeds 0..N-1
    else:
        text = ",".join(map(str, seeds)) + ("," if len(seeds) == 1 else "")  # a list, even of one
    out += ["--arms", ",".join(arms), "--seeds", text]
    return shlex.join(out)


@contextlib.contextmanager
def report_scope(st):
    """While the report is built: ``st`` covers its own arms and seeds and the previous report's."""
    scope = previous_scope(st)
    if scope is None or (set(scope[0]) <= set(st.arms) and set(scope[1]) <= set(st.seeds)):
        yield
        return
    arms = [a for a in ARMS if a in set(st.arms) | set(scope[0])]
    seeds = sorted(set(st.seeds) | set(scope[1]))
    saved = st.arms, st.seeds, st.fingerprints, st.command
    known = getattr(st, "_widened_fps", {})  # computed once per invocation (seconds an arm)
    extra = [a for a in arms if a not in (st.fingerprints or {}) and a not in known]
    known.update(st.compute_fingerprints(extra))
    st._widened_fps = known
    fps = dict(known, **(st.fingerprints or {}))
    st.arms, st.seeds, st.fingerprints = arms, seeds, fps
    if st.command:
        st.command = _command(st.command, [a for a in arms if a != "bp"] or ["bp"], seeds)
    try:
        yield
    finally:
        st.arms, st.seeds, st.fingerprints, st.command = saved
