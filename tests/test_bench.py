"""nbrgc-bench: the figures' arithmetic on constructed inputs (FLOPs formula, per-round ratios,
aggregation, run order), the command end to end on ``tiny``, its one-line errors, the machine
description, and the PyTorch peer (skipped without torch). No timing assertions."""
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

import nbrgc  # noqa: F401  (thread-safe threading layer first)
from nbrgc.measure import bench
from nbrgc.config import preset
from nbrgc.errors import ConfigError

REPO = Path(__file__).resolve().parents[1]


def _run_bin(*args, timeout=300):
    return subprocess.run([sys.executable, str(REPO / "bin" / "nbrgc-bench"), *map(str, args)],
                          capture_output=True, timeout=timeout, cwd=REPO,
                          env=dict(os.environ, PYTHONUNBUFFERED="1"))


# ------------------------------------------------------------------------------------------ arithmetic
def test_flops_formula_by_hand():
    cfg = preset("tiny")  # L2 d32 H2 ctx16 V256
    d, V, L, T = 32, 256, 2, 16
    per_block = 12 * d * d + 13 * d
    decoder = 2 * d + d * V + V
    N = L * per_block + decoder
    assert bench.non_embedding_params(cfg) == N
    assert bench.flops_per_token(cfg, T) == 6 * N + 6 * L * T * d
    assert bench.flops_per_token(cfg, 8) == 6 * N + 6 * L * 8 * d
    assert bench.executed_flops_per_token(cfg, T, "bp") == bench.flops_per_token(cfg, T)
    assert bench.executed_flops_per_token(cfg, T, "rgc-async", 2) == \
        bench.flops_per_token(cfg, T) + 6 * decoder
    assert "6*N + 6*L*T*d" in bench.FLOPS_FORMULA


def _rec(label, rnd, tps, threads=2, rss=100.0, mode=None, groups=None):
    return {"label": label, "mode": mode or label.split("[")[0], "round": rnd, "threads": threads,
            "tokens_per_s": tps, "ms_per_step": 1000.0 / tps, "peak_rss_mib": rss,
            "stage_threads": groups}


def test_ratios_are_taken_round_by_round():
    # BP drifts 100 -> 200 -> 400; the other mode is always exactly 1.5x BP in the same round.
    recs = [_rec("bp", 0, 100), _rec("rgc-async", 0, 150), _rec("bp", 1, 200), _rec("rgc-async", 1, 300),
            _rec("bp", 2, 400), _rec("rgc-async", 2, 600)]
    r = bench.round_ratios(recs)
    assert set(r) == {(2, "rgc-async")}
    q = r[(2, "rgc-async")]
    assert q["per_round"] == pytest.approx([1.5, 1.5, 1.5])
    assert q["median"] == pytest.approx(1.5) and q["min"] == pytest.approx(1.5) and q["n"] == 3
    # the ratio of medians would be 300/200 = 1.5 too; make them differ: per-round 2, 0.5, 1 -> median 1
    recs = [_rec("bp", 0, 100), _rec("x", 0, 200), _rec("bp", 1, 400), _rec("x", 1, 200),
            _rec("bp", 2, 300), _rec("x", 2, 300)]
    q = bench.round_ratios(recs)[(2, "x")]
    assert q["per_round"] == pytest.approx([2.0, 0.5, 1.0])
    assert q["median"] == pytest.approx(1.0) and q["min"] == pytest.approx(0.5) and q["max"] == 2.0
    assert q["rounds"] == [0, 1, 2]


def test_ratios_skip_rounds_without_bp_and_keep_thread_counts_apart():
    recs = [_rec("bp", 0, 100, threads=1), _rec("x", 0, 50, threads=1),
            _rec("x", 1, 80, threads=1),                       # no BP in round 1: skipped
            _rec("bp", 0, 200, threads=2), _rec("x", 0, 300, threads=2)]
    r = bench.round_ratios(recs)
    assert r[(1, "x")]["per_round"] == pytest.approx([0.5])
    assert r[(2, "x")]["per_round"] == pytest.approx([1.5])
    assert bench.round_ratios([_rec("x", 0, 1.0)]) == {}


