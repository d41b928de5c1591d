"""The whole model: gradient check of every parameter tensor (float64), causality, float32 vs float64,
the documented parameter layout and initialisation, config validation, overfitting a fixed string,
seed determinism."""
import math

import numpy as np
import pytest

import nbrgc
from nbrgc.config import ModelConfig, TrainConfig, preset
from nbrgc.errors import ConfigError
from nbrgc.kernels.blocks import BLOCK_PARAMS
from nbrgc.model import DECODER_PARAMS, Layout, Model, param_shapes
from nbrgc.optim import lr_at
from nbrgc.schemes import make_scheme
from nbrgc.testing import check_grad

THREE = ModelConfig(n_layer=3, d_model=12, n_head=3, ctx=8, vocab=40)


def _batch(rng, B, T, vocab):
    x = rng.integers(0, vocab, (B, T)).astype(np.int32)
    y = rng.integers(0, vocab, (B, T)).astype(np.int32)
    return x, y


def _generic(model, seed, scale=0.05):
    """Move the parameters off the special init point (LN weights 1, biases 0), so that a gradient that
    only happens to be right at zero biases or unit gains is still caught."""
    model.flat += scale * np.random.default_rng(seed).standard_normal(model.flat.shape)
    return model


# ------------------------------------------------------------------------------------- gradient check

@pytest.mark.parametrize("cfg,B,T", [(preset("tiny"), 2, 5), (preset("tiny"), 1, 1), (THREE, 2, 7)],
                         ids=["tiny", "tiny-T1", "3-layer"])
def test_whole_model_gradient_every_tensor(cfg, B, T, one_thread):
    model = _generic(Model(cfg, seed=1, dtype=np.float64), seed=2)
    x, y = _batch(np.random.default_rng(3), B, T, cfg.vocab)
    loss, grads = model.loss_and_grad(x, y)
    assert math.isclose(loss, model.loss(x, y), rel_tol=1e-13)
    g = {n: a.copy() for n, a in grads.items()}
    f = lambda *_: model.loss(x, y)  # noqa: E731  (the arrays are views of model.flat)
    assert set(g) == set(model.layout.names)
    for i, name in enumerate(model.layout.names):
        try:
            check_grad(f, [model.params[name]], [g[name]], n_proj=2, n_coords=4, seed=i)
        except AssertionError as exc:
            raise AssertionError(f"gradient of {name}: {exc}") from None
    # one projection over all tensors at once (a global factor or a cross-tensor mix-up)
    check_grad(f, [model.params[n] for n in model.layout.names], [g[n] for n in model.layout.names],
               n_proj=3, n_coords=0, seed=99)
    # embeddings of positions >= T and of absent bytes get exactly zero gradient
    assert np.all(g["wpe"][T:] == 0.0)
    absent = np.setdiff1d(np.arange(cfg.vocab), x)
    assert np.all(g["wte"][absent] == 0.0)


def test_attention_recompute_same_bits_less_memory():
    """Model(attention="recompute") keeps no attention probabilities: the same loss and gradients to
    the last bit as the stored path (float32 and float64, several query blocks), a workspace smaller
    by the probabilities, and the memory estimate follows both."""
    from nbrgc.memory import estimate, workspace_bytes
    cfg = ModelConfig(n_layer=2, d_model=16, n_head=2, ctx=80, vocab=64)
    for dtype in (np.float32, np.float64):
        x, y = _batch(np.random.default_rng(0), 3, 80, cfg.vocab)
        a = Model(cfg, seed=4, dtype=dtype)
        b = Model(cfg, seed=4, dtype=dtype, attention="recompute")
        la, ga = a.loss_and_grad(x, y)
        lb, gb = b.loss_and_grad(x, y)
        assert la == lb and np.array_equal(a.grad_flat, b.grad_flat)
        assert np.array_equal(a.logits(x), b.logits(x))
        wa, wb = a.cached_workspace(3, 80), b.cached_workspace(3, 80)
        import numba
        nt = max(1, numba.config.NUMBA_NUM_THREADS)
        probs = 2 * 3 * cfg.n_head * 80 * 80 * a.dtype.itemsize
        assert wa.nbytes() - wb.nbytes() == probs - wb.scratch.probs_scratch.nbytes
        for ws, att in ((wa, "store"), (wb, "recompute")):
            assert ws.nbytes() == workspace_bytes(cfg, 3, 80, 2, a.dtype.itemsize, nt, attention=att)
    est = {att: estimate(cfg, TrainConfig(mode="bp", attention=att), 3, 80, 1)["activations"]
           for att in ("store", "recompute")}
    assert est["store"] > est["recompute"]
    with pytest.raises(ConfigError, match="attention must be one of store, recompute"):
        Model(cfg, attention="flash")
    with pytest.raises(ConfigError, match="attention must be one of"):
        TrainConfig(attention="")


