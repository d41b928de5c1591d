"""nbrgc.atomic: the one durable writer every JSON file and checkpoint goes through."""
import json
import os
import re

import pytest

from nbrgc import atomic, checkpoint


def test_write_json_replaces_whole_file_and_leaves_no_temporary(tmp_path):
    p = tmp_path / "r.json"
    atomic.write_json(p, {"a": 1})
    atomic.write_json(p, {"b": [1, 2]})
    assert json.loads(p.read_text()) == {"b": [1, 2]}
    assert p.read_text().endswith("\n")
    assert os.listdir(tmp_path) == ["r.json"]


def test_a_failed_write_keeps_the_old_file_and_removes_its_temporary(tmp_path):
    p = tmp_path / "r.json"
    atomic.write_json(p, {"old": True})
    with pytest.raises(TypeError):
        atomic.write_json(p, {"bad": object()})  # refused before anything is written
    with pytest.raises(RuntimeError):
        with atomic.atomic_open(p) as f:
            f.write('{"half": ')
            raise RuntimeError("writer died")
    assert json.loads(p.read_text()) == {"old": True}
    assert os.listdir(tmp_path) == ["r.json"]


def test_temporaries_are_unique_hidden_and_in_the_same_folder(tmp_path):
    p = tmp_path / "ckpt-000000042.nbrgc"
    a, b = atomic.temp_name(p), atomic.temp_name(p)
    assert a != b and os.path.dirname(a) == str(tmp_path)
    assert re.match(rf"^\.ckpt-000000042\.nbrgc\.tmp-{os.getpid()}-[0-9a-f]{{8}}$", os.path.basename(a))
    # the checkpoint module recognises (and cleans up) exactly these names
    assert checkpoint._TMP_RE.match(os.path.basename(a))


def test_binary_mode_and_bad_mode(tmp_path):
    p = tmp_path / "b.bin"
    with atomic.atomic_open(p, "wb") as f:
        f.write(b"\x00\x01")
    assert p.read_bytes() == b"\x00\x01"
    with pytest.raises(ValueError):
        with atomic.atomic_open(p, "a"):
            pass
