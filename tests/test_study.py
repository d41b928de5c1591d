"""nbrgc-study's convergence protocol: the arm table, parsing and one-line errors, the statistics and
convergence figures on constructed inputs, the sweep's choice (and its extension past the grid's
edge), the pairing of seeds, the numerics fingerprint (stable, equal on OpenBLAS's Haswell kernels,
changed by the math), results reused across invocations and recomputed when the fingerprint moves,
an interrupted run resumed, and the command end to end with two child processes. No timing
assertions."""
import importlib
import json
import math
import os
import shlex
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

import nbrgc  # noqa: F401  (thread-safe threading layer first)
from nbrgc.config import TrainConfig, preset
from nbrgc.errors import ConfigError
from nbrgc.measure import study
from nbrgc.measure.study import fingerprint as fp_mod
from nbrgc.measure.study import report as rep_mod

REPO = Path(__file__).resolve().parents[1]
LRS = (1e-3, 2e-3, 4e-3)


def _study(tmp_path, name="s", **kw):
    args = dict(out=str(tmp_path / name), dataset="default", config="tiny", arms=["bp", "rgc-sync"],
                seeds=[0, 1], steps=6, sweep_lrs=LRS, extend_sweep=0, jobs=0, n_stages=2,
                eval_batches=2, test_bytes=600, plot=False, log=lambda m: None)
    args.update(kw)
    return study.Study(**args)


# ------------------------------------------------------------------------------------------ arms
def test_every_arm_maps_to_its_train_config():
    base = dict(batch=4, n_stages=2, warmup_frac=0.1)
    want = {"bp": ("bp", 1, "uniform", "standard"), "rgc-sync": ("rgc-sync", 1, "uniform", "standard"),
            "rgc-async": ("rgc-async", 1, "uniform", "standard"),
            "rgc-async-s0": ("rgc-async", 0, "uniform", "standard"),
            "rgc-async-depthw": ("rgc-async", 1, "depth", "standard"),
            "rgc-async-identity": ("rgc-async", 1, "uniform", "identity"),
            "rgc-async-identity-depthw": ("rgc-async", 1, "depth", "identity"),
            "rgc-async-k2": ("rgc-async", 1, "uniform", "standard"),
            "rgc-async-k8": ("rgc-async", 1, "uniform", "standard"),
            "bp-quarter": ("bp", 1, "uniform", "standard"), "bp-half": ("bp", 1, "uniform", "standard"),
            "pipe": ("pipe-sync", 0, "uniform", "standard"),
            "pipe-stash": ("pipe-sync", 0, "uniform", "standard"),
            "rgc-h1": ("pipe-sync", 1, "uniform", "standard"),
            "rgc-h1-d0": ("pipe-sync", 1, "uniform", "standard"),
            "rgc-hall": ("pipe-sync", 1, "uniform", "standard"),
            "rgc-readout": ("pipe-sync", 1, "uniform", "standard"),
            "bp-muon": ("bp", 1, "uniform", "standard"), "pipe-muon": ("pipe-sync", 0, "uniform", "standard"),
            "rgc-async-muon": ("rgc-async", 1, "uniform", "standard"),
            "pipe-2bw-muon": ("bp", 1, "uniform", "standard")}
    objective = {"pipe": ("all", 0.0, "current"), "pipe-stash": ("all", 0.0, "stashed"),
                 "pipe-muon": ("all", 0.0, "current"),
                 "rgc-h1": ("stage", 1.0, "current"), "rgc-h1-d0": ("stage", 1.0, "current"),
                 "rgc-hall": ("all", 1.0, "current")}
    assert list(study.ARMS) == list(want)
    for arm, (mode, s, cons, init) in want.items():
        tc = study.train_config(arm, base, 3, 2e-3, 200, 8)
        assert (tc.mode, tc.max_staleness, tc.consensus, tc.stage_init) == (mode, s, cons, init)
        assert (tc.seed, tc.lr, tc.steps, tc.eval_every, tc.warmup, tc.batch) == (3, 2e-3, 200, 8, 20, 4)
        assert tc.n_stages == {"bp": 1, "bp-quarter": 1, "bp-half": 1, "bp-muon": 1, "pipe-2bw-muon": 1,
                               "rgc-async-k8": 8}.get(arm, 2)
        h, aux, replay = objective.get(arm, ("0", 1.0, "current"))
        assert (tc.horizon, tc.aux_weight, tc.replay_weights) == (h, aux, replay), arm
        assert tc.boundary_delay == (0 if arm == "rgc-h1-d0" else 1) and tc.delay_warmup == 0
        assert tc.readout_blocks == (1 if arm == "rgc-readout" else 0)
        assert tc.optimizer == ("muon" if arm.endswith("-muon") else "adamw")
        assert tc.grad_delay == (1 if arm == "pipe-2bw-muon" else 0)
    for K in (4, 8):  # an arm's own stage count holds whatever the study's
        assert study.train_config("rgc-async-k2", dict(base, n_stages=K), 0, 1e-3, 200, 8).n_stages == 2
        assert study.train_config("rgc-async", dict(base, n_stages=K), 0, 1e-3, 200, 8).n_stages == K