def test_gradient_independent_of_thread_count():
    """The model passes its group size to the kernels as their block count (row blocks of GEMMs,
    per-block LayerNorm sums): 1 and 2 threads must agree to rounding."""
    from conftest import numba_threads
    cfg = THREE
    x, y = _batch(np.random.default_rng(0), 4, cfg.ctx, cfg.vocab)  # 32 rows: GEMMs split in 2
    out = []
    for n in (1, 2):
        with numba_threads(n):
            model = _generic(Model(cfg, seed=0, dtype=np.float64), seed=1)
            loss, _ = model.loss_and_grad(x, y)
            out.append((loss, model.grad_flat.copy()))
    assert math.isclose(out[0][0], out[1][0], rel_tol=1e-13)
    np.testing.assert_allclose(out[0][1], out[1][1], rtol=1e-9, atol=1e-13)


def test_loss_and_grad_overwrites_or_accumulates():
    model = Model(preset("tiny"), seed=0, dtype=np.float64)
    x, y = _batch(np.random.default_rng(0), 2, 4, 256)
    model.loss_and_grad(x, y)
    g1 = model.grad_flat.copy()
    model.loss_and_grad(x, y)
    np.testing.assert_array_equal(model.grad_flat, g1)  # zero=True overwrites
    model.loss_and_grad(x, y, zero=False)
    # (+= inside the kernels adds row by row into the old value: equal up to rounding)
    np.testing.assert_allclose(model.grad_flat, 2 * g1, rtol=1e-12, atol=1e-14 * np.abs(g1).max())
    # a different batch shape replaces the cached workspace and still gives the right gradient
    x2, y2 = _batch(np.random.default_rng(1), 3, 2, 256)
    l2, _ = model.loss_and_grad(x2, y2)
    fresh = Model(preset("tiny"), seed=0, dtype=np.float64)
    l2f, _ = fresh.loss_and_grad(x2, y2)
    assert l2 == l2f
    np.testing.assert_array_equal(model.grad_flat, fresh.grad_flat)


@pytest.mark.parametrize("attention", ["store", "recompute"])
def test_backward_leaves_saved_activations_alone(attention):
    """backward_blocks only reads what forward_blocks saved: a second backward of the same forward
    gives the same gradients to the last bit, with the probabilities kept or recomputed."""
    cfg = ModelConfig(n_layer=2, d_model=16, n_head=2, ctx=80)  # T > one query block of 64
    model = Model(cfg, seed=0, dtype=np.float32, attention=attention)
    x, y = _batch(np.random.default_rng(0), 2, 80, 256)
    ws = model.workspace(2, 80, 0, cfg.n_layer)
    h = model.forward_blocks(model.embed(x, ws), 0, cfg.n_layer, ws)
    _, dh = model.decoder_loss_and_grad(h, y, ws)
    dh = dh.copy()  # backward_blocks turns its input into the input gradient, in place
    out = []
    for _ in range(2):
        G = np.zeros_like(model.grad_flat)
        dx = model.backward_blocks(dh, 0, cfg.n_layer, ws, grad_flat=G)
        out.append((G, dx.copy()))
    np.testing.assert_array_equal(out[1][0], out[0][0])
    np.testing.assert_array_equal(out[1][1], out[0][1])
    assert np.abs(out[0][0]).max() > 0


# ------------------------------------------------------------------------------------------- causality

