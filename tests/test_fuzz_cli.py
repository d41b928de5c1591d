"""Hypothesis fuzzing of nbrgc-train's flag parsing: random flag combinations with random values, valid
and invalid (garbage strings, huge and negative numbers, nan/inf). Every outcome is either a valid
(ModelConfig, TrainConfig), or an NbrgcError / SystemExit(2) with a one-line message; never another
exception. A few examples also run the real CLI (--steps 1) in a subprocess: exit 0 with a summary,
or exit 2 with one ``error:`` line and no traceback."""
import contextlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import nbrgc  # noqa: F401  (thread-safe threading layer first)
from nbrgc.cli.train import parse
from nbrgc.config import MODES, ModelConfig, TrainConfig, parse_stage_threads
from nbrgc.errors import NbrgcError

REPO = Path(__file__).resolve().parents[1]

INT_FLAGS = ["--n-layer", "--d-model", "--n-head", "--ctx", "--n-stages", "--max-staleness", "--steps",
             "--tokens", "--batch", "--seq", "--warmup", "--eval-every", "--eval-batches", "--log-every",
             "--keep", "--ckpt-every", "--threads", "--seed"]
FLOAT_FLAGS = ["--time", "--lr", "--min-lr-frac", "--weight-decay", "--grad-clip", "--max-memory"]
BOOL_FLAGS = ["--resume", "--force", "--json", "--quiet"]

# printable text without line breaks (a newline inside argv would be echoed into an error message)
garbage = st.text(st.characters(blacklist_categories=("Cc", "Cs", "Zl", "Zp")), max_size=12)
small_int = st.integers(-3, 40).map(str)
any_int = st.one_of(small_int, st.integers(1, 8).map(str), st.integers(-2**70, 2**70).map(str),
                    st.sampled_from(["0", "1", "-0", "1_0", "2.0"]))
any_float = st.one_of(st.floats(allow_nan=True, allow_infinity=True).map(repr),
                      st.sampled_from(["nan", "inf", "-inf", "1e400", "-1", "0", "0.5", "1e-3", "3"]),
                      st.floats(0, 1).map(repr))
stage_threads = st.one_of(st.sampled_from(["auto", "AUTO", "1", "1,1", "1,1,1,1", "2,1", "0,1", "1,,1",
                                           "x", "", "-1,1", "99999", "1.5"]),
                          st.lists(st.integers(-1, 5), min_size=1, max_size=5).map(lambda v: ",".join(map(str, v))))


def mostly(plausible, bad=garbage):
    """Garbage one time in eight, so that combinations of several flags still often parse."""
    return st.integers(0, 7).flatmap(lambda i: bad if i == 0 else plausible)


def value_for(flag):
    if flag in INT_FLAGS:
        return mostly(any_int)
    if flag in FLOAT_FLAGS:
        return mostly(any_float)
    return {"--config": mostly(st.sampled_from(["tiny", "small", "paper"])),
            "--mode": mostly(st.sampled_from(list(MODES))),
            "--on-nan": mostly(st.sampled_from(["stop", "skip"])),
            "--stage-threads": mostly(stage_threads),
            "--stage-workers": mostly(st.sampled_from(["auto", "1", "2", "3", "4", "0", "-1", "x"])),
            "--dataset": mostly(st.just("default")),
            "--data-dir": garbage, "--out": garbage}[flag]


ALL_FLAGS = INT_FLAGS + FLOAT_FLAGS + BOOL_FLAGS + ["--config", "--mode", "--on-nan", "--stage-threads",
                                                    "--stage-workers", "--dataset", "--data-dir", "--out"]


@st.composite
def argvs(draw, flags=ALL_FLAGS, extra_garbage=True):
    argv = []
    for flag in draw(st.lists(st.sampled_from(flags), max_size=8)):
        argv.append(flag)
        if flag not in BOOL_FLAGS:
            if extra_garbage and draw(st.integers(0, 30)) == 0:
                continue  # a flag missing its value
            argv.append(draw(value_for(flag)))
    if extra_garbage and draw(st.integers(0, 15)) == 0:
        argv.insert(draw(st.integers(0, len(argv))), draw(garbage))  # a stray token
    return argv