def test_depth_arms_train_a_fraction_of_the_layers_and_all_leaves_out_what_cannot_run(tmp_path):
    from nbrgc.config import preset
    from nbrgc.measure.study.arms import fits, model_config
    deep, base = preset("deep"), dict(batch=4, n_stages=4)
    assert [model_config(a, deep).n_layer for a in ("bp", "bp-quarter", "bp-half", "rgc-async-k8")] == \
        [24, 6, 12, 24]
    assert model_config("bp-half", deep).d_model == deep.d_model
    tiny = preset("tiny")  # 2 layers: no quarter, no 8 (or 4) stages
    with pytest.raises(ConfigError, match="bp-quarter trains 1/4 .* n_layer 2"):
        model_config("bp-quarter", tiny)
    assert not fits("bp-quarter", tiny, base) and not fits("rgc-async-k8", tiny, base)
    assert fits("bp-half", tiny, base) and fits("rgc-async-k2", tiny, base)
    st = _study(tmp_path, arms=None)
    assert st.arms == [a for a in study.ARMS if a not in ("rgc-async-k8", "bp-quarter")]
    assert st.left_out == ["rgc-async-k8", "bp-quarter"]
    with pytest.raises(ConfigError, match="bp-quarter trains 1/4"):
        _study(tmp_path, name="named", arms=["bp", "bp-quarter"])
    st.fingerprints = {a: "f" for a in st.arms}
    task = st.task("main", "bp-half", 0, 1e-3)  # the half-depth model is what runs and what is keyed
    assert task["model_config"]["n_layer"] == 1 == task["key"]["model_config"]["n_layer"]


def test_parsing_and_its_errors():
    assert study.parse_arms("rgc-async,rgc-sync") == ["bp", "rgc-sync", "rgc-async"]
    assert study.parse_arms("all") is None and study.parse_arms("bp,rgc-async")[0] == "bp"
    for bad, needle in (("rgc-asink", "unknown arm 'rgc-asink'"), ("bp", "at least one RGC arm"),
                        ("rgc-sync,rgc-sync", "twice")):
        with pytest.raises(ConfigError, match=needle):
            study.parse_arms(bad)
    # an arm trained with Muon brings its reference, BP with Muon
    assert study.parse_arms("rgc-async-muon") == ["bp", "bp-muon", "rgc-async-muon"]
    assert study.parse_arms("bp-muon") == ["bp", "bp-muon"]
    assert study.parse_lrs("4e-3, 1e-3,2e-3") == [1e-3, 2e-3, 4e-3]
    for bad, needle in (("1e-3,2e-3", "at least 3"), ("1e-3,x,2e-3", "comma list of numbers"),
                        ("1e-3,0,2e-3", "> 0"), ("1e-3,1e-3,2e-3", "twice"), ("1e-3,nan,2", "finite")):
        with pytest.raises(ConfigError, match=needle):
            study.parse_lrs(bad)
    assert study.parse_seeds("3") == [0, 1, 2] and study.parse_seeds("4,1") == [4, 1]
    for bad in ("0", "-1", "a", "1,1"):
        with pytest.raises(ConfigError):
            study.parse_seeds(bad)


@pytest.mark.parametrize("args, needle", [
    (["--arms", "rgc-asink"], "unknown arm 'rgc-asink'"),
    (["--sweep-lrs", "1e-3,2e-3"], "at least 3 learning rates"),
    (["--sweep-lrs", "1e-3,fast,2e-3"], "--sweep-lrs must be a comma list"),
    (["--sweep-frac", "1.5"], "--sweep-frac"),
    (["--seeds", "0"], "--seeds"),
    (["--jobs", "-1"], "--jobs"),
    (["--phase", "later"], "invalid choice"),
    (["--n-stages", "3"], "n_stages (3) must divide n_layer (2)"),
    (["--config", "huge"], "unknown config preset"),
    (["--dataset", "/nonexistent/enwik.txt"], "no such file"),
])
def test_bad_flags_are_one_line(tmp_path, args, needle):
    p = subprocess.run([sys.executable, str(REPO / "bin" / "nbrgc-study"), "--config", "tiny",
                        "--dataset", "default", "--steps", "2", "--out", str(tmp_path / "s"), *args],
                       capture_output=True, timeout=120, cwd=REPO)
    err = p.stderr.decode(errors="replace").strip()
    assert p.returncode == 2, err
    assert err.startswith("error: ") and "\n" not in err and "Traceback" not in err
    assert needle in err
    assert not (tmp_path / "s" / "results").exists() or not os.listdir(tmp_path / "s" / "results")