def test_aggregate_rows():
    recs = [_rec("bp", 0, 100, rss=200), _rec("rgc-async", 0, 150, rss=180, groups=[1, 1, 1, 1]),
            _rec("bp", 1, 120, rss=202), _rec("rgc-async", 1, 120, rss=181, groups=[1, 1, 1, 1])]
    rows = bench.aggregate(recs, flops=1e6, gemm={2: {"numba_gflops": 10.0}})
    assert [r["label"] for r in rows] == ["bp", "rgc-async"]
    bp, ra = rows
    assert bp["tokens_per_s"] == {"median": 110, "min": 100, "max": 120, "n": 2}
    assert bp["ratio_vs_bp"] is None
    assert ra["ratio_vs_bp"]["per_round"] == pytest.approx([1.5, 1.0])
    assert ra["ratio_vs_bp"]["median"] == pytest.approx(1.25)
    assert ra["rss_ratio_vs_bp"]["per_round"] == pytest.approx([0.9, 181 / 202])
    assert ra["gflops"]["median"] == pytest.approx(135e6 / 1e9)
    assert ra["fraction_of_gemm_peak"] == pytest.approx(0.135 / 10.0)
    assert ra["oversubscribed"] is True and bp["oversubscribed"] is False
    md = bench.markdown({"settings": {"config": "tiny", "model": preset("tiny").to_dict(), "batch": 4,
                                      "seq": 16, "repeats": 2, "steps": 3, "warmup_steps": 1},
                         "machine_line": "a machine", "summary": rows, "flops_per_token": 10,
                         "gemm_peak": {}, "notes": ["n1"]})
    assert "| 2 | rgc-async |" in md and "1.250×" in md and "Note: n1" in md


def test_parsing_and_run_order():
    assert bench.parse_modes("bp, rgc-async") == ["bp", "rgc-async"]
    for bad in ("", "bp,nope", "bp,bp"):
        with pytest.raises(ConfigError):
            bench.parse_modes(bad)
    assert bench.parse_int_list("1,2", "--threads") == [1, 2]
    for bad in ("0", "a", ""):
        with pytest.raises(ConfigError):
            bench.parse_int_list(bad, "--threads")
    assert bench.parse_stage_groups("auto:2,1,1,1:1", 4) == ["auto", "2,1,1,1", "1,1,1,1"]
    with pytest.raises(ConfigError):
        bench.parse_stage_groups("1,1", 4)
    assert bench.default_n_stages(8) == 4 and bench.default_n_stages(2) == 2 and \
        bench.default_n_stages(6) == 3
    v = bench.plan_variants(["bp", "rgc-async"], ["auto", "2,1"])
    assert [x[0] for x in v] == ["bp", "rgc-async", "rgc-async[2,1]"]
    v = bench.plan_variants(["rgc-async"], ["auto", "1,1"], bench.parse_worker_sweep("auto,2"))
    assert [x[0] for x in v] == ["rgc-async", "rgc-async[2 workers]", "rgc-async[1,1]",
                                 "rgc-async[1,1; 2 workers]"]
    assert [x[3] for x in v] == [0, 2, 0, 2]
    for bad in ("0", "x", "2,2", "-1"):
        with pytest.raises(ConfigError):
            bench.parse_worker_sweep(bad)
    v = bench.plan_variants(["bp", "torch"], ["auto"], [0], bench.parse_attention("store,recompute"))
    assert [(x[0], x[4]) for x in v] == [("bp", "store"), ("bp[recompute attention]", "recompute"),
                                         ("torch", "store")]
    for bad in ("", "flash", "store,store"):
        with pytest.raises(ConfigError):
            bench.parse_attention(bad)
    order = bench.interleaved(["A", "B", "C"], [1, 2], 2)
    assert [(t, r, x) for t, r, x in order][:6] == [(1, 0, "A"), (1, 0, "B"), (1, 0, "C"),
                                                    (1, 1, "A"), (1, 1, "B"), (1, 1, "C")]
    assert len(order) == 12 and order[6] == (2, 0, "A")


