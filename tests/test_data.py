"""Datasets (splits, enwik prefixes, text folders, the bundled corpus, errors) and batch sampling."""
import json
import os
import zipfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from nbrgc.errors import DataError, CheckpointError
from nbrgc.data import load_dataset, Dataset, Batches, eval_batches
from nbrgc.data.text import split_sizes, MIN_BYTES
from nbrgc.data import default as D

ROOT = Path(__file__).resolve().parents[1]


def _corpus_tool():
    """tools/make_default_corpus.py, the build tool that wrote the shipped corpus (not in the package)."""
    import runpy
    return runpy.run_path(str(ROOT / "tools" / "make_default_corpus.py"))
ENWIK6 = ROOT.parent / "shared" / "data" / "enwik6"


def _closed_url():
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return f"http://127.0.0.1:{port}/enwik8.zip"


def _bytes(n, seed=0):
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8).tobytes()


def _one_line(e):
    msg = str(e.value)
    assert msg and "\n" not in msg
    return msg


# ---------------------------------------------------------------------------------------------- splits
def test_split_sizes():
    assert split_sizes(100_000_000) == (90_000_000, 5_000_000, 5_000_000)
    assert split_sizes(1_000_000) == (900_000, 50_000, 50_000)
    assert split_sizes(1000) == (900, 50, 50)


@given(st.integers(MIN_BYTES, 10**9))
def test_split_sizes_property(n):
    tr, va, te = split_sizes(n)
    assert tr + va + te == n and min(tr, va, te) >= 2 and te >= va


def test_text_file_split(tmp_path):
    data = _bytes(1000)
    f = tmp_path / "corpus.bin"
    f.write_bytes(data)
    for spec in (str(f), f"text:{f}", f):
        ds = load_dataset(spec, data_dir=tmp_path / "cache", log=None)
        assert isinstance(ds, Dataset)
        assert (len(ds.train), len(ds.val), len(ds.test)) == (900, 50, 50)
        assert isinstance(ds.train, np.memmap) and ds.train.dtype == np.uint8 and ds.train.ndim == 1
        assert bytes(ds.train) + bytes(ds.val) + bytes(ds.test) == data
        assert ds.name == "text:corpus.bin" and str(f) in ds.source


@pytest.mark.skipif(not ENWIK6.is_file(), reason="../shared/data/enwik6 is not there")
def test_enwik6_prefix_warning():
    logs = []
    ds = load_dataset(str(ENWIK6), log=logs.append)
    assert (len(ds.train), len(ds.val), len(ds.test)) == (900_000, 50_000, 50_000)
    assert isinstance(ds.train, np.memmap)
    assert bytes(ds.train[:6]) == b"<media"
    warn = [m for m in logs if "warning" in m]
    assert len(warn) == 1 and "prefix" in warn[0] and "enwik6" in warn[0] and "\n" not in warn[0]
    ds.check_min(1024)


def test_enwik_named_file_is_enwik8(tmp_path):
    data = _bytes(2000, 1)
    f = tmp_path / "enwik8_small"
    f.write_bytes(data)
    logs = []
    ds = load_dataset(str(f), log=logs.append, data_dir=tmp_path)
    assert (len(ds.train), len(ds.val), len(ds.test)) == (1800, 100, 100)
    assert any("prefix of enwik8" in m for m in logs)


def test_full_size_enwik8_standard_split(tmp_path):
    f = tmp_path / "enwik8"
    with open(f, "wb") as fh:  # sparse: no 100 MB written
        fh.truncate(100_000_000)
    logs = []
    ds = load_dataset("enwik8", data_dir=tmp_path, log=logs.append, download=False)
    assert ds.name == "enwik8" and not logs
    assert (len(ds.train), len(ds.val), len(ds.test)) == (90_000_000, 5_000_000, 5_000_000)
    assert isinstance(ds.val, np.memmap)