# ------------------------------------------------------------------------------------------ statistics
GAPS = [0.004, 0.006, 0.005, 0.003, 0.007]  # mean 0.005, sd 0.0015811, t(0.975, 4) = 2.776445


def _test_bpb(gaps=GAPS, missing=()):
    bp = [1.2, 1.3, 1.25, 1.1, 1.4]
    rg = [None if s in missing else b * (1 + g) for s, (b, g) in enumerate(zip(bp, gaps))]
    return {"bp": bp, "rgc-async": rg}


def test_verdict_known_mean_interval_and_margin():
    v = rep_mod.verdicts(_test_bpb(), list(range(5)), 0.01, 0.95, 2000)["rgc-async"]
    half = 2.7764451051977987 * np.std(GAPS, ddof=1) / math.sqrt(5)
    assert v["n_paired"] == 5 and v["gaps"] == pytest.approx(GAPS)
    assert v["mean_gap"] == pytest.approx(0.005)
    assert v["t_lower"] == pytest.approx(0.005 - half) and v["t_upper"] == pytest.approx(0.005 + half)
    assert v["noninferior"] is True and v["margin"] == 0.01
    hi = v["t_upper"]
    assert rep_mod.verdicts(_test_bpb(), list(range(5)), hi * 0.999, 0.95, 100)["rgc-async"][
        "noninferior"] is False
    assert rep_mod.verdicts(_test_bpb(), list(range(5)), hi * 1.001, 0.95, 100)["rgc-async"][
        "noninferior"] is True
    # the method paper's figures: mean 0.841%, upper bound 2.095% -> not non-inferior at 1%
    worse = rep_mod.verdicts(_test_bpb([0.0, 0.02, 0.005, 0.015, 0.002]), list(range(5)), 0.01, 0.95,
                             100)["rgc-async"]
    assert worse["noninferior"] is False


def test_verdict_pairs_only_seeds_both_have():
    v = rep_mod.verdicts(_test_bpb(missing=(4,)), list(range(5)), 0.01, 0.95, 100)["rgc-async"]
    assert v["seeds"] == [0, 1, 2, 3] and "4 of 5 seeds paired" in v["verdict"]
    none = rep_mod.verdicts({"bp": [1.0, None], "rgc-sync": [None, 1.0]}, [0, 1], 0.01, 0.95, 100)
    assert none["rgc-sync"]["n_paired"] == 0 and none["rgc-sync"]["noninferior"] is False


def test_each_arm_is_judged_against_bp_with_its_own_optimizer():
    bp = [1.2, 1.3, 1.25, 1.1, 1.4]
    muon = [b * 0.9 for b in bp]
    tb = {"bp": bp, "bp-muon": muon, "rgc-async": [b * (1 + g) for b, g in zip(bp, GAPS)],
          "rgc-async-muon": [b * (1 + g) for b, g in zip(muon, GAPS)]}
    v = rep_mod.verdicts(tb, list(range(5)), 0.01, 0.95, 100)
    assert v["rgc-async"]["reference"] == "bp" and v["rgc-async-muon"]["reference"] == "bp-muon"
    assert v["rgc-async-muon"]["mean_gap"] == pytest.approx(0.005)  # not -5.5% against AdamW's bp
    assert v["bp-muon"]["reference"] == "bp" and v["bp-muon"]["mean_gap"] == pytest.approx(-0.1)
    # a report holding no bp-muon (an older study folder) falls back to bp
    alone = rep_mod.verdicts({"bp": bp, "rgc-async-muon": tb["rgc-async-muon"]}, list(range(5)), 0.01,
                             0.95, 100)["rgc-async-muon"]
    assert alone["reference"] == "bp" and alone["mean_gap"] == pytest.approx(-0.0955, abs=1e-3)


