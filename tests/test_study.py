"""nbrgc-study: the statistics wiring on constructed results (known mean and CI, the verdict flipping
at the margin), the pairing (same seed -> same batches and init for every method), the command end
to end on ``tiny``, the cache (a second call trains nothing and rewrites no result), resuming an
interrupted run, and one-line errors. No timing assertions."""
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import nbrgc  # noqa: F401  (thread-safe threading layer first)
from nbrgc import study
from nbrgc.cli.study import main as study_main
from nbrgc.config import preset
from nbrgc.errors import ConfigError

REPO = Path(__file__).resolve().parents[1]
TINY = ["--config", "tiny", "--threads", "1", "--n-stages", "2"]


# ------------------------------------------------------------------------------------------ statistics
GAPS = [0.004, 0.006, 0.005, 0.003, 0.007]  # mean 0.005, sd 0.0015811, t(0.975, 4) = 2.776445


def _constructed(gaps=GAPS, method="rgc-async"):
    bp = [1.2, 1.3, 1.25, 1.1, 1.4]
    bpb = {}
    for s, (b, g) in enumerate(zip(bp, gaps)):
        bpb[("bp", s)] = b
        bpb[(method, s)] = b * (1 + g)
    return bpb


def test_compare_known_mean_and_interval():
    c = study.compare(_constructed(), ["bp", "rgc-async"], list(range(5)), margin=0.01)["rgc-async"]
    half = 2.7764451051977987 * np.std(GAPS, ddof=1) / math.sqrt(5)
    assert c["n"] == 5 and c["seeds"] == [0, 1, 2, 3, 4]
    assert c["gaps"] == pytest.approx(GAPS)
    assert c["mean_gap"] == pytest.approx(0.005)
    assert c["t_lo"] == pytest.approx(0.005 - half) and c["t_hi"] == pytest.approx(0.005 + half)
    assert c["boot_lo"] <= 0.005 <= c["boot_hi"]
    assert c["non_inferior"] is True and "non-inferior" in c["verdict"]


def test_verdict_flips_at_the_margin():
    bpb = _constructed()
    hi = study.compare(bpb, ["bp", "rgc-async"], list(range(5)))["rgc-async"]["t_hi"]
    above = study.compare(bpb, ["bp", "rgc-async"], list(range(5)), margin=hi * 1.001)["rgc-async"]
    below = study.compare(bpb, ["bp", "rgc-async"], list(range(5)), margin=hi * 0.999)["rgc-async"]
    assert above["non_inferior"] is True
    assert below["non_inferior"] is False and "not shown non-inferior" in below["verdict"]
    # the study's own figures: mean 0.841%, upper bound 2.095% -> not non-inferior at 1%
    worse = study.compare(_constructed([0.0, 0.02, 0.005, 0.015, 0.002]), ["bp", "rgc-async"],
                          list(range(5)), margin=0.01)["rgc-async"]
    assert worse["non_inferior"] is False


def test_compare_pairs_only_seeds_both_have():
    bpb = _constructed()
    del bpb[("rgc-async", 4)]
    c = study.compare(bpb, ["bp", "rgc-async", "rgc-sync"], list(range(5)))
    assert c["rgc-async"]["seeds"] == [0, 1, 2, 3]
    assert c["rgc-sync"]["n"] == 0 and c["rgc-sync"]["non_inferior"] is False


def test_markdown_from_constructed_report():
    bpb = _constructed()
    runs = [{"method": m, "seed": s, "val_bpb": v, "train_tokens_per_s": 100.0, "wall_s": 1.0}
            for (m, s), v in bpb.items()]
    rep = {"settings": {"config": "tiny", "model": preset("tiny").to_dict(), "dataset": "default",
                        "tokens": 640, "steps": 10, "batch": 4, "seq": 16, "methods": ["bp", "rgc-async"],
                        "seeds": list(range(5)), "margin": 0.01},
           "machine_line": "m", "runs": runs, "computed": [], "cached": [],
           "comparisons": study.compare(bpb, ["bp", "rgc-async"], list(range(5)))}
    md = study.markdown(rep)
    assert "| 0 | 1.2000 | 1.2048 | +0.400% |" in md
    assert "+0.500%" in md and "non-inferior at 1.00% margin" in md


# ------------------------------------------------------------------------------------------ parsing, keys
def test_parsing():
    assert study.parse_methods("rgc-async,bp") == ["bp", "rgc-async"]
    for bad in ("rgc-async", "bp", "bp,xx", "bp,rgc-async,bp"):
        with pytest.raises(ConfigError):
            study.parse_methods(bad)
    assert study.parse_seeds("3") == [0, 1, 2] and study.parse_seeds("4,1") == [4, 1]
    for bad in ("0", "-1", "a", "1,1"):
        with pytest.raises(ConfigError):
            study.parse_seeds(bad)