@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_causality(dtype):
    cfg = preset("tiny")
    model = _generic(Model(cfg, seed=4, dtype=dtype), seed=5, scale=0.1)
    rng = np.random.default_rng(6)
    B, T = 3, cfg.ctx
    x = rng.integers(0, 256, (B, T)).astype(np.int32)
    base = model.logits(x)
    assert base.shape == (B, T, cfg.vocab)
    for t in range(T):
        x2 = x.copy()
        x2[1, t] = (x2[1, t] + 1 + rng.integers(0, 254)) % 256
        out = model.logits(x2)
        # positions before t, and every other sequence, are untouched -- bitwise
        np.testing.assert_array_equal(out[1, :t], base[1, :t], err_msg=f"changed byte {t}")
        np.testing.assert_array_equal(out[[0, 2]], base[[0, 2]])
        assert not np.array_equal(out[1, t], base[1, t])  # position t itself does see it
    # prefixes: the logits of x[:, :t] (T=1 included) are those of the full sequence at positions < t
    tol = dict(rtol=1e-10, atol=1e-12) if dtype == np.float64 else dict(rtol=1e-4, atol=1e-5)
    for t in range(1, T + 1):
        np.testing.assert_allclose(model.logits(x[:, :t]), base[:, :t], **tol, err_msg=f"prefix {t}")


def test_causality_single_position():
    cfg = preset("tiny")
    model = _generic(Model(cfg, seed=0, dtype=np.float64), seed=1, scale=0.1)
    x = np.array([[7], [9]], np.int32)
    out = model.logits(x)
    assert out.shape == (2, 1, 256)
    # T=1: each row depends on its own byte only
    x2 = x.copy()
    x2[1, 0] = 200
    out2 = model.logits(x2)
    np.testing.assert_array_equal(out2[0], out[0])
    assert not np.array_equal(out2[1], out[1])
    # loss == mean CE of those logits
    y = np.array([[3], [5]], np.int32)
    ls = out - out.max(-1, keepdims=True)
    ls = ls - np.log(np.exp(ls).sum(-1, keepdims=True))
    assert math.isclose(model.loss(x, y), -(ls[0, 0, 3] + ls[1, 0, 5]) / 2, rel_tol=1e-12)


# ---------------------------------------------------------------------------------- float32 vs float64

@pytest.mark.parametrize("cfg", [preset("tiny"), THREE], ids=["tiny", "3-layer"])
@pytest.mark.parametrize("seed", [0, 7])
def test_float32_matches_float64(cfg, seed):
    m32 = Model(cfg, seed=seed, dtype=np.float32)
    m64 = Model(cfg, seed=seed, dtype=np.float64)
    # one seed holds the same values (drawn in float64, rounded once)
    np.testing.assert_array_equal(m32.flat, m64.flat.astype(np.float32))
    x, y = _batch(np.random.default_rng(seed + 1), 3, cfg.ctx, cfg.vocab)
    l32, g32 = m32.loss_and_grad(x, y)
    l64, g64 = m64.loss_and_grad(x, y)
    assert math.isclose(l32, l64, rel_tol=1e-5), (l32, l64)
    assert math.isclose(m32.loss(x, y), l64, rel_tol=1e-5)
    gn = np.linalg.norm(m64.grad_flat)
    assert np.linalg.norm(m32.grad_flat - m64.grad_flat) <= 1e-3 * gn


# --------------------------------------------------------------------------------------- layout, init