def test_convergence_on_a_hand_made_curve():
    tokens = [100, 200, 300, 400, 500]
    vals = [3.0, 2.5, 2.2, 2.1, 2.0]
    assert study.value_at(tokens, vals, 400) == 2.1
    assert study.value_at(tokens, vals, 350) == pytest.approx(2.15)
    assert study.value_at(tokens, vals, 50) == 3.0
    # 80% of 500 tokens is 400: (2.1 - 2.0) / 2.1
    assert study.last20_rel_improvement(tokens, vals) == pytest.approx(0.1 / 2.1)
    c = study.convergence([(tokens, vals), (tokens, [3.0, 2.5, 2.2, 2.01, 2.0])])
    assert c["bp_last20_rel_improvement"] == pytest.approx((0.1 / 2.1 + 0.01 / 2.01) / 2)
    assert c["converged"] is False and "not converged" in c["note"] and "--tokens" in c["note"]
    flat = study.convergence([([10, 20, 30, 40, 50], [2.0, 1.9, 1.85, 1.849, 1.845])])
    assert flat["converged"] is True and flat["bp_last20_rel_improvement"] == pytest.approx(0.004 / 1.849)


# ------------------------------------------------------------------------------------------ the sweep
def _fake_result(st, task, val, diverged=False):
    os.makedirs(os.path.dirname(task["result"]), exist_ok=True)
    with open(task["result"], "w") as f:
        json.dump({"key": task["key"], "lr": task["lr"], "val_bpb": None if diverged else val,
                   "diverged": diverged}, f)


def test_sweep_picks_each_arms_best_lr_and_extends_past_an_edge(tmp_path):
    st = _study(tmp_path, extend_sweep=2)
    st.data_id = st.data_key()
    st.fingerprints = {a: "f" for a in st.arms}
    sweep = lambda arm, lr: st.task("sweep", arm, 0, lr)  # noqa: E731
    for lr, v in zip(LRS, (3.0, 2.8, 2.9)):
        _fake_result(st, sweep("bp", lr), v)
    for lr, v in zip(LRS, (3.0, 2.9, 2.7)):  # best at the top edge
        _fake_result(st, sweep("rgc-sync", lr), v)
    assert st.sweep_state("bp")[2:] == (2e-3, False)
    grid, res, best, _ = st.sweep_state("rgc-sync")
    assert grid == [1e-3, 2e-3, 4e-3, 8e-3] and best is None and res[8e-3] is None
    tasks, best = st.tasks()
    assert [(t["phase"], t["arm"], t["lr"]) for t in tasks if t["phase"] == "sweep"][-1] == (
        "sweep", "rgc-sync", 8e-3)
    assert best == {"bp": 2e-3, "rgc-sync": None}
    assert [(t["arm"], t["seed"], t["lr"]) for t in tasks if t["phase"] == "main"] == [
        ("bp", 0, 2e-3), ("bp", 1, 2e-3)]  # rgc-sync's main runs wait for its sweep
    _fake_result(st, sweep("rgc-sync", 8e-3), 2.6, diverged=True)  # diverged: never the best
    assert st.sweep_state("rgc-sync")[2:] == (4e-3, False)
    tasks, _ = st.tasks()
    assert [(t["arm"], t["seed"]) for t in tasks if t["phase"] == "main"] == [
        ("bp", 0), ("rgc-sync", 0), ("bp", 1), ("rgc-sync", 1)]  # seed by seed, every arm together
    # without extension the edge stays and is reported as such
    st0 = _study(tmp_path, extend_sweep=0)
    st0.data_id, st0.fingerprints = st.data_id, st.fingerprints
    assert st0.sweep_state("rgc-sync")[2:] == (4e-3, True)


# ------------------------------------------------------------------------------------------ fingerprint
def test_fingerprint_is_stable_and_moves_with_the_math():
    mcfg = preset("tiny")
    tc = study.train_config("rgc-async", dict(batch=4, n_stages=2), 0, 1e-3, 100, 10)
    f = fp_mod.scheme_fingerprint
    ref = f(mcfg, tc)
    assert f(mcfg, tc) == ref and len(ref) == 16
    assert f(mcfg, replace(tc, lr=5e-3, seed=3, eval_every=7)) == ref  # not the numerics: in the key
    changed = [replace(tc, max_staleness=2), replace(tc, mode="rgc-sync"), replace(tc, grad_clip=0.5),
               replace(tc, min_lr_frac=0.2), replace(tc, warmup=10), replace(tc, weight_decay=0.0),
               replace(tc, beta2=0.99)]
    fps = [f(mcfg, c) for c in changed]
    assert len(set(fps + [ref])) == len(fps) + 1
    assert f(replace(mcfg, d_model=48, n_head=3), tc) != ref