def test_run_key_covers_what_changes_a_result():
    mcfg = preset("tiny")
    base = dict(steps=10, batch=4, warmup=0, eval_every=5, n_stages=2, log_every=10, keep=1)
    k = lambda m="rgc-async", s=0, **kw: study.run_key(  # noqa: E731
        m, s, mcfg, study.train_config(m, s, dict(base, **kw)), "default", (100, 10))
    ids = {study.run_id(k()), study.run_id(k(s=1)), study.run_id(k(m="bp")), study.run_id(k(steps=11)),
           study.run_id(k(lr=2e-3))}
    assert len(ids) == 5
    assert study.run_id(k(log_every=3, keep=2)) == study.run_id(k())  # cosmetic fields
    # the worker count and the attention memory mode give the same bits: a finished run is reused
    assert study.run_id(k(stage_workers=1, attention="recompute")) == study.run_id(k())
    assert k()["budget"] == {"steps": 10, "tokens": 10 * 4 * 16}
    assert study.run_id(k()).startswith("rgc-async-s0-")


def test_read_curve_keeps_the_last_record_of_a_step(tmp_path):
    log = tmp_path / "log.jsonl"
    log.write_text("\n".join(json.dumps(r) for r in [
        {"step": 2, "val_bpb": 5.0}, {"step": 2, "loss": 1.0}, {"step": 4, "val_bpb": 4.0},
        {"step": 2, "val_bpb": 4.9}, {"summary": True, "step": 4, "val_bpb": 4.0}]) + "\n{cut")
    assert study.read_curve(log, 10) == [[2, 20, 4.9], [4, 40, 4.0]]


# ------------------------------------------------------------------------------------------ pairing
def test_same_seed_same_batches_and_init_for_every_method(tmp_path, monkeypatch):
    import nbrgc.data as data_mod
    import nbrgc.model as model_mod
    drawn, inits = [], []

    class Recording(data_mod.Batches):
        def next(self):
            x, y = super().next()
            drawn.append((self.seed, x.tobytes(), y.tobytes()))
            return x, y

    class RecordingModel(model_mod.Model):
        def init_weights(self, seed):
            super().init_weights(seed)
            inits.append((seed, self.flat.tobytes()))

    monkeypatch.setattr(data_mod, "Batches", Recording)
    import importlib
    monkeypatch.setattr(importlib.import_module("nbrgc.trainer"), "Model", RecordingModel)
    st = study.Study(config="tiny", methods=["bp", "rgc-async", "rgc-sync"], seeds=[0, 1], steps=2,
                     out=str(tmp_path / "s"), n_stages=2, threads=1, log=lambda m: None)
    st.run()
    assert len(drawn) == 3 * 2 * 2 and len(inits) == 6
    by_run = [drawn[i:i + 2] for i in range(0, len(drawn), 2)]  # runs go seed by seed, bp first
    for s in range(2):
        runs = by_run[3 * s:3 * s + 3]
        assert all(b[0][0] == s for b in runs)
        assert runs[0] == runs[1] == runs[2]            # same batches, in the same order
        assert len({i[1] for i in inits[3 * s:3 * s + 3]}) == 1  # same initial weights
    assert by_run[0] != by_run[3] and inits[0][1] != inits[3][1]  # seeds differ


# ------------------------------------------------------------------------------------------ end to end
def _result_files(out):
    return sorted(Path(out, "runs").glob("*/result.json"))


def test_study_end_to_end_and_cache(tmp_path, capsys):
    out = tmp_path / "study"
    argv = TINY + ["--methods", "bp,rgc-async", "--seeds", "2", "--steps", "4", "--eval-every", "2",
                   "--out", str(out), "--plot"]
    assert study_main(argv) == 0
    text = capsys.readouterr().out
    assert "| seed | bp val bpb | rgc-async val bpb | Δ rgc-async |" in text
    assert "| rgc-async | 2 |" in text and "trained 4 run(s) and reused 0" in text
    rep = json.loads((out / "study.json").read_text())
    assert rep["settings"]["tokens"] == 4 * 4 * 16 and rep["settings"]["seeds"] == [0, 1]
    assert len(rep["computed"]) == 4 and rep["cached"] == []
    c = rep["comparisons"]["rgc-async"]
    runs = {(r["method"], r["seed"]): r for r in rep["runs"]}
    gaps = [(runs[("rgc-async", s)]["val_bpb"] - runs[("bp", s)]["val_bpb"]) / runs[("bp", s)]["val_bpb"]
            for s in (0, 1)]
    assert c["gaps"] == pytest.approx(gaps) and c["mean_gap"] == pytest.approx(sum(gaps) / 2)
    assert isinstance(c["non_inferior"], bool) and c["verdict"]
    for r in rep["runs"]:
        assert r["tokens"] == 256 and [p[0] for p in r["curve"]] == [2, 4]
        assert r["curve"][-1][2] == pytest.approx(r["val_bpb"])
    files = _result_files(out)
    assert len(files) == 4
    before = {f: (f.stat().st_mtime_ns, f.read_bytes()) for f in files}
    logs = {f: f.stat().st_size for f in Path(out, "runs").glob("*/log.jsonl")}

    assert study_main(argv) == 0  # the second call computes nothing
    text2 = capsys.readouterr().out
    assert "trained 0 run(s) and reused 4 cached" in text2
    rep2 = json.loads((out / "study.json").read_text())
    assert rep2["computed"] == [] and len(rep2["cached"]) == 4
    assert rep2["comparisons"]["rgc-async"]["gaps"] == c["gaps"]
    assert {f: (f.stat().st_mtime_ns, f.read_bytes()) for f in _result_files(out)} == before
    assert {f: f.stat().st_size for f in Path(out, "runs").glob("*/log.jsonl")} == logs

    # one more seed: only its two runs are trained
    assert study_main(TINY + ["--methods", "bp,rgc-async", "--seeds", "3", "--steps", "4",
                              "--eval-every", "2", "--out", str(out)]) == 0
    rep3 = json.loads((out / "study.json").read_text())
    assert len(rep3["computed"]) == 2 and len(rep3["cached"]) == 4
    assert {r["seed"] for r in rep3["runs"] if r["run_dir"] in rep3["computed"]} == {2}