def outcome(argv):
    """('ok', (mcfg, tc, a)) | ('error', message) | ('exit', code, stderr); anything else propagates."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            return "ok", parse(argv)
    except NbrgcError as exc:
        return "error", str(exc)
    except SystemExit as exc:
        return "exit", exc.code, err.getvalue()


def check(argv):
    res = outcome(argv)
    if res[0] == "ok":
        mcfg, tc, a = res[1]
        assert isinstance(mcfg, ModelConfig) and isinstance(tc, TrainConfig)
        seq = tc.seq or mcfg.ctx
        assert 1 <= seq <= mcfg.ctx and mcfg.d_model % mcfg.n_head == 0
        assert tc.mode in MODES and tc.steps >= 1 and tc.batch >= 1
        if tc.mode != "bp":
            assert mcfg.n_layer % tc.n_stages == 0
        else:
            assert tc.n_stages == 1
        if tc.mode == "rgc-async":
            parse_stage_threads(tc.stage_threads, tc.n_stages)
            assert 0 <= tc.stage_workers <= tc.n_stages
        assert not a.resume or a.out
        for v in (tc.lr, tc.min_lr_frac, tc.weight_decay, tc.grad_clip):
            assert v == v and abs(v) != float("inf")
        if a.time is not None:
            assert 0 < a.time < float("inf")
        if a.max_memory is not None:
            assert 0 < a.max_memory < float("inf")
    elif res[0] == "error":
        msg = res[1]
        assert msg and "\n" not in msg, repr(msg)
    else:
        code, stderr = res[1], res[2]
        assert code == 2, (code, stderr)
        lines = stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), repr(stderr)
    return res


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(argvs())
@example(["--batch", "0", "--tokens", "5"])
@example(["--time", "nan"])
@example(["--max-memory", "nan"])
@example(["--lr", "1e400"])
@example(["--mode", "rgc-async", "--n-stages", "2", "--stage-threads", "1,,1"])
@example(["--mode", "rgc-sync", "--n-layer", "3", "--n-stages", "2"])
@example(["--seq", "-1", "--tokens", "10"])
@example(["--config", "small", "--n-head", "3"])
@example(["--resume"])
@example(["--steps"])
@example(["stray"])
def test_parse_never_raises_anything_else(argv):
    check(argv)


def test_valid_flags_parse():
    kind, (mcfg, tc, a) = outcome(["--config", "tiny", "--mode", "rgc-async", "--n-layer", "4", "--n-stages",
                                    "4", "--stage-threads", "1,1,1,1", "--time", "5", "--lr", "3e-3"])
    assert kind == "ok" and tc.mode == "rgc-async" and tc.n_stages == 4 and a.time == 5.0 and tc.lr == 3e-3


# the real CLI, a few examples: small values so that a run that is accepted is quick
SMALL = {"--n-layer": st.integers(1, 4), "--d-model": st.sampled_from([8, 16, 30, 32]),
         "--n-head": st.integers(1, 4), "--ctx": st.integers(1, 24), "--n-stages": st.integers(1, 4),
         "--max-staleness": st.integers(-1, 2), "--batch": st.integers(-1, 4), "--seq": st.integers(-1, 24),
         "--warmup": st.integers(-1, 3), "--eval-every": st.integers(-1, 2), "--log-every": st.integers(0, 2),
         "--keep": st.integers(0, 2), "--ckpt-every": st.integers(-1, 2), "--seed": st.integers(-1, 5),
         "--lr": st.sampled_from(["1e-3", "0", "nan", "x", "1e30"]), "--grad-clip": st.sampled_from(["0", "1"]),
         "--mode": st.sampled_from(list(MODES) + ["sideways"]),
         "--stage-threads": st.sampled_from(["auto", "1", "1,1", "1,1,1,1", "0", "y"]),
         "--on-nan": st.sampled_from(["stop", "skip", "?"]), "--max-memory": st.sampled_from(["0.01", "1000"])}


@st.composite
def cli_argvs(draw):
    argv = []
    for flag in draw(st.lists(st.sampled_from(sorted(SMALL)), max_size=6, unique=True)):
        argv += [flag, str(draw(SMALL[flag]))]
    if draw(st.booleans()):
        argv.append("--json")
    return argv


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(cli_argvs())
@example(["--mode", "rgc-async", "--n-stages", "2", "--stage-threads", "1,1", "--json"])
@example(["--batch", "0", "--json"])
def test_cli_runs_or_prints_one_line(tmp_path_factory, argv):
    out = tmp_path_factory.mktemp("fuzz") / "run"
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.pop("NBRGC_FAULT", None)
    args = ["--config", "tiny", "--quiet", "--threads", "1", "--eval-batches", "1", *argv, "--out", str(out),
            "--steps", "1"]
    p = subprocess.run([sys.executable, str(REPO / "bin" / "nbrgc-train"), *args], cwd=REPO,
                       capture_output=True, text=True, timeout=180, env=env)
    assert "Traceback" not in p.stderr, (args, p.stderr)
    if p.returncode == 0:
        if "--json" in argv:
            summary = json.loads(p.stdout.strip().splitlines()[-1])
            assert summary["summary"] is True and summary["steps"] == 1
        assert "done:" in p.stderr
    else:
        assert p.returncode == 2, (args, p.returncode, p.stderr)
        lines = p.stderr.strip().splitlines()
        assert lines[-1].startswith("error: ") and sum(s.startswith("error:") for s in lines) == 1, p.stderr
    # the parser agrees with the process: it accepts exactly what the process did not reject up front
    kind = outcome(args)[0]
    if kind != "ok":
        assert p.returncode == 2