def _variants_landed():
    local = importlib.import_module("nbrgc.local")
    return hasattr(local, "identity_init") and hasattr(local, "consensus_weights")


@pytest.mark.skipif(not _variants_landed(), reason="consensus='depth' / stage_init='identity' not "
                    "implemented yet (nbrgc.local.consensus_weights, identity_init)")
def test_fingerprint_tells_the_variants_apart():
    mcfg = preset("tiny")
    base = dict(batch=4, n_stages=2)
    fps = {a: fp_mod.scheme_fingerprint(mcfg, study.train_config(a, base, 0, 1e-3, 100, 10))
           for a in ("rgc-async", "rgc-async-depthw", "rgc-async-identity", "rgc-async-identity-depthw")}
    assert len(set(fps.values())) == 4


def test_fingerprint_is_the_same_on_openblas_haswell_kernels():
    code = ("import nbrgc; from nbrgc.measure.study import fingerprint as f, train_config; "
            "from nbrgc.config import preset; m = preset('small'); "
            "print(*[f.scheme_fingerprint(m, train_config(a, dict(batch=16, n_stages=4), 0, 1e-3, 500,"
            " 20)) for a in ('bp', 'rgc-async')])")
    outs = []
    for env in ({}, {"OPENBLAS_CORETYPE": "Haswell"}):
        p = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=300, cwd=REPO,
                           env=dict(os.environ, **env))
        assert p.returncode == 0, p.stderr.decode()[-2000:]
        outs.append(p.stdout.decode().split())
    assert outs[0] == outs[1] and len(outs[0]) == 2


# ------------------------------------------------------------------------------------------ runs
def test_same_seed_same_batches_and_init_for_every_arm(tmp_path, monkeypatch):
    import nbrgc.data as data_mod
    import nbrgc.model as model_mod
    drawn, inits = [], []

    class Recording(data_mod.Batches):
        def next(self):
            x, y = super().next()
            drawn.append((self.seed, x.tobytes()))
            return x, y

    class RecordingModel(model_mod.Model):
        def init_weights(self, seed):
            super().init_weights(seed)
            inits.append((seed, self.flat.tobytes()))

    monkeypatch.setattr(data_mod, "Batches", Recording)
    monkeypatch.setattr(importlib.import_module("nbrgc.trainer"), "Model", RecordingModel)
    st = _study(tmp_path, arms=["bp", "rgc-sync", "rgc-async"], steps=4, phase="sweep")
    monkeypatch.setattr(fp_mod, "scheme_fingerprint", lambda m, tc: "fixed-" + tc.mode)  # no float64 models
    st.run()
    # sweep: 3 arms x 3 lrs on seed 0, 1 step each (4 * 0.25)
    assert len(drawn) == 9 and len(inits) == 9
    assert len({d for d in drawn}) == 1 and len({i for i in inits}) == 1
    # another seed draws other batches and another init; the sweep stays on seed 0 whatever
    # --seeds lists, so an invocation for later seeds alone finds it and runs their main runs
    st2 = _study(tmp_path, arms=["bp", "rgc-sync"], steps=4, phase="main", seeds=[1])
    st2.run()
    tasks = st2.tasks()[0]
    assert len(tasks) == 2 and all(t["phase"] == "main" and t["seed"] == 1 for t in tasks)
    assert all(st2.result(t) is not None for t in tasks)
    seed1 = [d for d in drawn if d[0] == 1]
    assert seed1 and seed1[0][1] != drawn[0][1] and inits[-1][1] != inits[0][1]


def _results(out):
    return {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in Path(out, "results").glob("*.json")}


def test_results_reused_and_recomputed_when_the_numerics_change(tmp_path, monkeypatch):
    st = _study(tmp_path, seeds=[0])
    rep = st.run()
    assert len(rep["computed_this_call"]) == 8 and rep["runs"] == {"done": 8, "known": 8}
    before = _results(st.out)
    rep2 = _study(tmp_path, seeds=[0]).run()
    assert rep2["computed_this_call"] == [] and _results(st.out) == before
    assert rep2["arms"]["rgc-sync"]["test_bpb"] == rep["arms"]["rgc-sync"]["test_bpb"]
    real = fp_mod.scheme_fingerprint
    monkeypatch.setattr(fp_mod, "scheme_fingerprint",
                        lambda m, tc: real(m, tc) + ("x" if tc.mode == "rgc-sync" else ""))
    rep3 = _study(tmp_path, seeds=[0]).run()
    assert sorted(rep3["computed_this_call"]) == sorted(n[:-5] for n in before if "rgc-sync" in n)
    assert rep3["code_version"] != rep["code_version"]
    after = _results(st.out)
    assert {n: v for n, v in after.items() if "rgc-sync" not in n} == {
        n: v for n, v in before.items() if "rgc-sync" not in n}