def test_machine_description():
    from nbrgc.measure.machine import describe_machine, machine_line
    d = describe_machine()
    for k in ("cpu", "logical_cores", "usable_cores", "threading_layer", "blas", "versions", "env"):
        assert k in d
    assert d["threading_layer"] in ("omp", "tbb")
    assert d["versions"]["numba"] and d["versions"]["numpy"]
    assert any(b.get("user_api") == "blas" for b in d["blas"])
    json.dumps(d)
    assert isinstance(machine_line(d), str)


# ------------------------------------------------------------------------------------------ end to end
def test_bench_end_to_end_tiny(tmp_path):
    out = tmp_path / "bench.json"
    p = _run_bin("--config", "tiny", "--modes", "bp,rgc-async", "--threads", "1", "--repeats", "2",
                 "--warmup-steps", "1", "--steps", "3", "--n-stages", "2", "--gemm-peak",
                 "--kernel-profile", "2", "--out", out, "--plot")
    err = p.stderr.decode(errors="replace")
    assert p.returncode == 0, err
    assert "Traceback" not in err
    text = p.stdout.decode()
    assert "| threads | mode |" in text and "| 1 | bp |" in text and "| 1 | rgc-async |" in text
    assert "6*N + 6*L*T*d" in text
    rep = json.loads(out.read_text())
    runs = rep["runs"]
    assert [(r["round"], r["label"]) for r in runs] == [(0, "bp"), (0, "rgc-async"), (1, "bp"),
                                                         (1, "rgc-async")]
    for r in runs:
        assert r["steps"] == 3 and r["tokens"] == 3 * 4 * 16 and len(r["step_done_s"]) == 3
        assert r["tokens_per_s"] > 0 and r["peak_rss_mib"] > 10 and r["vmhwm_mib"] > 10
        assert r["flops_per_token"] == bench.flops_per_token(preset("tiny"), 16)
    assert runs[1]["stage_threads"] == [1, 1]
    rows = {r["label"]: r for r in rep["summary"]}
    ratio = rows["rgc-async"]["ratio_vs_bp"]
    expect = [runs[1]["tokens_per_s"] / runs[0]["tokens_per_s"],
              runs[3]["tokens_per_s"] / runs[2]["tokens_per_s"]]
    assert ratio["per_round"] == pytest.approx(expect)
    assert ratio["median"] == pytest.approx(sum(expect) / 2)
    # two stages on a one-thread budget: auto runs both on one single-thread worker
    assert runs[1]["stage_workers"] == 1 and rows["rgc-async"]["stage_workers"] == 1
    assert rows["rgc-async"]["oversubscribed"] is False
    assert "| 1,1 on 1 worker |" in text
    g = rep["gemm_peak"]["1"]
    assert g["shape"] == [64, 32, 128] and g["numba_matmul_correct"] and g["numba_gflops"] > 0
    assert rep["machine"]["threading_layer"] in ("omp", "tbb")
    assert rep["flops_formula"] == bench.FLOPS_FORMULA
    # --kernel-profile: one BP step kernel by kernel, in its own process; the kernels are timed
    # inside the step's wall time, so they cannot add up to more than it
    (prof,) = rep["kernel_profile"]
    assert prof["threads"] == 1 and prof["attention"] == "store"
    kernels = prof["kernels_s"]
    for name in ("embedding fwd", "qkv gemm fwd", "attention fwd", "attention bwd", "mlp-up gemm bwd",
                 "decoder fwd+bwd (LN, head, CE)", "grad norm", "adamw"):
        assert kernels[name] > 0, name
    assert sum(kernels.values()) <= prof["step_s"]
    assert "Per-kernel time of one BP step, 1 thread(s), attention probabilities kept" in text
    try:
        import matplotlib  # noqa: F401
        assert (tmp_path / "bench.png").is_file()
    except ImportError:
        assert any("matplotlib" in n for n in rep["notes"])


