"""The command-line tools end to end (subprocesses of bin/nbrgc-*), their one-line errors, and the
logic behind nbrgc-eval (full-context sliding window) and nbrgc-sample (generation)."""
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import nbrgc  # noqa: F401  (thread-safe threading layer first)
from nbrgc import checkpoint as ck
from nbrgc.config import TrainConfig, preset
from nbrgc.errors import CheckpointError, ConfigError
from nbrgc.evaluate import LN2, sliding_bpb, sliding_windows

REPO = Path(__file__).resolve().parents[1]
ENWIK6 = REPO.parent / "shared" / "data" / "enwik6"
SUMMARY_KEYS = {"summary", "val_bpb", "tokens", "wall_s", "tokens_per_s", "peak_rss_mib", "checkpoint"}
LOG_KEYS = {"step", "loss", "tokens_per_s", "elapsed_s"}
RGC = ["--config", "tiny", "--n-layer", "4", "--n-stages", "2"]


def run(tool, *args, cwd=None, timeout=240):
    """Run bin/nbrgc-<tool> with ``args``; returns CompletedProcess (stdout as bytes)."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    if "--threads" not in args:  # one thread: tiny steps are fastest so on a busy machine
        args = (*args, "--threads", "1")
    return subprocess.run([sys.executable, str(REPO / "bin" / f"nbrgc-{tool}"), *map(str, args)],
                          cwd=cwd or REPO, capture_output=True, timeout=timeout, env=env)


def train(*args, **kw):
    p = run("train", "--quiet", "--json", *args, **kw)
    assert p.returncode == 0, p.stderr.decode(errors="replace")
    assert b"Traceback" not in p.stderr
    return [json.loads(line) for line in p.stdout.decode().splitlines() if line.strip()]


def check_log(recs, steps, start=0):
    """Every log line has the stable keys; the last line is the summary; steps run start+1..steps."""
    *lines, summary = recs
    assert SUMMARY_KEYS <= set(summary) and summary["summary"] is True
    assert summary["steps"] == steps
    assert summary["tokens"] > 0 and summary["wall_s"] > 0 and summary["peak_rss_mib"] > 0
    assert math.isfinite(summary["val_bpb"]) and 0 < summary["val_bpb"] < 9
    assert summary["checkpoint"] and os.path.isfile(summary["checkpoint"])
    assert os.path.basename(summary["checkpoint"]) == f"ckpt-{steps:09d}.nbrgc"
    train_lines = [r for r in lines if "loss" in r]
    for r in train_lines:
        assert LOG_KEYS <= set(r), r
        assert math.isfinite(r["loss"]) and r["tokens_per_s"] >= 0 and r["elapsed_s"] >= 0
    assert [r["step"] for r in train_lines] == list(range(start + 1, steps + 1))
    assert all("val_bpb" in r for r in lines if "loss" not in r)
    return train_lines, summary


def one_line_error(p):
    err = p.stderr.decode(errors="replace")
    assert p.returncode != 0, err
    assert "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), err
    return lines[0]


# ---------------------------------------------------------------------- end to end
@pytest.mark.parametrize("mode,extra", [("bp", ["--config", "tiny"]),
                                        ("rgc-sync", RGC),
                                        ("rgc-async", RGC + ["--stage-threads", "1,1"])])
def test_train_resume_eval_sample(tmp_path, mode, extra):
    out = tmp_path / "run"
    recs = train("--dataset", "default", "--mode", mode, *extra, "--steps", "6", "--eval-every", "3",
                 "--log-every", "1", "--out", out)
    lines, summary = check_log(recs, 6)
    assert summary["mode"] == mode
    if mode != "bp":
        assert all(len(r["stage_bpb"]) == 2 for r in lines)
    assert (out / "run.json").is_file() and (out / "log.jsonl").is_file()

    # resume for more steps: continues at step 7
    recs = train("--dataset", "default", "--mode", mode, *extra, "--steps", "9", "--eval-every", "3",
                 "--log-every", "1", "--out", out, "--resume")
    check_log(recs, 9, start=6)
    assert [os.path.basename(p) for p in ck.list_checkpoints(out)][-1] == "ckpt-000000009.nbrgc"

    # evaluation: a run folder means its newest checkpoint
    p = run("eval", out, "--dataset", "default", "--bytes", "3000", "--json", "--quiet")
    assert p.returncode == 0, p.stderr.decode()
    res = json.loads(p.stdout)
    assert {"bpb", "bytes", "split", "checkpoint"} <= set(res)
    assert res["bytes"] == 2999 and res["split"] == "val"
    assert res["checkpoint"].endswith("ckpt-000000009.nbrgc")
    assert 0 < res["bpb"] < 9
    # the human line, on the test split, from an explicit file; dataset taken from the checkpoint
    p = run("eval", out / "ckpt-000000006.nbrgc", "--split", "test", "--bytes", "500", "--quiet")
    assert p.returncode == 0, p.stderr.decode()
    text = p.stdout.decode().strip()
    assert len(text.splitlines()) == 1 and "test bpb" in text and "499 bytes" in text

    # sampling
    prompt = "Once upon a time"
    p = run("sample", out, "--prompt", prompt, "--bytes", 40, "--temperature", 0.8, "--top-k", 20,
            "--seed", 1)
    assert p.returncode == 0, p.stderr.decode()
    assert p.stdout.startswith(prompt.encode()) and len(p.stdout) == len(prompt) + 40
    again = run("sample", out, "--prompt", prompt, "--bytes", 40, "--temperature", 0.8, "--top-k",
                20, "--seed", 1)
    assert again.stdout == p.stdout  # seeded


def test_enwik6(tmp_path):
    if not ENWIK6.is_file():
        pytest.skip(f"shared test data not found: {ENWIK6}")
    out = tmp_path / "run"
    recs = train("--dataset", ENWIK6, "--data-dir", tmp_path / "data", "--steps", "5",
                 "--eval-every", "5", "--log-every", "1", "--out", out)
    check_log(recs, 5)
    p = run("eval", out, "--dataset", ENWIK6, "--data-dir", tmp_path / "data", "--bytes", "2000",
            "--json", "--quiet")
    assert p.returncode == 0, p.stderr.decode()
    res = json.loads(p.stdout)
    assert res["bytes"] == 1999 and 0 < res["bpb"] < 9
    # a long prompt (longer than ctx) is written whole; only its last ctx bytes condition the model
    prompt = ENWIK6.read_bytes()[:100]
    pf = tmp_path / "prompt.bin"
    pf.write_bytes(prompt)
    p = run("sample", out / "ckpt-000000005.nbrgc", "--prompt-file", pf, "--bytes", 30,
            "--temperature", 0)
    assert p.returncode == 0, p.stderr.decode()
    assert p.stdout.startswith(prompt) and len(p.stdout) == 130


def test_sample_zero_bytes_and_empty_prompt(tmp_path):
    out = tmp_path / "run"
    train("--steps", "2", "--out", out)
    p = run("sample", out, "--prompt", "abc", "--bytes", 0)
    assert p.returncode == 0 and p.stdout == b"abc"
    p = run("sample", out, "--bytes", 7, "--temperature", 0)
    assert p.returncode == 0 and len(p.stdout) == 7


# ---------------------------------------------------------------------- one-line errors
@pytest.mark.parametrize("args", [
    ["--mode", "foo"],
    ["--n-layer", "4", "--mode", "rgc-sync", "--n-stages", "3"],
    ["--mode", "rgc-async", "--n-stages", "4"],            # tiny has 2 layers
    ["--d-model", "30", "--n-head", "4"],
    ["--seq", "17"],                                        # tiny's ctx is 16
    ["--steps", "-1"],
    ["--lr", "abc"],
    ["--lr", "-1"],
    ["--batch", "0"],
    ["--config", "huge"],
    ["--no-such-flag"],
    ["--dataset", "no/such/file.txt"],
    ["--resume"],
    ["--consensus", "mean"],
    ["--stage-init", "zero"],
])
def test_train_flag_errors(args):
    msg = one_line_error(run("train", "--quiet", "--steps", "2", "--config", "tiny", *args))
    assert len(msg) < 300


def test_train_data_and_out_errors(tmp_path):
    def train(*args):  # on tiny, whose config the --resume refusals below differ from
        return globals()["train"]("--config", "tiny", *args)

    def run(tool, *args):
        return globals()["run"](tool, "--config", "tiny", *args)
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    one_line_error(run("train", "--quiet", "--steps", "2", "--dataset", empty))
    short = tmp_path / "short.txt"
    short.write_bytes(b"x" * 30)
    one_line_error(run("train", "--quiet", "--steps", "2", "--dataset", short))
    afile = tmp_path / "afile"
    afile.write_bytes(b"not a folder")
    one_line_error(run("train", "--quiet", "--steps", "2", "--out", afile))
    # --out holding another run: refused without --resume / --force
    out = tmp_path / "run"
    train("--steps", "2", "--out", out)
    msg = one_line_error(run("train", "--quiet", "--steps", "2", "--out", out))
    assert "--resume" in msg
    # resuming with another model config or mode is refused too
    one_line_error(run("train", "--quiet", "--steps", "4", "--out", out, "--resume", "--d-model", "64"))
    one_line_error(run("train", "--quiet", "--steps", "4", "--out", out, "--resume", *RGC[2:],
                       "--mode", "rgc-sync"))
    recs = train("--steps", "2", "--out", out, "--force")
    assert recs[-1]["steps"] == 2


def _truncated_checkpoint(tmp_path):
    out = tmp_path / "run"
    train("--steps", "2", "--out", out)
    good = out / "ckpt-000000002.nbrgc"
    bad = tmp_path / "bad.nbrgc"
    bad.write_bytes(good.read_bytes()[:-100])
    return out, good, bad


@pytest.mark.parametrize("tool", ["eval", "sample"])
def test_checkpoint_errors(tmp_path, tool):
    out, good, bad = _truncated_checkpoint(tmp_path)
    msg = one_line_error(run(tool, tmp_path / "missing.nbrgc"))
    assert "missing.nbrgc" in msg
    msg = one_line_error(run(tool, bad))
    assert "truncated" in msg
    junk = tmp_path / "junk.nbrgc"
    junk.write_bytes(b"hello")
    one_line_error(run(tool, junk))
    emptydir = tmp_path / "emptydir"
    emptydir.mkdir()
    one_line_error(run(tool, emptydir))
    # a run folder whose only checkpoint is corrupt
    baddir = tmp_path / "baddir"
    baddir.mkdir()
    shutil.copy(bad, baddir / "ckpt-000000002.nbrgc")
    p = run(tool, baddir)
    assert p.returncode != 0 and b"Traceback" not in p.stderr
    assert p.stderr.decode().strip().splitlines()[-1].startswith("error:")
    # a run folder whose newest checkpoint is corrupt falls back to the older good one
    shutil.copy(good, baddir / "ckpt-000000001.nbrgc")
    p = run(tool, baddir, *(["--bytes", "100", "--quiet"] if tool == "eval" else ["--bytes", "3"]))
    assert p.returncode == 0, p.stderr.decode()
    assert b"skipping checkpoint" in p.stderr


@pytest.mark.parametrize("args", [
    ["--temperature", "-1"], ["--temperature", "x"], ["--temperature", "inf"],
    ["--top-k", "0"], ["--top-k", "257"], ["--top-k", "2.5"], ["--bytes", "-1"], ["--seed", "-3"],
    ["--prompt-file", "/no/such/prompt"],
])
def test_sample_flag_errors(tmp_path, args):
    ckpt = tmp_path / "whatever.nbrgc"  # flags are checked before the checkpoint is read
    one_line_error(run("sample", ckpt, *args))


def test_eval_flag_errors(tmp_path):
    out = tmp_path / "run"
    train("--config", "tiny", "--steps", "2", "--out", out)  # ctx 16: --stride 17 is too long
    for args in (["--split", "train"], ["--bytes", "1"], ["--batch", "0"], ["--stride", "0"],
                 ["--stride", "17"], ["--dataset", tmp_path / "nofile.txt"], ["--dataset", "nosuch"]):
        one_line_error(run("eval", out, "--quiet", *args))


# ---------------------------------------------------------------------- sliding window
@pytest.mark.parametrize("n,ctx,stride", [(2, 16, None), (10, 16, None), (17, 16, None), (18, 16, None),
                                          (100, 16, None), (101, 16, 5), (1000, 64, 1), (77, 8, 8),
                                          (50, 7, 3), (33, 16, 16)])
def test_sliding_windows_score_every_byte_once(n, ctx, stride):
    L, wins = sliding_windows(n, ctx, stride)
    assert L == min(ctx, n - 1)
    s_eff = max(1, L // 2) if stride is None else stride
    count = np.zeros(n, int)
    context = np.zeros(n, int)
    for start, first in wins:
        assert 0 <= start and start + L + 1 <= n and 0 <= first < L
        for i in range(first, L):
            t = start + 1 + i           # the target byte's index
            count[t] += 1
            context[t] = i + 1          # inputs start..start+i
    assert count[0] == 0 and (count[1:] == 1).all()
    t = np.arange(1, n)
    assert (context[1:] >= np.minimum(t, L - s_eff + 1)).all()
    assert (context[1:] <= np.minimum(t, L)).all()
    if s_eff == 1:
        assert (context[1:] == np.minimum(t, L)).all()


def test_sliding_windows_bad_args():
    with pytest.raises(ValueError):
        sliding_windows(100, 16, 0)
    with pytest.raises(ValueError):
        sliding_windows(100, 16, 17)
    assert sliding_windows(1, 16) == (0, [])


@pytest.fixture(scope="module")
def model():
    from nbrgc.model import Model
    m = Model(preset("tiny"), seed=3)
    rng = np.random.default_rng(0)
    m.flat[...] += rng.normal(0, 0.15, m.flat.shape).astype(m.flat.dtype)  # make context matter
    return m


def _byte_loss(model, data, t, c):
    """-log p(data[t] | data[t-c:t]) from one unpadded forward pass."""
    z = model.logits(data[t - c:t][None].astype(np.int32))[0, -1].astype(np.float64)
    return float(np.log(np.exp(z - z.max()).sum()) + z.max() - z[data[t]])


@pytest.mark.parametrize("n,stride,batch", [(60, None, 3), (60, 1, 4), (12, None, 16), (45, 5, 2)])
def test_sliding_bpb_matches_byte_by_byte(model, n, stride, batch):
    data = np.random.default_rng(n).integers(0, 256, 200).astype(np.uint8)
    res = sliding_bpb(model, data, 16, batch, n_bytes=n, stride=stride)
    assert res["bytes_scored"] == n - 1
    L, wins = sliding_windows(n, 16, stride)
    ref = 0.0
    for start, first in wins:
        for i in range(first, L):
            ref += _byte_loss(model, data, start + 1 + i, i + 1)
    assert res["bpb"] == pytest.approx(ref / (n - 1) / LN2, rel=2e-5)


def test_sliding_bpb_single_window_is_model_loss(model):
    data = np.random.default_rng(1).integers(0, 256, 17).astype(np.uint8)
    res = sliding_bpb(model, data, batch=4)
    x, y = data[None, :-1].astype(np.int32), data[None, 1:].astype(np.int32)
    assert res["bytes_scored"] == 16
    assert res["bpb"] == pytest.approx(model.loss(x, y) / LN2, rel=1e-5)
    with pytest.raises(ConfigError):
        sliding_bpb(model, data, n_bytes=1)
    with pytest.raises(ConfigError):
        sliding_bpb(model, data, ctx=17)


# ---------------------------------------------------------------------- generation
def test_generate_greedy_matches_unpadded_reference(model):
    from nbrgc.sample import generate
    prompt = b"a long prompt, longer than the model's ctx"
    got = generate(model, prompt, 20, temperature=0)
    hist = bytearray(prompt)
    for _ in range(20):
        w = np.frombuffer(bytes(hist[-16:]), np.uint8)[None].astype(np.int32)
        hist.append(int(np.argmax(model.logits(w)[0, -1])))
    assert got == bytes(hist[len(prompt):])


def test_generate_seeded_and_top_k(model):
    from nbrgc.sample import generate, next_byte
    a = generate(model, b"xy", 30, temperature=1.0, top_k=5, seed=7)
    assert a == generate(model, b"xy", 30, temperature=1.0, top_k=5, seed=7)
    assert len(a) == 30 and len(generate(model, b"", 4)) == 4
    rng = np.random.default_rng(0)
    z = np.arange(256, dtype=np.float64)
    assert {next_byte(z, 1.0, 3, rng) for _ in range(200)} <= {253, 254, 255}
    assert next_byte(z, 0.0, 1, rng) == 255
    assert next_byte(z, 5.0, 1, rng) == 255
    for bad in ({"temperature": -0.5}, {"top_k": 0}, {"top_k": 300}, {"temperature": float("nan")}):
        with pytest.raises(ConfigError):
            generate(model, b"x", 3, **{"temperature": 1.0, "top_k": 10, **bad})


def test_load_model_errors(tmp_path):
    from nbrgc.sample import load_model
    with pytest.raises(CheckpointError):
        load_model(tmp_path / "nope")
    with pytest.raises(CheckpointError):
        load_model(tmp_path)  # a folder without checkpoints
    # a checkpoint whose params do not fit its model_config
    ck.save(tmp_path, 1, {"params": np.zeros(10, np.float32)}, {"model_config": preset("tiny").to_dict()})
    with pytest.raises(CheckpointError, match="needs"):
        load_model(tmp_path)
    ck.save(tmp_path / "b", 1, {"params": np.zeros(10, np.float32)}, {})
    with pytest.raises(CheckpointError, match="model_config"):
        load_model(tmp_path / "b")


def test_rgc_variant_flags_reach_the_config():
    from nbrgc.cli.train import parse
    _, tc, _ = parse(["--mode", "rgc-async", "--n-stages", "2", "--consensus", "depth", "--stage-init", "identity"])
    assert (tc.consensus, tc.stage_init) == ("depth", "identity")
    _, tc, _ = parse([])
    assert (tc.consensus, tc.stage_init) == ("uniform", "standard")


def test_train_help_shows_every_flag_with_help_and_real_defaults():
    from nbrgc.cli.train import build_parser
    p = build_parser()
    for a in p._actions:
        if a.option_strings and a.dest != "help":
            assert a.help, f"{a.option_strings[0]} has no help line"
    text = p.format_help()
    assert "(default: None)" not in text and "(default: False)" not in text
    assert f"(default: {TrainConfig.steps})" in text and "(default: 5% of steps)" in text
    assert "(default: auto)" in text and "(default: the preset's)" in text
    for cmd in ("nbrgc-sample", "nbrgc-eval", "rgc-async", "enwik8"):  # the next commands
        assert cmd in text.split("Then:")[1]


def test_next_commands_fit_the_run():
    """After the demo: sample, evaluate, a real dataset, the method; after a run stopped early: its
    own command with --out and --resume, which the parser accepts as it is."""
    import shlex

    from nbrgc.cli.train import AFTER_DEMO, next_commands, parse
    _, tc, a = parse([])
    done = next_commands("runs/demo-bp", [], a, tc, {"steps": tc.steps})
    assert done[0].startswith("bin/nbrgc-sample runs/demo-bp") and done[2:] == list(AFTER_DEMO)
    argv = ["--dataset", "text:my file.txt", "--config", "small", "--steps", "50", "--time", "9"]
    _, tc, a = parse(argv)
    cmds = next_commands("runs/small-bp-2", argv, a, tc, {"steps": 7})
    assert not set(AFTER_DEMO) & set(cmds) and "--resume" in cmds[2]
    again = shlex.split(cmds[2].split("   #")[0])[1:]
    assert again == argv + ["--out", "runs/small-bp-2", "--resume"]
    _, _, b = parse(again)
    assert b.resume and b.out == "runs/small-bp-2" and b.dataset == "text:my file.txt"


def test_train_defaults_are_train_configs():
    """The flags read TrainConfig's defaults; derived ones follow its rules."""
    from nbrgc.cli.train import parse
    from nbrgc.config import DEFAULT_PRESET, preset_batch, preset_lr
    mcfg, tc, _ = parse([])
    assert mcfg == preset(DEFAULT_PRESET) and tc.batch == preset_batch(DEFAULT_PRESET)
    assert tc.lr == preset_lr(DEFAULT_PRESET)
    ref = TrainConfig(batch=tc.batch, lr=tc.lr)
    assert tc == ref
    assert (tc.steps, tc.warmup, tc.eval_every) == (TrainConfig.steps, TrainConfig.steps // 20,
                                                    TrainConfig.steps // 5)
    # explicit flags are what they say; the derived ones follow --steps
    _, tc, _ = parse(["--config", "tiny", "--steps", "6", "--eval-every", "3"])
    assert (tc.steps, tc.warmup, tc.eval_every, tc.batch, tc.lr) == (6, 0, 3, 4, 1e-3)
    _, tc, _ = parse(["--config", "small", "--steps", "300", "--warmup", "7", "--lr", "2e-3"])
    assert (tc.warmup, tc.eval_every, tc.batch, tc.lr) == (7, 60, 16, 2e-3)
    # the API's TrainConfig fills the preset's batch in for the model it trains
    assert TrainConfig().for_model(preset("small")).batch == 16
    assert TrainConfig(batch=3).for_model(preset("small")).batch == 3


def test_quick_tiny_run_smoke(tmp_path):
    """The quick tiny run (300 steps) trains end to end, learns, and writes its run folder."""
    out = tmp_path / "run"
    recs = train("--config", "tiny", "--steps", "300", "--log-every", "1", "--out", out, "--sample", "0")
    lines, summary = check_log(recs, 300)
    assert summary["val_bpb"] < 5.5  # from 8 bits a byte at initialisation
    assert (out / "ckpt-000000300.nbrgc").is_file()


def test_default_run_keeps_a_fresh_folder_and_ends_with_a_sample(tmp_path):
    """No --out: the run gets runs/CONFIG-MODE, the next one CONFIG-MODE-2 (nothing overwritten),
    and the run ends with a sample of the trained model and the next commands."""
    env = dict(os.environ, NBRGC_RUNS=str(tmp_path / "runs"), PYTHONUNBUFFERED="1")
    cmd = [sys.executable, str(REPO / "bin" / "nbrgc-train"), "--config", "tiny", "--steps", "3",
           "--threads", "1", "--quiet", "--sample", "40"]
    first = subprocess.run(cmd, capture_output=True, env=env, timeout=240, cwd=tmp_path)
    assert first.returncode == 0, first.stderr.decode()
    again = subprocess.run(cmd, capture_output=True, env=env, timeout=240, cwd=tmp_path)
    assert again.returncode == 0, again.stderr.decode()
    runs = tmp_path / "runs"
    assert sorted(p.name for p in runs.iterdir()) == ["tiny-bp", "tiny-bp-2"]
    for p, name in ((first, "tiny-bp"), (again, "tiny-bp-2")):
        assert (runs / name / "ckpt-000000003.nbrgc").is_file()
        text = p.stdout.decode(errors="replace")
        assert "sample (40 bytes" in text and "  | " in text
        assert f"bin/nbrgc-sample {runs / name}" in text and f"bin/nbrgc-eval {runs / name}" in text
        assert "rgc-async" in text and "enwik8" in text
    # --no-save writes nothing and names no next commands
    p = subprocess.run(cmd + ["--no-save"], capture_output=True, env=env, timeout=240, cwd=tmp_path)
    assert p.returncode == 0 and b"next:" not in p.stdout and b"sample (40 bytes" in p.stdout
    assert len(list(runs.iterdir())) == 2
    one_line_error(run("train", "--no-save", "--out", tmp_path / "x"))
    one_line_error(run("train", "--sample", "-1"))


def test_tools_without_their_dependencies_say_what_to_install():
    """bin/* before `pip install`: one line naming what is missing and the command, no traceback
    (``-S``: a Python without site-packages, so without numpy and numba)."""
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for tool in ("nbrgc-train", "nbrgc-eval"):
        p = subprocess.run([sys.executable, "-S", os.path.join(root, "bin", tool)],
                           capture_output=True, text=True, timeout=60)
        assert p.returncode == 2, p.stderr
        lines = p.stderr.strip().splitlines()
        assert len(lines) == 1 and "numpy" in lines[0] and "pip install -e ." in lines[0], p.stderr
