import json
import os
import random
import signal
import struct
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from nbrgc import checkpoint as ck
from nbrgc.errors import CheckpointError, NbrgcError

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _arrays(seed=0):
    rng = np.random.default_rng(seed)
    return {
        "params": rng.standard_normal(1000).astype(np.float32),
        "adam_m": rng.standard_normal((7, 3)),                   # float64
        "counts": rng.integers(-5, 5, size=(2, 3, 4), dtype=np.int64),
        "scalar": np.array(2.5),                                  # 0-d float64
        "iscalar": np.array(7, dtype=np.int64),                   # 0-d int64
        "empty": np.zeros((0, 5), dtype=np.float32),
        "mask": np.array([True, False, True]),
        "noncontig": np.arange(20, dtype=np.float64).reshape(4, 5)[:, ::2],
    }


def _meta():
    rng = np.random.default_rng(123)
    return {"model_config": {"d_model": 64, "n_layers": 2, "heads": (4,)},
            "rng": rng.bit_generator.state, "lr": np.float64(3e-4), "note": "hi"}


def _assert_same(a, b):
    assert set(a) == set(b)
    for k in a:
        want = np.asarray(a[k])
        assert b[k].dtype == want.dtype, k
        assert b[k].shape == want.shape, k
        np.testing.assert_array_equal(b[k], want)


def _one_line(exc, path=None):
    msg = str(exc)
    assert "\n" not in msg and msg
    if path is not None:
        assert str(path) in msg
    return msg


def test_round_trip(tmp_path):
    arrays, meta = _arrays(), _meta()
    p = ck.save(tmp_path, 42, arrays, meta)
    assert p == os.path.join(str(tmp_path), "ckpt-000000042.nbrgc")
    got, m = ck.load(p)
    _assert_same(arrays, got)
    assert m["step"] == 42
    assert m["model_config"] == {"d_model": 64, "n_layers": 2, "heads": [4]}
    assert m["lr"] == 3e-4 and m["note"] == "hi"
    # the RNG state survives and restores the generator exactly
    g = np.random.default_rng()
    g.bit_generator.state = m["rng"]
    assert g.random() == np.random.default_rng(123).random()
    # loaded arrays are writable and aligned
    for a in got.values():
        assert a.flags.writeable and a.flags.aligned
    # only the final file remains, no temp file
    assert os.listdir(tmp_path) == ["ckpt-000000042.nbrgc"]