def test_param_layout_names_shapes_offsets():
    cfg = ModelConfig(n_layer=3, d_model=16, n_head=4, ctx=10, vocab=50)
    d, V = 16, 50
    lay = Layout(cfg)
    per_block = {"ln1.w": (d,), "ln1.b": (d,), "attn.wqkv": (d, 3 * d), "attn.bqkv": (3 * d,),
                 "attn.wo": (d, d), "attn.bo": (d,), "ln2.w": (d,), "ln2.b": (d,),
                 "mlp.w1": (d, 4 * d), "mlp.b1": (4 * d,), "mlp.w2": (4 * d, d), "mlp.b2": (d,)}
    assert list(per_block) == list(BLOCK_PARAMS)
    expect = [("wte", (V, d)), ("wpe", (10, d))]
    for i in range(3):
        expect += [(f"h.{i}.{p}", s) for p, s in per_block.items()]
    expect += [("lnf.w", (d,)), ("lnf.b", (d,)), ("head.w", (d, V)), ("head.b", (V,))]
    assert param_shapes(cfg) == expect
    assert lay.names == [n for n, _ in expect]
    assert [n for n, _ in expect[-4:]] == list(DECODER_PARAMS)
    # contiguous, in order, no gaps
    off = 0
    for n, s in expect:
        assert lay.offsets[n] == off, n
        off += int(np.prod(s))
    assert lay.size == off
    block_size = sum(int(np.prod(s)) for s in per_block.values())
    assert lay.embed_range == (0, (V + 10) * d)
    assert lay.decoder_range == (lay.offsets["lnf.w"], lay.size)
    assert lay.decoder_range[1] - lay.decoder_range[0] == 2 * d + d * V + V
    for lo in range(3):
        for hi in range(lo + 1, 4):
            start, stop = lay.block_range(lo, hi)
            assert start == lay.offsets[f"h.{lo}.ln1.w"]
            assert stop - start == (hi - lo) * block_size
    assert lay.block_range(0, 3)[1] == lay.decoder_range[0]
    np.testing.assert_array_equal(lay.block_offs,
                                  [[lay.offsets[f"h.{i}.{p}"] for p in BLOCK_PARAMS] for i in range(3)])
    mask = lay.decay_mask()
    for n, s in expect:
        seg = mask[lay.offsets[n]:lay.offsets[n] + int(np.prod(s))]
        assert np.all(seg == (1 if len(s) == 2 else 0)), n


def test_model_views_share_the_flat_buffers():
    model = Model(preset("tiny"), seed=0)
    assert model.flat.dtype == np.float32 and model.n_params == model.layout.size
    for name, shape in model.layout.shapes.items():
        p, g = model.params[name], model.grads[name]
        assert p.shape == shape and g.shape == shape
        assert np.shares_memory(p, model.flat) and np.shares_memory(g, model.grad_flat)
    model.params["head.b"][3] = 42.0
    assert model.flat[model.layout.offsets["head.b"] + 3] == 42.0


def test_init_statistics():
    cfg = ModelConfig(n_layer=3, d_model=64, n_head=4, ctx=32)
    model = Model(cfg, seed=11, dtype=np.float64)
    resid = 1.0 / math.sqrt(2 * cfg.n_layer)
    for name, p in model.params.items():
        leaf = name.split(".")
        if len(leaf) > 1 and leaf[-2].startswith("ln"):
            assert np.all(p == (1.0 if leaf[-1] == "w" else 0.0)), name
        elif p.ndim == 1:
            assert np.all(p == 0.0), name  # biases
        else:
            want = 0.02 * (resid if name.endswith(("attn.wo", "mlp.w2")) else 1.0)
            se = want / math.sqrt(2 * p.size)  # standard error of a sample std
            assert abs(p.std() - want) < 6 * se + 1e-12, (name, p.std(), want)
            assert abs(p.mean()) < 6 * want / math.sqrt(p.size), name
    # the decay mask covers exactly the matrices
    assert model.decay_mask.sum() == sum(p.size for p in model.params.values() if p.ndim == 2)


def test_same_seed_same_params_different_seed_different():
    cfg = preset("tiny")
    a, b, c = Model(cfg, seed=5), Model(cfg, seed=5), Model(cfg, seed=6)
    np.testing.assert_array_equal(a.flat, b.flat)
    assert not np.array_equal(a.flat, c.flat)
    a.flat[:] = 0
    a.init_weights(5)
    np.testing.assert_array_equal(a.flat, b.flat)


# ------------------------------------------------------------------------------------------ validation

