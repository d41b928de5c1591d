"""nbrgc-plot and the log reader behind every curve: a real picture from synthetic run folders
(its size and legend checked through the returned Figure), the history of resumed and restarted
runs, the one-line error without matplotlib, and bad inputs."""
import json
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from nbrgc.cli import plot as cli_plot
from nbrgc.errors import NbrgcError
from nbrgc.measure import plot as plot_mod
from nbrgc.measure.runlog import LogError, load_run, parse_log, val_curve

REPO = Path(__file__).resolve().parents[1]


def _run_folder(path, mode="bp", n_stages=1, steps=20, eval_every=5, batch=4, seq=16, extra=()):
    path.mkdir(parents=True, exist_ok=True)
    (path / "run.json").write_text(json.dumps({
        "model_config": {"n_layer": 4, "d_model": 32, "n_head": 2, "ctx": 32, "vocab": 256},
        "train_config": {"mode": mode, "batch": batch, "seq": seq, "n_stages": n_stages}}))
    lines = []
    for s in range(1, steps + 1):
        rec = {"step": s, "loss": 5.0 / s, "bpb": 8.0 - 0.1 * s, "lr": 1e-3}
        if n_stages > 1:
            rec["stage_bpb"] = [8.0 - 0.1 * s + 0.2 * (n_stages - 1 - k) for k in range(n_stages)]
        lines.append(rec)
        if s % eval_every == 0:
            v = {"step": s, "val_bpb": 8.1 - 0.1 * s}
            if n_stages > 1:
                v["val_stage_bpb"] = [8.1 - 0.1 * s + 0.2 * (n_stages - 1 - k) for k in range(n_stages)]
            lines.append(v)
    lines.append({"summary": True, "mode": mode, "val_bpb": 8.1 - 0.1 * steps})
    (path / "log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines) + "".join(extra))
    return path


def _png_size(path):
    head = Path(path).read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", head[16:24])


def test_a_real_plot_of_a_bp_and_an_rgc_run_side_by_side(tmp_path):
    pytest.importorskip("matplotlib")
    bp = load_run(_run_folder(tmp_path / "bp"))
    rgc = load_run(_run_folder(tmp_path / "rgc", mode="rgc-async", n_stages=3))
    out = tmp_path / "curves.png"
    fig = plot_mod.plot_runs([bp, rgc], out, dpi=50)
    w, h = _png_size(out)
    assert (w, h) == (round(5.2 * 2 * 50), round(4.2 * 50))
    a, b = fig.axes
    assert [t.get_text() for t in a.get_legend().get_texts()] == ["training", "validation"]
    assert [t.get_text() for t in b.get_legend().get_texts()] == [
        "stage 0, training", "stage 0, validation", "stage 1, training", "stage 1, validation",
        "stage 2 (full network), training", "stage 2 (full network), validation"]
    assert a.get_title() == "bp\nbp, final val 6.100 bpb"
    assert b.get_title().startswith("rgc\nrgc-async, 3 stages")
    train, val = a.get_lines()
    assert list(train.get_xdata()) == [s * 64 for s in range(1, 21)]  # tokens = step x batch x seq
    assert list(val.get_xdata()) == [320, 640, 960, 1280]
    assert list(b.get_lines()[4].get_ydata()) == pytest.approx([8.0 - 0.1 * s for s in range(1, 21)])


def test_the_command_writes_the_picture(tmp_path):
    pytest.importorskip("matplotlib")
    run = _run_folder(tmp_path / "r", extra=['{"step": 21, "bp'])  # a line cut by a kill
    out = tmp_path / "c.png"
    p = subprocess.run([sys.executable, str(REPO / "bin" / "nbrgc-plot"), str(run), str(run / "log.jsonl"),
                        "-o", str(out), "--dpi", "40"], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert f"wrote {out} (2 runs)" in p.stdout
    assert "skipped 1 unreadable log line(s)" in p.stderr
    assert _png_size(out) == (round(5.2 * 2 * 40), round(4.2 * 40))


def test_resumed_and_restarted_runs_keep_the_history_as_it_finally_went():
    rec = lambda s, v=None: json.dumps({"step": s, "bpb": float(s)} if v is None  # noqa: E731
                                       else {"step": s, "val_bpb": v})
    # steps 1-6 with evaluations at 2, 4, 6; killed; resumed from the checkpoint at 4
    lines = [rec(1), rec(2), rec(2, 9.0), rec(3), rec(4), rec(4, 8.0), rec(5), rec(6), rec(6, 7.5),
             rec(5), rec(6), rec(6, 7.0), rec(7)]
    got = parse_log(lines)
    assert [p[0] for p in got["train"]] == [1, 2, 3, 4, 5, 6, 7]
    assert [(p[0], p[1]) for p in got["val"]] == [(2, 9.0), (4, 8.0), (6, 7.0)]
    # --force: a new run from step 1 replaces the old one entirely
    got = parse_log(lines + [rec(1), rec(2), rec(2, 6.0)])
    assert [p[0] for p in got["train"]] == [1, 2] and [p[1] for p in got["val"]] == [6.0]
    assert parse_log(["", "garbage", "[1]", json.dumps({"step": "x"}), json.dumps({"step": 1})])[
        "bad_lines"] == 4


def test_the_studys_curve_comes_from_the_same_reader(tmp_path):
    run = _run_folder(tmp_path / "r", mode="rgc-sync", n_stages=2, steps=10)
    c = val_curve(run / "log.jsonl", 64)
    assert [p[:3] for p in c] == [[5, 320, pytest.approx(7.6)], [10, 640, pytest.approx(7.1)]]
    assert len(c[0][3]) == 2
    assert val_curve(tmp_path / "missing.jsonl", 64) == []


def test_without_matplotlib_one_line_names_the_extra(tmp_path, monkeypatch, capsys):
    run = _run_folder(tmp_path / "r")
    for name in ("matplotlib", "matplotlib.figure"):
        monkeypatch.setitem(sys.modules, name, None)  # import raises ImportError
    with pytest.raises(plot_mod.PlotUnavailable, match=r"nbrgc\[plot\]"):
        plot_mod.plot_runs([load_run(run)], tmp_path / "c.png")
    assert cli_plot.main([str(run), "-o", str(tmp_path / "c.png")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: drawing needs matplotlib") and "nbrgc[plot]" in err and "\n" not in err
    assert not (tmp_path / "c.png").exists()


def _err(argv, capsys):
    try:
        rc = cli_plot.main(argv)
    except SystemExit as exc:  # argparse's own errors exit from inside the parser
        rc = exc.code
    assert rc == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and "Traceback" not in err
    return err


def test_bad_inputs_are_one_line(tmp_path, capsys):
    assert "no such run folder or log" in _err([str(tmp_path / "nope")], capsys)
    (tmp_path / "empty").mkdir()
    assert "holds no log.jsonl" in _err([str(tmp_path / "empty")], capsys)
    r = _run_folder(tmp_path / "r")
    (r / "log.jsonl").write_bytes(b"\xff\xfe\x00garbage")
    assert "not a text log" in _err([str(r)], capsys)
    (r / "log.jsonl").write_text("not json\n{\"summary\": true}\n")
    assert "has no training or validation records (1 unreadable line(s): corrupt?)" in _err([str(r)], capsys)
    r2 = _run_folder(tmp_path / "r2")
    (r2 / "run.json").unlink()
    assert "run.json is missing" in _err([str(r2)], capsys)
    (r2 / "run.json").write_text("{\"train_config\": 3}")
    assert "unreadable or not a run description" in _err([str(r2)], capsys)
    r3 = _run_folder(tmp_path / "r3")
    assert "--dpi must be in 10..1200" in _err([str(r3), "--dpi", "0"], capsys)
    assert "not an integer" in _err([str(r3), "--dpi", "x"], capsys)
    assert "the following arguments are required" in _err([], capsys)
    with pytest.raises(LogError):
        load_run(tmp_path / "empty")
    with pytest.raises(NbrgcError, match="no runs given"):
        plot_mod.plot_runs([], tmp_path / "x.png")
    pytest.importorskip("matplotlib")
    assert "cannot write" in _err([str(r3), "-o", str(tmp_path / "no" / "dir" / "c.png")], capsys)
    assert "cannot write" in _err([str(r3), "-o", str(tmp_path / "c.unknownext")], capsys)