def test_a_run_refuses_code_that_computes_differently(tmp_path):
    from nbrgc.errors import NbrgcError
    from nbrgc.measure.study.runner import run_one
    st = _study(tmp_path)
    st.data_id = st.data_key()
    st.fingerprints = st.compute_fingerprints()
    good = st.task("sweep", "rgc-sync", 0, 1e-3)
    st.fingerprints = {a: "0" * 16 for a in st.arms}  # as if the code changed after the study began
    bad = st.task("sweep", "rgc-sync", 0, 1e-3)
    with pytest.raises(NbrgcError, match="computes differently"):
        run_one(dict(bad, dataset_obj=st.data()), log=lambda m: None)
    assert not os.path.exists(bad["result"]) and not os.path.exists(os.path.join(bad["work"], "run.json"))
    assert run_one(dict(good, dataset_obj=st.data()), log=lambda m: None)["val_bpb"] > 0


def test_interrupted_run_resumes_where_it_stopped(tmp_path, monkeypatch):
    Trainer = importlib.import_module("nbrgc.trainer").Trainer
    common = dict(seeds=[0], steps=8, eval_every=4, phase="sweep", sweep_frac=1.0)
    ref = _study(tmp_path, name="ref", **common).run()
    real_emit = Trainer.emit

    def stop_at_4(self, rec):  # a SIGTERM arriving during the first evaluation of the first run
        real_emit(self, rec)
        if rec.get("step") == 4 and "val_bpb" in rec:
            self.request_stop("received SIGTERM")
    monkeypatch.setattr(Trainer, "emit", stop_at_4)
    st = _study(tmp_path, name="cut", **common)
    with pytest.raises(study.StudyInterrupted):
        st.run()
    assert _results(st.out) == {}
    cut = json.loads(Path(st.out, "study.json").read_text())  # the partial report is readable
    assert cut["runs"]["done"] == 0 and cut["verdicts"]["rgc-sync"]["n_paired"] == 0
    monkeypatch.setattr(Trainer, "emit", real_emit)
    rep = _study(tmp_path, name="cut", **common).run()
    # the first run the plan starts: bp at the grid's middle rate
    first = json.loads(Path(st.out, "results", "sweep-bp-s0-lr0.002.json").read_text())
    assert first["resumed"] is True and [p[0] for p in first["curve"]] == [4, 8]
    assert rep["arms"]["bp"]["sweep"]["val_bpb"] == ref["arms"]["bp"]["sweep"]["val_bpb"]
    assert rep["arms"]["rgc-sync"]["sweep"]["val_bpb"] == ref["arms"]["rgc-sync"]["sweep"]["val_bpb"]


def test_a_partial_invocation_reports_the_whole_folder(tmp_path):
    """An invocation naming some arms and seeds (the confirmation seeds of one arm) rewrites
    study.md: the report still covers every arm and seed the folder reported before, and its
    command names them all (the phase left to its default), so running it continues the study."""
    _study(tmp_path, seeds=[0], command="bin/nbrgc-study --config tiny --arms rgc-sync --seeds 1").run()
    st = _study(tmp_path, arms=["bp"], seeds=[0, 1],
                command="bin/nbrgc-study --config tiny --arms bp --seeds 2 --phase main")
    rep = st.run()
    assert list(rep["arms"]) == ["bp", "rgc-sync"] and rep["seeds"] == [0, 1]
    assert rep["arms"]["rgc-sync"]["test_bpb"][0] is not None
    assert rep["arms"]["rgc-sync"]["test_bpb"][1] is None and rep["arms"]["bp"]["test_bpb"][1] is not None
    cmd = shlex.split(rep["command"])
    assert cmd[cmd.index("--arms") + 1] == "rgc-sync" and cmd[cmd.index("--seeds") + 1] == "2"
    assert "--phase" not in cmd and cmd[:3] == ["bin/nbrgc-study", "--config", "tiny"]
    assert st.arms == ["bp"] and st.seeds == [0, 1]  # the invocation's own scope is unchanged
    # another study in the same folder (another budget) is not merged
    rep = _study(tmp_path, arms=["bp"], seeds=[0], steps=7).run()
    assert list(rep["arms"]) == ["bp"]