def test_interrupted_run_resumes(tmp_path, monkeypatch):
    import importlib
    Trainer = importlib.import_module("nbrgc.trainer").Trainer
    common = dict(config="tiny", methods=["bp", "rgc-async"], seeds=[0], steps=6, eval_every=3,
                  n_stages=2, threads=1, log=lambda m: None)
    ref = study.Study(out=str(tmp_path / "ref"), **common).run()
    ref_bpb = {r["method"]: r["val_bpb"] for r in ref["runs"]}

    real_emit = Trainer.emit

    def stop_at_3(self, rec):  # a SIGINT arriving during the first evaluation of the first run
        real_emit(self, rec)
        if rec.get("step") == 3 and "val_bpb" in rec:
            self.request_stop("received SIGINT")
    monkeypatch.setattr(Trainer, "emit", stop_at_3)
    out = str(tmp_path / "cut")
    with pytest.raises(study.StudyInterrupted, match="bp seed 0 checkpointed at step 3"):
        study.Study(out=out, **common).run()
    assert _result_files(out) == []
    monkeypatch.setattr(Trainer, "emit", real_emit)
    rep = study.Study(out=out, **common).run()
    runs = {r["method"]: r for r in rep["runs"]}
    assert runs["bp"]["resumed"] is True and runs["rgc-async"]["resumed"] is False
    assert runs["bp"]["val_bpb"] == pytest.approx(ref_bpb["bp"], rel=1e-6)
    assert [p[0] for p in runs["bp"]["curve"]] == [3, 6]


def test_study_rejects_a_mismatched_cached_result(tmp_path):
    out = str(tmp_path / "s")
    common = dict(config="tiny", methods=["bp", "rgc-sync"], seeds=[0], steps=2, n_stages=2,
                  threads=1, log=lambda m: None, out=out)
    study.Study(**common).run()
    (f,) = [p for p in _result_files(out) if p.parent.name.startswith("bp-")]
    res = json.loads(f.read_text())
    res["key"]["seed"] = 99  # a result that is not this run's
    f.write_text(json.dumps(res))
    rep = study.Study(**common).run()
    assert rep["computed"] == [f.parent.name]
    val = {r["method"]: r["val_bpb"] for r in rep["runs"]}
    # finished, but stopped before result.json was written: its final evaluation is reused
    f.unlink()
    rep = study.Study(**common).run()
    assert rep["computed"] == [f.parent.name] and json.loads(f.read_text())["resumed"] is True
    assert {r["method"]: r["val_bpb"] for r in rep["runs"]} == val


@pytest.mark.parametrize("args, needle", [
    (["--methods", "rgc-async"], "must include bp"),
    (["--seeds", "0"], "--seeds"),
    (["--n-stages", "3"], "n_stages (3) must divide n_layer (2)"),
    (["--dataset", "/nonexistent/enwik.txt"], ""),
    (["--margin", "-0.1"], "margin"),
    (["--config", "huge"], "unknown config preset"),
])
def test_study_bad_input_is_one_line(tmp_path, args, needle):
    p = subprocess.run([sys.executable, str(REPO / "bin" / "nbrgc-study"), *TINY, "--steps", "1",
                        "--out", str(tmp_path / "s"), *args], capture_output=True, timeout=120, cwd=REPO)
    err = p.stderr.decode(errors="replace").strip()
    assert p.returncode == 2, err
    assert err.startswith("error: ") and "\n" not in err and "Traceback" not in err
    assert needle in err
    assert not os.path.exists(tmp_path / "s" / "runs") or not os.listdir(tmp_path / "s" / "runs")
