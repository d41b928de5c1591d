"""Downloads against a local HTTP server on 127.0.0.1 (Range support, a connection cut midway, lies)."""
import hashlib
import io
import re
import socket
import threading
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

from nbrgc.errors import DataError
from nbrgc.data import load_dataset
from nbrgc.data.download import download, data_dir
from nbrgc.data import enwik8 as E
from nbrgc.data import tinystories as T


def _payload(n, seed=0):
    rng = np.random.default_rng(seed)
    words = [b"alpha", b"beta", b"gamma", b"<page>", b"</page>", b"\n", b"the", b"of", b"1234"]
    out = b" ".join(words[i] for i in rng.integers(0, len(words), n // 4))
    return out[:n]


def _zip(member_bytes, name="enwik8"):
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr(name, member_bytes)
    return buf.getvalue()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"  # the connection closes after each response

    def log_message(self, *args):
        pass

    def do_GET(self):
        srv = self.server
        rng_hdr = self.headers.get("Range")
        srv.requests.append((self.path, rng_hdr))
        body = srv.files.get(self.path)
        if body is None:
            self.send_error(404, "Not Found")
            return
        start, status = 0, 200
        if rng_hdr and srv.ranges:
            m = re.fullmatch(r"bytes=(\d+)-", rng_hdr)
            start = int(m.group(1))
            if start >= len(body):
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{len(body)}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            status = 206
        chunk = body[start:]
        self.send_response(status)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(len(chunk)))
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
        self.end_headers()
        if srv.drops.get(self.path, 0) > 0:  # cut the connection halfway
            srv.drops[self.path] -= 1
            self.wfile.write(chunk[: len(chunk) // 2])
            self.wfile.flush()
            return
        self.wfile.write(chunk)


@pytest.fixture
def server():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    srv.daemon_threads = True
    srv.files, srv.drops, srv.requests, srv.ranges = {}, {}, [], True
    srv.url = f"http://127.0.0.1:{srv.server_address[1]}"
    t = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    t.start()
    yield srv
    srv.shutdown()
    srv.server_close()


def _closed_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def _one_line(e):
    msg = str(e.value)
    assert "\n" not in msg and msg.strip() == msg
    return msg


def test_download_with_progress(server, tmp_path, capsys):
    body = _payload(300_000)
    server.files["/f.bin"] = body
    dest = tmp_path / "f.bin"
    logs = []
    out = download(server.url + "/f.bin", dest, expected_size=len(body),
                   sha256=hashlib.sha256(body).hexdigest(), log=logs.append)
    assert out == dest and dest.read_bytes() == body
    assert not (tmp_path / "f.bin.part").exists()
    err = capsys.readouterr().err
    assert "f.bin" in err and "100%" in err  # the tqdm bar went to stderr
    assert any("downloading" in m for m in logs)


def test_resume_after_cut_connection(server, tmp_path):
    body = _payload(200_000, 1)
    server.files["/f.bin"] = body
    server.drops["/f.bin"] = 1
    dest = tmp_path / "f.bin"
    logs = []
    download(server.url + "/f.bin", dest, log=logs.append, progress=False)
    assert dest.read_bytes() == body
    assert len(server.requests) == 2
    assert server.requests[0][1] is None
    assert server.requests[1][1] == f"bytes={len(body) // 2}-"  # resumed, not restarted
    assert any("cut" in m for m in logs) and any("resuming" in m for m in logs)


def test_resume_existing_part_file(server, tmp_path):
    body = _payload(50_000, 2)
    server.files["/f.bin"] = body
    dest = tmp_path / "f.bin"
    (tmp_path / "f.bin.part").write_bytes(body[:12_345])
    download(server.url + "/f.bin", dest, expected_size=len(body), log=None, progress=False)
    assert dest.read_bytes() == body
    assert server.requests == [("/f.bin", "bytes=12345-")]


def test_server_without_range_support_restarts(server, tmp_path):
    body = _payload(40_000, 3)
    server.files["/f.bin"] = body
    server.ranges = False
    dest = tmp_path / "f.bin"
    (tmp_path / "f.bin.part").write_bytes(b"garbage" * 100)
    download(server.url + "/f.bin", dest, log=None, progress=False)
    assert dest.read_bytes() == body


def test_stale_part_longer_than_file_starts_over(server, tmp_path):
    body = _payload(10_000, 4)
    server.files["/f.bin"] = body
    dest = tmp_path / "f.bin"
    (tmp_path / "f.bin.part").write_bytes(b"x" * 20_000)  # server answers 416
    download(server.url + "/f.bin", dest, log=None, progress=False)
    assert dest.read_bytes() == body


def test_checksum_mismatch_removes_part(server, tmp_path):
    server.files["/f.bin"] = _payload(30_000, 5)
    dest = tmp_path / "f.bin"
    with pytest.raises(DataError) as e:
        download(server.url + "/f.bin", dest, sha256="0" * 64, log=None, progress=False)
    msg = _one_line(e)
    assert "sha256" in msg and server.url + "/f.bin" in msg
    assert not dest.exists() and not (tmp_path / "f.bin.part").exists()


def test_size_mismatch_removes_part(server, tmp_path):
    body = _payload(30_000, 6)
    server.files["/f.bin"] = body
    dest = tmp_path / "f.bin"
    (tmp_path / "f.bin.part").write_bytes(body[:100])
    with pytest.raises(DataError) as e:
        download(server.url + "/f.bin", dest, expected_size=len(body) + 7, log=None, progress=False)
    msg = _one_line(e)
    assert f"{len(body) + 7:,}" in msg
    assert not dest.exists() and not (tmp_path / "f.bin.part").exists()


def test_no_network_one_line_with_manual_hint(tmp_path):
    url = f"http://127.0.0.1:{_closed_port()}/enwik8.zip"
    with pytest.raises(DataError) as e:
        load_dataset("enwik8", data_dir=tmp_path, url=url, log=None)
    msg = _one_line(e)
    assert url in msg and "by hand" in msg and str(tmp_path / "enwik8.zip") in msg
    assert not (tmp_path / "enwik8").exists()


def test_http_error(server, tmp_path):
    with pytest.raises(DataError) as e:
        download(server.url + "/missing", tmp_path / "x", log=None, progress=False)
    assert "404" in _one_line(e)


def test_enwik8_download_unzip_and_cache(server, tmp_path, monkeypatch):
    raw = _payload(40_000, 7)
    server.files["/enwik8.zip"] = _zip(raw)
    monkeypatch.setenv("NBRGC_ENWIK8_URL", server.url + "/enwik8.zip")
    logs = []
    ds = load_dataset("enwik8", data_dir=tmp_path, log=logs.append, progress=False)
    assert (tmp_path / "enwik8").read_bytes() == raw
    assert (len(ds.train), len(ds.val), len(ds.test)) == (36_000, 2_000, 2_000)
    assert bytes(ds.train[:100]) == raw[:100] and bytes(ds.test[-10:]) == raw[-10:]
    assert isinstance(ds.train, np.memmap) and ds.train.dtype == np.uint8
    assert any("prefix" in m for m in logs)
    n = len(server.requests)
    load_dataset("enwik8", data_dir=tmp_path, log=None)
    assert len(server.requests) == n  # cached: no second download


def test_enwik8_url_argument_and_resume(server, tmp_path):
    raw = _payload(30_000, 8)
    server.files["/mirror/e.zip"] = _zip(raw)
    server.drops["/mirror/e.zip"] = 1
    ds = load_dataset("enwik8", data_dir=tmp_path, url=server.url + "/mirror/e.zip", log=None, progress=False)
    assert len(ds.train) + len(ds.val) + len(ds.test) == len(raw)
    assert server.requests[-1][1] is not None  # the second request resumed


def test_enwik8_corrupt_zip_is_removed(server, tmp_path):
    z = bytearray(_zip(_payload(30_000, 9)))
    z[60] ^= 0xFF  # inside the compressed data: the CRC check fails
    z[61] ^= 0xFF
    server.files["/enwik8.zip"] = bytes(z)
    with pytest.raises(DataError) as e:
        load_dataset("enwik8", data_dir=tmp_path, url=server.url + "/enwik8.zip", log=None, progress=False)
    msg = _one_line(e)
    assert "enwik8.zip" in msg and "removed" in msg
    assert not (tmp_path / "enwik8.zip").exists() and not (tmp_path / "enwik8").exists()
    assert not (tmp_path / "enwik8.part").exists()


def test_enwik8_wrong_unzipped_size(server, tmp_path):
    server.files["/enwik8.zip"] = _zip(_payload(5_000, 10))
    with pytest.raises(DataError) as e:
        E.fetch_enwik8(tmp_path, url=server.url + "/enwik8.zip", size=E.ENWIK8_SIZE, log=None, progress=False)
    assert "100,000,000" in _one_line(e)
    assert not (tmp_path / "enwik8").exists()


def test_enwik8_zip_sha_mismatch(server, tmp_path):
    server.files["/enwik8.zip"] = _zip(_payload(5_000, 11))
    with pytest.raises(DataError) as e:
        E.fetch_enwik8(tmp_path, url=server.url + "/enwik8.zip", sha256="ab" * 32, log=None, progress=False)
    assert "sha256" in _one_line(e)
    assert not list(tmp_path.glob("enwik8*"))


def test_enwik8_download_off(tmp_path):
    with pytest.raises(DataError) as e:
        load_dataset("enwik8", data_dir=tmp_path, download=False, log=None)
    msg = _one_line(e)
    assert E.ENWIK8_URL in msg and str(tmp_path / "enwik8.zip") in msg


def test_canonical_expectations():
    assert E.ENWIK8_URL == "http://mattmahoney.net/dc/enwik8.zip"
    assert E.expectations(E.ENWIK8_URL) == (36_445_475, E.ENWIK8_ZIP_SHA256, 100_000_000)
    assert E.expectations("http://example.invalid/enwik8.zip") == (None, None, None)
    assert E.enwik8_url() in (E.ENWIK8_URL, __import__("os").environ.get("NBRGC_ENWIK8_URL"))


def test_tinystories(server, tmp_path, monkeypatch):
    train = b"Once upon a time there was a cat.\n<|endoftext|>\nTom had a red ball.\n" * 200
    valid = b"Lily saw a bird.\n<|endoftext|>\nThe sun was hot.\n" * 50
    server.files["/ts/" + T.TRAIN_FILE] = train
    server.files["/ts/" + T.VALID_FILE] = valid
    monkeypatch.setenv("NBRGC_TINYSTORIES_URL", server.url + "/ts")
    ds = load_dataset("tinystories", data_dir=tmp_path, log=None, progress=False)
    assert ds.name == "tinystories"
    assert bytes(ds.train) == train and bytes(ds.val) == valid and ds.test is ds.val
    ds.check_min(256)
    n = len(server.requests)
    load_dataset("tinystories", data_dir=tmp_path, log=None)
    assert len(server.requests) == n


def test_download_that_keeps_failing_gives_up_resumably(server, tmp_path):
    # the server cuts every response halfway: progress shrinks to nothing, then the download gives up
    # with one line and keeps the .part for the next run
    server.files["/f.bin"] = b"x" * 1000
    server.drops["/f.bin"] = 100
    dest = tmp_path / "f.bin"
    with pytest.raises(DataError) as e:
        download(server.url + "/f.bin", dest, log=None, progress=False, max_failures=2)
    msg = _one_line(e)
    assert "/f.bin" in msg and "resumed next time" in msg
    assert not dest.exists() and (tmp_path / "f.bin.part").stat().st_size == 999
    server.drops["/f.bin"] = 0
    download(server.url + "/f.bin", dest, log=None, progress=False)
    assert dest.read_bytes() == b"x" * 1000
    assert server.requests[-1][1] == "bytes=999-"


def test_data_dir_resolution(tmp_path, monkeypatch):
    monkeypatch.setenv("NBRGC_DATA", str(tmp_path / "d"))
    assert data_dir() == tmp_path / "d"
    assert data_dir(tmp_path / "x") == tmp_path / "x"
    monkeypatch.delenv("NBRGC_DATA")
    assert str(data_dir()).endswith(".cache/nbrgc")
