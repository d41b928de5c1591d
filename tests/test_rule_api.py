"""The worked example of docs/schemes.md ("Your own local-learning rule") runs as written, and the rule
it registers does what it says: stage 0 learns from the byte after next, the last stage from the next."""
import re
from pathlib import Path

import numpy as np
import pytest

import nbrgc
from nbrgc.config import TrainConfig, preset
from nbrgc.data import Batches
from nbrgc.errors import ConfigError
from nbrgc.model import Model
from nbrgc.schemes import make_scheme

from conftest import numba_threads

DOC = Path(__file__).resolve().parent.parent / "docs" / "schemes.md"


def example_code():
    text = DOC.read_text()
    section = text[text.index("### Your own local-learning rule"):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_the_documented_rule_trains_and_is_what_it_says(capsys):
    env = {}
    exec(compile(example_code(), str(DOC), "exec"), env)
    summary = env["summary"]
    assert np.isfinite(summary["val_bpb"]) and len(summary["val_stage_bpb"]) == 2
    assert summary["steps"] == 60 and summary["val_bpb"] < 8.0  # it learned something
    # the rule's stage-0 loss is the shared decoder's loss on the byte after next
    cfg = preset("tiny")
    tc = TrainConfig(mode="predict-further", n_stages=2, horizon="0", aux_weight=1.0,
                     max_staleness=0, steps=1, batch=2)
    model = Model(cfg, seed=0)
    sc = make_scheme(model, tc)
    x, y = Batches(np.frombuffer(b"abcdefghij" * 50, np.uint8).copy(), 2, 16, seed=0).next()
    ref = Model(cfg, seed=0)
    ws = ref.workspace(2, 16, 0, 1)
    h = ref.forward_blocks(ref.embed(x, ws), 0, 1, ws)
    ahead = ref.decoder_loss(h, np.concatenate([y[:, 1:], y[:, -1:]], axis=1), ws)
    sc.submit(0, x, y, 1e-3)
    (res,) = sc.poll()
    assert res.stage_losses[0] == pytest.approx(float(ahead), rel=1e-6)
    assert res.stage_losses[1] == pytest.approx(ref.loss(x, y), rel=1e-6)


def test_the_documented_rule_runs_threaded_with_the_same_bits():
    """The same mixin on PipeAsync (registered like pipe-async): the stages on worker threads give
    the losses of the stages in turn."""
    env = {}
    exec(compile(example_code().split("summary = nbrgc.train(")[0].replace(
        '"predict-further"', '"predict-further-2"').replace(
        '"predict-further-threaded"', '"predict-further-threaded-2"'), str(DOC), "exec"), env)
    cfg = preset("tiny", n_layer=4)
    text = np.frombuffer(b"the quick brown fox jumps over the lazy dog. " * 40, np.uint8).copy()
    out = {}
    for mode in ("predict-further-2", "predict-further-threaded-2"):
        tc = TrainConfig(mode=mode, n_stages=4, horizon="stage", aux_weight=1.0, max_staleness=1,
                         steps=6, batch=2, stage_threads="1", stage_workers=2)
        tc.validate_for(cfg)
        sc = make_scheme(Model(cfg, seed=1), tc)
        batches = Batches(text, 2, 16, seed=0)
        res = []
        try:
            with numba_threads(1):  # the threaded stages' groups: one thread each
                for t in range(6):
                    x, y = batches.next()
                    sc.submit(t, x, y, 1e-3)
                    res += sc.poll()
                res += sc.drain()
        finally:
            sc.close()
        out[mode] = [r.stage_losses for r in res]
    assert out["predict-further-2"] == out["predict-further-threaded-2"]
    assert len(out["predict-further-2"]) == 6


def test_register_scheme_refuses_bad_names():
    with pytest.raises(ConfigError, match="new name"):
        nbrgc.register_scheme("bp", object)
    with pytest.raises(ConfigError, match="like"):
        nbrgc.register_scheme("mine", lambda *a, **k: None, like="bp")
    with pytest.raises(ConfigError, match="registered with nbrgc.register_scheme"):
        TrainConfig(mode="never-registered")