@pytest.mark.parametrize("args, needle", [
    (["--modes", "bp,warp"], "unknown mode"),
    (["--threads", "0"], "--threads"),
    (["--modes", "bp,rgc-async", "--n-stages", "3"], "n_stages (3) must divide n_layer (2)"),
    (["--modes", "bp,rgc-async", "--stage-groups", "1,1,1"], "stage_threads"),
    (["--repeats", "0"], "repeats"),
    (["--config", "huge"], "unknown config preset"),
    (["--gemm-shape", "4x4"], "--gemm-shape"),
    (["--kernel-profile", "-1"], "kernel-profile must be an integer >= 0"),
    (["--kernel-profile", "two"], "not an integer"),
    (["--dataset", "/nonexistent/file.txt"], ""),
])
def test_bench_bad_input_is_one_line(args, needle):
    base = ["--config", "tiny", "--modes", "bp", "--repeats", "1", "--steps", "1", "--warmup-steps", "0"]
    p = _run_bin(*(base + args), timeout=120)  # later flags win in argparse
    err = p.stderr.decode(errors="replace").strip()
    assert p.returncode == 2, err
    assert err.startswith("error: ") and "\n" not in err and "Traceback" not in err
    assert needle in err


def test_missing_torch_is_skipped_with_a_note(monkeypatch):
    import nbrgc.measure.peers as peers
    monkeypatch.setattr(peers, "available", lambda name: (False, "PyTorch is not installed (test)"))
    rep = bench.run_bench(config="tiny", modes=["bp", "torch"], threads=[1], repeats=1,
                          warmup_steps=1, steps=1)
    assert rep["settings"]["modes"] == ["bp"]
    assert [r["label"] for r in rep["runs"]] == ["bp"]
    assert any("not installed" in n for n in rep["notes"])
    assert "Note: PyTorch is not installed (test)" in bench.markdown(rep)


# ------------------------------------------------------------------------------------------ the torch peer
def test_torch_peer_matches_nbrgc():
    pytest.importorskip("torch")
    from nbrgc import TrainConfig
    from nbrgc.data import Batches, load_dataset
    from nbrgc.model import Model
    from nbrgc.measure.peers.torch_peer import TorchPeer
    from nbrgc.schemes import make_scheme
    mcfg = preset("tiny")
    ds = load_dataset("default", log=None)
    x, y = Batches(ds.train, 4, mcfg.ctx, seed=0).next()
    model = Model(mcfg, seed=0)
    tc = TrainConfig(steps=10, warmup=0, batch=4)
    peer = TorchPeer(mcfg, tc, threads=1, seed=0)
    assert peer.n_params == model.n_params
    assert peer.loss(x, y) == pytest.approx(model.loss(x, y), rel=1e-5)
    sc = make_scheme(model, tc)
    for i in range(3):
        sc.submit(i, x, y, 1e-3)
        (res,) = sc.poll()
        assert peer.step(x, y, 1e-3) == pytest.approx(res.loss, rel=1e-4)
    assert peer.loss(x, y) == pytest.approx(model.loss(x, y), rel=1e-4)


def test_torch_peer_in_the_bench():
    pytest.importorskip("torch")
    rep = bench.run_bench(config="tiny", modes=["bp", "torch"], threads=[1], repeats=1,
                          warmup_steps=1, steps=2)
    t = [r for r in rep["runs"] if r["label"] == "torch"][0]
    assert t["torch_threads"] == 1 and t["tokens_per_s"] > 0 and t["steps"] == 2
    assert math.isfinite(rep["summary"][1]["ratio_vs_bp"]["median"])