def test_enwik8_zip_path_and_data_dir_no_download(tmp_path, monkeypatch):
    data = _bytes(4000, 2)
    zdir = tmp_path / "zips"
    zdir.mkdir()
    with zipfile.ZipFile(zdir / "enwik8.zip", "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("enwik8", data)
    monkeypatch.setenv("NBRGC_ENWIK8_URL", _closed_url())  # any network use would fail
    logs = []
    ds = load_dataset(str(zdir / "enwik8.zip"), data_dir=tmp_path / "cache", log=logs.append)
    assert (tmp_path / "cache" / "enwik8").read_bytes() == data
    assert bytes(ds.train) + bytes(ds.val) + bytes(ds.test) == data
    assert any("prefix" in m for m in logs)
    # spec "enwik8" with a data dir that holds enwik8.zip: unzipped, not downloaded
    monkeypatch.delenv("NBRGC_ENWIK8_URL")
    ds2 = load_dataset("enwik8", data_dir=zdir, log=None, download=False)
    assert (zdir / "enwik8").read_bytes() == data and len(ds2.train) == 3600
    # and with the unzipped file present, the zip is not needed
    (zdir / "enwik8.zip").unlink()
    assert len(load_dataset("enwik8", data_dir=zdir, log=None, download=False).val) == 200


def test_text_folder_concatenation_cache(tmp_path):
    root = tmp_path / "docs"
    (root / "b").mkdir(parents=True)
    (root / "a.txt").write_bytes(b"A" * 30)
    (root / "b" / "c.txt").write_bytes(b"C" * 40)
    (root / "z.bin").write_bytes(bytes(range(256)))
    (root / ".hidden").write_bytes(b"HIDDEN")
    cache = tmp_path / "cache"
    for spec in (str(root), f"text:{root}"):
        ds = load_dataset(spec, data_dir=cache, log=None)
        whole = bytes(ds.train) + bytes(ds.val) + bytes(ds.test)
        assert whole == b"A" * 30 + b"\n" + b"C" * 40 + b"\n" + bytes(range(256))
        assert isinstance(ds.train, np.memmap) and ds.name == "text:docs"
    files = list((cache / "text").iterdir())
    assert len(files) == 1  # written once, reused
    mtime = files[0].stat().st_mtime_ns
    load_dataset(str(root), data_dir=cache, log=None)
    assert files[0].stat().st_mtime_ns == mtime
    (root / "a.txt").write_bytes(b"B" * 31)  # a change gives a new cache key
    ds = load_dataset(str(root), data_dir=cache, log=None)
    assert bytes(ds.train[:32]) == b"B" * 31 + b"\n"
    assert len(list((cache / "text").glob("*.bin"))) == 2


def test_data_dir_from_env(tmp_path, monkeypatch):
    root = tmp_path / "docs"
    root.mkdir()
    (root / "a.txt").write_bytes(b"x" * 100)
    monkeypatch.setenv("NBRGC_DATA", str(tmp_path / "envdata"))
    load_dataset(str(root), log=None)
    assert len(list((tmp_path / "envdata" / "text").glob("*.bin"))) == 1


# ------------------------------------------------------------------------------------------- default
def test_default_corpus_loads():
    ds = load_dataset("default", log=None)
    assert ds.name == "default"
    ds.check_min(256)
    assert min(len(ds.val), len(ds.test)) >= 40 * 257
    assert isinstance(ds.train, np.memmap)
    assert D.CORPUS_FILE.stat().st_size < 300_000
    x, y = Batches(ds.train, 4, 256, 0).next()
    assert x.shape == (4, 256)


def test_default_corpus_is_reproducible_and_text_like():
    shipped = D.CORPUS_FILE.read_bytes()
    tool = _corpus_tool()
    assert tool["CORPUS_FILE"] == D.CORPUS_FILE.resolve()
    assert tool["generate_corpus"]() == shipped  # rewrite with: python3 tools/make_default_corpus.py
    shipped.decode("ascii")
    import zlib
    ratio = len(zlib.compress(shipped, 6)) / len(shipped)
    assert 0.1 < ratio < 0.5  # structured, but not a repetition of a few lines
    lines = shipped.split(b"\n")
    assert len(set(lines)) > 0.4 * len(lines)
    assert shipped.count(b"<doc ") == shipped.count(b"</doc>")


def test_default_missing_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setattr(D, "CORPUS_FILE", tmp_path / "absent.txt")
    with pytest.raises(DataError, match="bundled corpus .* is missing: reinstall nbrgc"):
        load_dataset("default", data_dir=tmp_path / "d", log=None)
    assert not (tmp_path / "d").exists()  # nothing is generated at run time


def test_number_words():
    number_words = _corpus_tool()["number_words"]
    assert number_words(0) == "zero" and number_words(42) == "forty-two"
    assert number_words(115) == "one hundred and fifteen"


# ------------------------------------------------------------------------------------------- batches
@pytest.fixture
def data():
    return np.frombuffer(_bytes(5000, 3), dtype=np.uint8)


def test_batches_shapes_and_shift(data):
    b = Batches(data, 8, 32, seed=0)
    raw = data.tobytes()
    for _ in range(5):
        x, y = b.next()
        assert x.shape == y.shape == (8, 32) and x.dtype == y.dtype == np.int32
        assert x.flags.c_contiguous and y.flags.c_contiguous
        np.testing.assert_array_equal(x[:, 1:], y[:, :-1])
        for i in range(8):
            window = bytes(x[i].astype(np.uint8)) + bytes([y[i, -1]])
            assert window in raw


def test_batches_determinism(data):
    a = [Batches(data, 4, 16, seed=7).next() for _ in range(2)]
    np.testing.assert_array_equal(a[0][0], a[1][0])
    c = Batches(data, 4, 16, seed=8).next()
    assert not np.array_equal(a[0][0], c[0])


def test_batches_state_round_trip(data):
    b1 = Batches(data, 4, 16, seed=3)
    for _ in range(3):
        b1.next()
    st = json.loads(json.dumps(b1.state()))
    want = [b1.next() for _ in range(5)]
    b2 = Batches(data, 4, 16, seed=999).set_state(st)
    assert b2.count == 3
    for (x1, y1), (x2, y2) in zip(want, (b2.next() for _ in range(5))):
        np.testing.assert_array_equal(x1, x2)
        np.testing.assert_array_equal(y1, y2)
    assert b2.state() == b1.state()


def test_batches_state_mismatch_and_corrupt(data):
    st = Batches(data, 4, 16, seed=3).state()
    with pytest.raises(DataError):
        Batches(data, 4, 17, seed=3).set_state(st)
    Batches(data, 2, 17, seed=3).set_state(st, strict=False)
    with pytest.raises(CheckpointError):
        Batches(data, 4, 16).set_state({"rng": {}})


@settings(max_examples=40, deadline=None)
@given(n=st.integers(2, 300), seq=st.integers(1, 64), batch=st.integers(1, 5), seed=st.integers(0, 2**63))
def test_batches_windows_in_range(n, seq, batch, seed):
    data = np.arange(n, dtype=np.int64).astype(np.uint8)
    if n < seq + 1:
        with pytest.raises(DataError):
            Batches(data, batch, seq, seed)
        return
    x, y = Batches(data, batch, seq, seed).next()
    assert x.shape == (batch, seq)
    np.testing.assert_array_equal(x, (x[:, :1] + np.arange(seq)) % 256)  # contiguous windows of data
    np.testing.assert_array_equal(y, (x + 1) % 256)
    assert x.max() < n  # (for n <= 256, every byte value is a position)


def test_eval_batches_deterministic(data):
    e1 = eval_batches(data, 4, 32, 3)
    e2 = eval_batches(data, 4, 32, 3)
    assert len(e1) == 3
    for (x1, y1), (x2, y2) in zip(e1, e2):
        np.testing.assert_array_equal(x1, x2)
        np.testing.assert_array_equal(y1, y2)
    e3 = eval_batches(data, 4, 32, 3, seed=99)
    assert not np.array_equal(e1[0][0], e3[0][0])
    assert eval_batches(data, 4, 32, 0) == []


# -------------------------------------------------------------------------------------------- errors
def test_empty_file(tmp_path):
    f = tmp_path / "empty.txt"
    f.write_bytes(b"")
    with pytest.raises(DataError) as e:
        load_dataset(str(f), log=None)
    msg = _one_line(e)
    assert "empty" in msg and str(f) in msg


def test_short_file(tmp_path):
    f = tmp_path / "short.txt"
    f.write_bytes(b"0123456789")
    with pytest.raises(DataError) as e:
        load_dataset(str(f), log=None)
    msg = _one_line(e)
    assert str(f) in msg and str(MIN_BYTES) in msg


def test_too_short_for_seq(tmp_path):
    f = tmp_path / "small.txt"
    f.write_bytes(b"x" * 1000)
    ds = load_dataset(str(f), log=None)
    ds.check_min(49)  # val and test are 50 bytes
    with pytest.raises(DataError) as e:
        ds.check_min(256)
    msg = _one_line(e)
    assert "5,140" in msg and "257" in msg and "small.txt" in msg
    with pytest.raises(DataError):
        load_dataset(str(f), log=None, seq=256)


def test_missing_and_unknown(tmp_path):
    with pytest.raises(DataError) as e:
        load_dataset(str(tmp_path / "nope.txt"), log=None)
    assert "nope.txt" in _one_line(e)
    with pytest.raises(DataError) as e:
        load_dataset(f"text:{tmp_path / 'nope'}", log=None)
    assert "no such file" in _one_line(e)
    with pytest.raises(DataError) as e:
        load_dataset("wikitext", log=None)
    msg = _one_line(e)
    for choice in ("enwik8", "tinystories", "default", "text:PATH"):
        assert choice in msg
    with pytest.raises(DataError):
        load_dataset("", log=None)
    with pytest.raises(DataError):
        load_dataset("text:", log=None)


def test_empty_folder(tmp_path):
    (tmp_path / "void").mkdir()
    with pytest.raises(DataError) as e:
        load_dataset(str(tmp_path / "void"), data_dir=tmp_path, log=None)
    assert "no files" in _one_line(e)


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="root can read anything")
def test_unreadable_file(tmp_path):
    f = tmp_path / "secret.txt"
    f.write_bytes(b"x" * 100)
    f.chmod(0)
    try:
        with pytest.raises(DataError) as e:
            load_dataset(str(f), log=None)
        assert "cannot read" in _one_line(e)
    finally:
        f.chmod(0o600)


def test_unreadable_file_simulated(tmp_path, monkeypatch):
    # works as root too: opening the file fails with EACCES
    import builtins
    from nbrgc.data import text as text_mod
    f = tmp_path / "locked.txt"
    f.write_bytes(b"x" * 100)

    def deny(path, *a, **k):
        if Path(path) == f:
            raise PermissionError(13, "Permission denied", str(path))
        return builtins.open(path, *a, **k)

    monkeypatch.setattr(text_mod, "open", deny, raising=False)
    with pytest.raises(DataError) as e:
        load_dataset(str(f), log=None)
    msg = _one_line(e)
    assert "cannot read" in msg and "locked.txt" in msg and "Permission denied" in msg


def test_batches_too_short():
    with pytest.raises(DataError) as e:
        Batches(np.zeros(10, np.uint8), 2, 10, 0)
    assert "11" in _one_line(e)