def test_study_end_to_end_with_two_jobs(tmp_path):
    out = tmp_path / "study"
    argv = [sys.executable, str(REPO / "bin" / "nbrgc-study"), "--config", "tiny", "--dataset",
            "default", "--arms", "rgc-async", "--seeds", "2", "--steps", "8", "--eval-every", "4",
            "--sweep-lrs", "1e-3,2e-3,4e-3", "--extend-sweep", "0", "--n-stages", "2",
            "--eval-batches", "2", "--test-bytes", "600", "--jobs", "2", "--out", str(out)]
    p = subprocess.run(argv, capture_output=True, timeout=600, cwd=REPO)
    err = p.stderr.decode()
    assert p.returncode == 0, err[-3000:]
    assert err.count(" start ") == 10 and err.count(" finished ") == 10 and "ETA" in err
    rep = json.loads((out / "study.json").read_text())
    for k in ("dataset", "config", "tokens_per_run", "seeds", "code_version", "arms", "convergence",
              "verdicts"):
        assert k in rep
    assert rep["tokens_per_run"] == 8 * 4 * 16 and rep["seeds"] == [0, 1]
    assert isinstance(rep["code_version"], str) and set(rep["arms"]) == {"bp", "rgc-async"}
    for arm, e in rep["arms"].items():
        assert e["lr"] in LRS and len(e["test_bpb"]) == 2 and all(v > 0 for v in e["test_bpb"])
        assert e["curve"]["tokens"] == [256, 512] and len(e["curve"]["val_bpb"]) == 2
        assert e["lr"] == e["sweep"]["lrs"][int(np.argmin(e["sweep"]["val_bpb"]))]
        assert all(len(c) == 2 for c in e["curve"]["val_bpb"])
    v = rep["verdicts"]["rgc-async"]
    assert set(v) >= {"mean_gap", "t_lower", "t_upper", "margin", "noninferior"}
    bp, rg = rep["arms"]["bp"]["test_bpb"], rep["arms"]["rgc-async"]["test_bpb"]
    assert v["mean_gap"] == pytest.approx(np.mean([(r - b) / b for r, b in zip(rg, bp)]))
    assert v["noninferior"] == (v["t_upper"] < v["margin"])
    c = rep["convergence"]["bp_last20_rel_improvement"]
    assert c == pytest.approx(np.mean([study.last20_rel_improvement([256, 512], cv)
                                       for cv in rep["arms"]["bp"]["curve"]["val_bpb"]]))
    md = (out / "study.md").read_text()
    assert "### Learning-rate sweep" in md and "| rgc-async |" in md and "bin/nbrgc-study" in md
    assert len(list((out / "results").glob("*.json"))) == 10
    before = _results(out)
    p = subprocess.run(argv, capture_output=True, timeout=600, cwd=REPO)
    assert p.returncode == 0 and " start " not in p.stderr.decode()
    assert _results(out) == before
    assert json.loads((out / "study.json").read_text())["computed_this_call"] == []
    # --report-only rebuilds the same report from results/ and runs nothing, with one arm fewer
    # nothing else changes: every result names the machine it was made on
    assert all("machine" in json.loads(f.read_text()) for f in (out / "results").glob("*.json"))
    full = json.loads((out / "study.json").read_text())
    (out / "study.md").unlink()
    p = subprocess.run(argv + ["--report-only"], capture_output=True, timeout=600, cwd=REPO)
    assert p.returncode == 0 and " start " not in p.stderr.decode(), p.stderr.decode()[-2000:]
    assert _results(out) == before
    again = json.loads((out / "study.json").read_text())
    assert again["arms"] == full["arms"] and again["verdicts"] == full["verdicts"]
    assert "--report-only" not in again["command"] and (out / "study.md").exists()
    assert sum(again["run_machines"].values()) == 10
    for e in again["arms"].values():  # throughput: the median of the runs on the speed machine
        assert e["train_tokens_per_s"] == e["train_tokens_per_s_by_machine"][again["speed_machine"]]["median"]