@pytest.mark.parametrize("kw,needle", [
    (dict(n_layer=2, d_model=30, n_head=4, ctx=8), "divisible"),
    (dict(n_layer=0, d_model=8, n_head=2, ctx=8), "n_layer"),
    (dict(n_layer=-1, d_model=8, n_head=2, ctx=8), "n_layer"),
    (dict(n_layer=2, d_model=0, n_head=2, ctx=8), "d_model"),
    (dict(n_layer=2, d_model=8, n_head=0, ctx=8), "n_head"),
    (dict(n_layer=2, d_model=8, n_head=-2, ctx=8), "n_head"),
    (dict(n_layer=2, d_model=8, n_head=2, ctx=0), "ctx"),
    (dict(n_layer=2, d_model=8, n_head=2, ctx=8, vocab=1), "vocab"),
    (dict(n_layer=2.5, d_model=8, n_head=2, ctx=8), "n_layer"),
    (dict(n_layer="two", d_model=8, n_head=2, ctx=8), "n_layer"),
])
def test_model_config_errors(kw, needle):
    with pytest.raises(ConfigError) as ei:
        ModelConfig(**kw)
    msg = str(ei.value)
    assert needle in msg and "\n" not in msg, msg
    assert isinstance(ei.value, nbrgc.NbrgcError) and isinstance(ei.value, ValueError)


def test_divisibility_message_names_both_values():
    with pytest.raises(ConfigError, match=r"d_model \(30\) must be divisible by n_head \(4\)"):
        ModelConfig(n_layer=1, d_model=30, n_head=4, ctx=4)
    with pytest.raises(ConfigError, match="unknown config preset"):
        preset("huge")
    with pytest.raises(ConfigError, match="divisible"):
        preset("tiny", n_head=3)


def test_model_rejects_bad_inputs():
    cfg = preset("tiny")
    with pytest.raises(ConfigError, match="ModelConfig"):
        Model({"n_layer": 2})
    with pytest.raises(ConfigError, match="dtype"):
        Model(cfg, dtype=np.float16)
    model = Model(cfg)
    too_long = np.zeros((1, cfg.ctx + 1), np.int32)
    for call in (lambda: model.loss(too_long, too_long), lambda: model.loss_and_grad(too_long, too_long),
                 lambda: model.logits(too_long)):
        with pytest.raises(ConfigError, match=r"sequence length 17 exceeds ctx 16"):
            call()
    with pytest.raises(ConfigError, match="ctx"):
        TrainConfig(seq=cfg.ctx + 1).validate_for(cfg)
    assert TrainConfig(seq=0).validate_for(cfg) == cfg.ctx
    ok = np.zeros((2, 3), np.int32)
    with pytest.raises(ConfigError, match="shape"):
        model.loss(np.zeros(3, np.int32), np.zeros(3, np.int32))
    with pytest.raises(ConfigError, match="shape"):
        model.loss(np.zeros((2, 0), np.int32), np.zeros((2, 0), np.int32))
    with pytest.raises(ConfigError, match="differs"):
        model.loss(ok, np.zeros((2, 4), np.int32))
    with pytest.raises(ConfigError, match="integer"):
        model.loss(ok.astype(np.float32), ok)


# ------------------------------------------------------------------------------------------- overfit

TEXT = b"Numba kernels; manual backward! A tiny Transformer memorises it, byte by byte."[:65]


def test_tiny_overfits_a_fixed_64_byte_string(one_thread):
    cfg = preset("tiny")
    assert len(TEXT) == 65
    data = np.frombuffer(TEXT, np.uint8).astype(np.int32)
    x, y = data[:64].reshape(4, 16), data[1:65].reshape(4, 16)
    # every row starts with a different byte, so each target is determined by its prefix
    assert len(set(x[:, 0].tolist())) == 4
    model = Model(cfg, seed=0)
    tc = TrainConfig(mode="bp", steps=400, batch=4, lr=1e-2, warmup=20, weight_decay=0.0,
                     grad_clip=1.0, min_lr_frac=0.1)
    sc = make_scheme(model, tc)
    bpb = []
    for t in range(tc.steps):
        sc.submit(t, x, y, lr_at(t, tc))
        for r in sc.poll():
            bpb.append(r.loss / math.log(2))
        if model.loss(x, y) / math.log(2) < 0.1:
            break
    sc.close()
    final = model.loss(x, y) / math.log(2)
    assert bpb[0] > 7.0  # starts near log2(256) = 8 bits
    assert final < 0.1, f"after {t + 1} steps: {final:.3f} bits per byte (trace {bpb[::50]})"