def test_layout_is_aligned(tmp_path):
    p = ck.save(tmp_path, 1, {"a": np.ones(3, np.float32), "b": np.ones(5)}, {})
    raw = open(p, "rb").read()
    magic, version, hlen = struct.unpack_from("<8sIQ", raw)
    assert magic == b"NBRGCKPT" and version == ck.FORMAT_VERSION
    header = json.loads(raw[20:20 + hlen])
    assert all(e["offset"] % ck.ALIGN == 0 for e in header["arrays"])
    start = -(-(20 + hlen + 32) // ck.ALIGN) * ck.ALIGN
    assert len(raw) == start + header["payload_len"]


def test_expect(tmp_path):
    p = ck.save(tmp_path, 5, _arrays(), _meta())
    ck.load(p, expect={"model_config": {"d_model": 64, "n_layers": 2, "heads": (4,)}})
    with pytest.raises(ck.CheckpointMismatchError) as info:
        ck.load(p, expect={"model_config": {"d_model": 128, "n_layers": 2, "heads": [4]}})
    msg = _one_line(info.value, p)
    assert "model_config.d_model" in msg and "64" in msg and "128" in msg
    with pytest.raises(CheckpointError) as info:
        ck.load(p, expect={"scheme": "rgc"})
    assert "'scheme'" in _one_line(info.value, p)
    # long values are shortened
    with pytest.raises(CheckpointError) as info:
        ck.load(p, expect={"note": "x" * 500})
    assert len(str(info.value)) < 300


@pytest.mark.parametrize("frac", [0.0, 0.001, 0.01, 0.05, 0.2, 0.5, 0.9, 0.999])
def test_truncation(tmp_path, frac):
    p = ck.save(tmp_path, 1, _arrays(), _meta())
    size = os.path.getsize(p)
    cut = int(size * frac) if frac else 0
    with open(p, "r+b") as f:
        f.truncate(cut)
    with pytest.raises(CheckpointError) as info:
        ck.load(p)
    _one_line(info.value, p)


def test_trailing_bytes(tmp_path):
    p = ck.save(tmp_path, 1, _arrays(), _meta())
    with open(p, "ab") as f:
        f.write(b"\0")
    with pytest.raises(CheckpointError, match="trailing"):
        ck.load(p)


def _flip(path, pos):
    with open(path, "r+b") as f:
        f.seek(pos)
        b = f.read(1)
        f.seek(pos)
        f.write(bytes([b[0] ^ 0x10]))


def test_flipped_bytes_everywhere(tmp_path):
    """A flipped byte anywhere (magic, version, lengths, JSON, checksums, padding, payload) is caught."""
    p = ck.save(tmp_path, 1, _arrays(), _meta())
    size = os.path.getsize(p)
    original = open(p, "rb").read()
    _, _, hlen = struct.unpack_from("<8sIQ", original)
    positions = set(range(0, 24)) | {30, 20 + hlen // 2, 20 + hlen - 1, 20 + hlen, 20 + hlen + 31,
                                     20 + hlen + 32, size // 2, size - 1}
    positions |= set(random.Random(0).sample(range(size), 40))
    for pos in sorted(x for x in positions if x < size):
        _flip(p, pos)
        with pytest.raises(CheckpointError) as info:
            ck.load(p)
        _one_line(info.value, p)
        with open(p, "wb") as f:
            f.write(original)
    ck.load(p)


def test_flipped_payload_and_header_messages(tmp_path):
    p = ck.save(tmp_path, 1, _arrays(), _meta())
    original = open(p, "rb").read()
    _flip(p, len(original) - 10)
    with pytest.raises(CheckpointError, match="payload checksum"):
        ck.load(p)
    open(p, "wb").write(original)
    _flip(p, 40)
    with pytest.raises(CheckpointError, match="header checksum"):
        ck.load(p)
    open(p, "wb").write(original)
    _flip(p, 0)
    with pytest.raises(CheckpointError, match="magic"):
        ck.load(p)


def test_wrong_version(tmp_path):
    p = ck.save(tmp_path, 1, _arrays(), _meta())
    with open(p, "r+b") as f:
        f.seek(8)
        f.write(struct.pack("<I", 7))
    with pytest.raises(CheckpointError) as info:
        ck.load(p)
    msg = _one_line(info.value, p)
    assert "version 7" in msg and f"expected {ck.FORMAT_VERSION}" in msg


def test_missing_and_garbage_files(tmp_path):
    with pytest.raises(CheckpointError) as info:
        ck.load(tmp_path / "nope.nbrgc")
    _one_line(info.value, tmp_path / "nope.nbrgc")
    g = tmp_path / "ckpt-000000001.nbrgc"
    g.write_bytes(b"")
    with pytest.raises(CheckpointError, match="truncated"):
        ck.load(g)
    g.write_bytes(b"hello world, this is not a checkpoint")
    with pytest.raises(CheckpointError, match="magic"):
        ck.load(g)


def test_rotation_keeps_newest(tmp_path):
    for step in range(0, 70, 10):
        ck.save(tmp_path, step, {"x": np.full(4, step, np.float32)}, {}, keep=3)
    names = [os.path.basename(p) for p in ck.list_checkpoints(tmp_path)]
    assert names == ["ckpt-000000040.nbrgc", "ckpt-000000050.nbrgc", "ckpt-000000060.nbrgc"]
    ck.save(tmp_path, 70, {"x": np.zeros(1)}, {}, keep=1)
    assert [os.path.basename(p) for p in ck.list_checkpoints(tmp_path)] == ["ckpt-000000070.nbrgc"]
    with pytest.raises(CheckpointError):
        ck.save(tmp_path, 80, {"x": np.zeros(1)}, {}, keep=0)


def test_rotation_never_deletes_new_or_newer(tmp_path):
    for step in (100, 200, 300):
        ck.save(tmp_path, step, {"x": np.zeros(1)}, {}, keep=2)
    # resuming from an older checkpoint and saving a smaller step keeps the new file and newer ones
    ck.save(tmp_path, 250, {"x": np.ones(1)}, {}, keep=1)
    names = [os.path.basename(p) for p in ck.list_checkpoints(tmp_path)]
    assert names == ["ckpt-000000250.nbrgc", "ckpt-000000300.nbrgc"]


def test_list_checkpoints_sorted_numerically(tmp_path):
    for step in (5, 1_000_000_000, 30, 2):
        ck.save(tmp_path, step, {}, {}, keep=10)
    (tmp_path / "ckpt-notanumber.nbrgc").write_bytes(b"x")
    (tmp_path / "other.txt").write_bytes(b"x")
    steps = [ck.load(p)[1]["step"] for p in ck.list_checkpoints(tmp_path)]
    assert steps == [2, 5, 30, 1_000_000_000]
    assert ck.list_checkpoints(tmp_path / "missing") == []


def test_latest_falls_back(tmp_path):
    for step in (1, 2, 3):
        ck.save(tmp_path, step, {"x": np.full(3, step, np.float64)}, {"model_config": {"d": 8}})
    newest = ck.list_checkpoints(tmp_path)[-1]
    _flip(newest, os.path.getsize(newest) - 1)
    msgs = []
    path, arrays, meta = ck.latest(tmp_path, log=msgs.append)
    assert meta["step"] == 2 and path.endswith("ckpt-000000002.nbrgc")
    np.testing.assert_array_equal(arrays["x"], [2, 2, 2])
    assert len(msgs) == 1 and newest in msgs[0] and "checksum" in msgs[0]
    # truncate the next one too
    with open(path, "r+b") as f:
        f.truncate(100)
    msgs.clear()
    path, _, meta = ck.latest(tmp_path, log=msgs.append)
    assert meta["step"] == 1 and len(msgs) == 2
    # all bad -> None, each reported; works without a log callback
    with open(path, "r+b") as f:
        f.truncate(0)
    msgs.clear()
    assert ck.latest(tmp_path, log=msgs.append) is None and len(msgs) == 3
    assert ck.latest(tmp_path) is None
    assert ck.latest(tmp_path / "missing") is None


def test_latest_expect_mismatch_raises(tmp_path):
    ck.save(tmp_path, 1, {"x": np.zeros(2)}, {"model_config": {"d": 8}})
    assert ck.latest(tmp_path, expect={"model_config": {"d": 8}})[2]["step"] == 1
    with pytest.raises(ck.CheckpointMismatchError, match="model_config.d"):
        ck.latest(tmp_path, expect={"model_config": {"d": 16}})


def test_temp_files_ignored_and_cleaned(tmp_path):
    ck.save(tmp_path, 1, {"x": np.ones(2)}, {})
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    dead_pid = int(dead.stdout)
    stale = [tmp_path / f".ckpt-000000002.nbrgc.tmp-{dead_pid}-deadbeef",
             tmp_path / f".ckpt-000000003.nbrgc.tmp-{os.getpid()}-0123abcd"]
    for s in stale:
        s.write_bytes(b"NBRGCKPT half a file")
    live = tmp_path / f".ckpt-000000004.nbrgc.tmp-{os.getppid()}-0badf00d"  # a live writer's
    live.write_bytes(b"in progress")
    msgs = []
    path, _, meta = ck.latest(tmp_path, log=msgs.append)
    assert meta["step"] == 1 and msgs == []
    assert len(ck.list_checkpoints(tmp_path)) == 1
    ck.save(tmp_path, 2, {"x": np.ones(2)}, {})
    left = sorted(os.listdir(tmp_path))
    assert left == sorted([live.name, "ckpt-000000001.nbrgc", "ckpt-000000002.nbrgc"])


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_refused(tmp_path, bad):
    good = ck.save(tmp_path, 1, {"p": np.ones(4, np.float32)}, {})
    p = np.ones(4, np.float32)
    p[2] = bad
    with pytest.raises(CheckpointError) as info:
        ck.save(tmp_path, 2, {"p": p}, {}, keep=1)
    msg = _one_line(info.value)
    assert "'p'" in msg and "non-finite" in msg
    assert ck.list_checkpoints(tmp_path) == [good]
    assert [n for n in os.listdir(tmp_path) if n.startswith(".")] == []
    # explicitly allowed
    q = ck.save(tmp_path, 3, {"p": p}, {}, require_finite=False)
    assert np.isnan(ck.load(q)[0]["p"][2]) or np.isinf(ck.load(q)[0]["p"][2])


def test_bad_inputs(tmp_path):
    with pytest.raises(CheckpointError, match="dtype"):
        ck.save(tmp_path, 1, {"o": np.array([object()])}, {})
    with pytest.raises(CheckpointError, match="JSON"):
        ck.save(tmp_path, 1, {"x": np.zeros(1)}, {"bad": object()})
    with pytest.raises(CheckpointError, match="step"):
        ck.save(tmp_path, 1, {"x": np.zeros(1)}, {"step": 2})
    with pytest.raises(CheckpointError):
        ck.save(tmp_path, -1, {"x": np.zeros(1)}, {})
    assert os.listdir(tmp_path) == []
    assert issubclass(ck.CheckpointMismatchError, NbrgcError)


def test_big_endian_input_round_trips(tmp_path):
    a = np.arange(5, dtype=">f8")
    got, _ = ck.load(ck.save(tmp_path, 1, {"a": a}, {}))
    np.testing.assert_array_equal(got["a"], a)


def test_same_step_overwrites_atomically(tmp_path):
    ck.save(tmp_path, 7, {"x": np.zeros(3)}, {"v": 1})
    ck.save(tmp_path, 7, {"x": np.ones(3)}, {"v": 2})
    arrays, meta = ck.load(ck.list_checkpoints(tmp_path)[0])
    assert meta["v"] == 2 and arrays["x"].tolist() == [1, 1, 1]


_CHILD = textwrap.dedent("""
    import os, sys, types
    pkg = types.ModuleType("nbrgc")          # skip the package __init__ (Numba start-up)
    pkg.__path__ = [os.path.join(sys.argv[1], "nbrgc")]
    sys.modules["nbrgc"] = pkg
    import numpy as np
    from nbrgc import checkpoint as ck
    out, step = sys.argv[2], int(sys.argv[3])
    base = np.random.default_rng(0).standard_normal(262144)  # 2 MB of float64
    while True:
        arrays = {"params": base + step, "opt": np.full(1000, step, np.int64)}
        ck.save(out, step, arrays, {"step": step, "model_config": {"d": 4}}, keep=2)
        print(step, flush=True)
        step += 1
""")


def test_sigkill_during_saves_leaves_latest_loadable(tmp_path):
    script = tmp_path / "child.py"
    script.write_text(_CHILD)
    out = tmp_path / "ckpts"
    rnd = random.Random(1234)
    base = np.random.default_rng(0).standard_normal(262144)
    step = 0
    kills = 0
    for attempt in range(5):
        proc = subprocess.Popen([sys.executable, str(script), REPO, str(out), str(step)],
                                stdout=subprocess.PIPE, text=True)
        try:
            first = proc.stdout.readline()  # at least one save completed in this run
            assert first.strip() == str(step), first
            time.sleep(rnd.uniform(0.0, 0.15))
            proc.send_signal(signal.SIGKILL)
        finally:
            proc.kill()
            proc.wait()
        assert proc.returncode == -signal.SIGKILL
        kills += 1
        msgs = []
        found = ck.latest(out, expect={"model_config": {"d": 4}}, log=msgs.append)
        assert found is not None and msgs == [], msgs
        path, arrays, meta = found
        s = meta["step"]
        assert s >= step
        assert arrays["opt"].tolist() == [s] * 1000
        np.testing.assert_array_equal(arrays["params"], base + s)
        # every file under a final name is complete
        for p in ck.list_checkpoints(out):
            ck.load(p)
        assert len(ck.list_checkpoints(out)) <= 3  # killed between replace and rotation
        step = s + 1
    assert kills == 5
    # the next save cleans any temp file the killed writers left behind
    ck.save(out, step, {"x": np.zeros(1)}, {})
    assert [n for n in os.listdir(out) if n.startswith(".")] == []