def test_throughput_compares_arms_on_one_machine():
    """A study's runs may span machines whose speeds differ more than the arms' do: the machine's BLAS
    libraries in any order are one machine, and the column compares arms on the one with most runs."""
    from nbrgc.measure.machine import machine_key
    from nbrgc.measure.study.report import _speed_machine
    a = "AMD EPYC, 2 usable, BLAS: openblas 0.3.31 SkylakeX kernel [nbrgc]; openblas 0.3.30 SkylakeX kernel [scipy]"
    b = "AMD EPYC, 2 usable, BLAS: openblas 0.3.30 SkylakeX kernel [scipy]; openblas 0.3.31 SkylakeX kernel [nbrgc]"
    assert machine_key(a) == machine_key(b) != machine_key(a.replace("SkylakeX", "Haswell"))
    assert machine_key(None).startswith("not recorded")
    speeds = {"bp": {"zen3": [3000.0], "zen4": [6000.0, 7300.0]}, "rgc-async": {"zen3": [2800.0], "zen4": [6500.0]}}
    assert _speed_machine(speeds) == "zen4" and _speed_machine({}) is None


def test_twin_arms_are_computed_once_and_train_the_same_bits(tmp_path):
    """rgc-async-s0 and rgc-sync have one fingerprint at one thread: the study runs rgc-sync's runs
    and copies them, and a study of rgc-async-s0 alone (no twin to copy from) trains the same bits."""
    kw = dict(seeds=[0], phase="sweep", threads=1)
    st = _study(tmp_path, name="both", arms=["bp", "rgc-sync", "rgc-async-s0"], **kw)
    rep = st.run()
    assert st.twin_of("rgc-async-s0") == "rgc-sync" and st.twin_of("rgc-sync") is None
    assert not any("rgc-async-s0" in n for n in rep["computed_this_call"])
    res = {p.name: json.loads(p.read_text()) for p in Path(st.out, "results").glob("*.json")}
    for lr in ("0.001", "0.002", "0.004"):
        copy, src = res[f"sweep-rgc-async-s0-s0-lr{lr}.json"], res[f"sweep-rgc-sync-s0-lr{lr}.json"]
        assert copy["twin_of"] == "rgc-sync" and copy["val_bpb"] == src["val_bpb"]
    assert _study(tmp_path, name="x", arms=["rgc-sync", "rgc-async-s0"], **dict(kw, threads=2)).twin_of(
        "rgc-async-s0") is None  # other thread groups: not the same calls
    alone = _study(tmp_path, name="alone", arms=["bp", "rgc-async-s0"], **kw).run()
    assert alone["arms"]["rgc-async-s0"]["sweep"]["val_bpb"] == rep["arms"]["rgc-async-s0"]["sweep"]["val_bpb"]


# ------------------------------------------------------------------------------------------ stored keys
def _stored_studies():
    return sorted(p for p in (REPO / "benchmarks" / "studies").glob("*/study.json")
                  if any((p.parent / "results").glob("*.json")))


@pytest.mark.skipif(not _stored_studies(), reason="no study results in benchmarks/studies/")
@pytest.mark.parametrize("report", _stored_studies(), ids=lambda p: p.parent.name)
def test_stored_results_have_the_keys_this_code_computes(report):
    """A long study reuses its result files by key: the study rebuilt from its recorded command by
    this code computes, for every stored run, the very key (numerics fingerprint included) and file
    name stored. A refactor or a TrainConfig field that moves a key would silently recompute every
    run; this catches it."""
    from nbrgc.cli.study import build_study
    rep = json.loads(report.read_text())
    st = build_study(shlex.split(rep["command"])[1:])
    if not os.path.exists(st.dataset):
        pytest.skip(f"the study's dataset {st.dataset} is not on this machine")
    st.data_id = st.data_key()
    assert st.data_id == rep["data"]
    stored = {p.name: json.loads(p.read_text()) for p in sorted((report.parent / "results").glob("*.json"))}
    arms = sorted({r["arm"] for r in stored.values()})
    st.fingerprints = st.compute_fingerprints(arms)
    for name, res in stored.items():
        task = st.task(res["phase"], res["arm"], res["seed"], res["lr"])
        assert json.loads(json.dumps(task["key"])) == res["key"], name
        assert os.path.basename(task["result"]) == name
        assert st.result(task) is not None, name


@pytest.mark.parametrize("flag", ["--report-only", "--report-on", "--rep"])
def test_report_only_is_read_from_the_parsed_flags(tmp_path, flag):
    """argparse accepts an abbreviation of --report-only; the study must report only for it too,
    and record a command that runs the study."""
    from nbrgc.cli.study import build_study
    argv = ["--config", "tiny", "--dataset", "default", "--arms", "rgc-async", "--out", str(tmp_path)]
    st = build_study(argv + [flag])
    assert st.only_report and flag not in st.command.split()
    assert not build_study(argv).only_report
