"""Which BLAS the GEMMs call (nbrgc.kernels.blas): the choice, the override, its cache key, bad settings."""
import os
import subprocess
import sys

import numpy as np
import pytest

import nbrgc
from nbrgc.kernels import blas

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_PROBE = """
import json, numpy as np, nbrgc
from nbrgc.kernels.blas import choose
from nbrgc.kernels.gemm import matmul, matmul_nt, matmul_tn
rng = np.random.default_rng(1)
A = rng.standard_normal((37, 19)).astype(np.float32)
B = rng.standard_normal((19, 23)).astype(np.float32)
C = np.zeros((37, 23), np.float32)
matmul(A, B, C, 0.0, 2)
dY = rng.standard_normal((37, 23)).astype(np.float32)
dW = np.zeros((19, 23), np.float32)
matmul_tn(A, dY, dW, 0.0, 2, 1)
dX = np.zeros((37, 19), np.float32)
matmul_nt(dY, B, dX, 0.0, 2, 0)
ref = lambda x, y: (x.astype(np.float64) @ y.astype(np.float64))
err = max(np.abs(C - ref(A, B)).max(), np.abs(dW - ref(A.T, dY)).max(), np.abs(dX - ref(dY, B.T)).max())
print(json.dumps({"name": choose().name, "ilp64": choose().ilp64, "err": float(err),
                  "cache": nbrgc.JIT_CACHE_DIR}))
"""


def _probe(value, tmp_path):
    env = dict(os.environ, NBRGC_BLAS=value, NBRGC_CACHE=str(tmp_path / "cache"))
    env.pop("NUMBA_CACHE_DIR", None)
    out = subprocess.run([sys.executable, "-c", _PROBE], env=env, cwd=ROOT, capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    import json
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_this_process_uses_the_chosen_library():
    b = blas.choose()
    assert b.name in ("numpy", "scipy") and b.sgemm and b.dgemm
    assert b.ilp64 == (b.name == "numpy")
    assert blas.cache_key() == f"{b.name}:{int(b.ilp64)}"


def test_scipy_override_computes_the_same_products_in_its_own_cache(tmp_path):
    got = _probe("scipy", tmp_path)
    assert got["name"] == "scipy" and got["ilp64"] is False
    assert got["err"] < 1e-4
    if blas._numpy_openblas() is not None:
        other = _probe("auto", tmp_path)
        assert other["name"] == "numpy" and other["ilp64"] is True and other["err"] < 1e-4
        # the integer width is compiled into the kernels: the two must never share cached code
        assert other["cache"] != got["cache"]


def test_numpy_override_fails_clearly_without_bundled_openblas(monkeypatch):
    monkeypatch.setattr(blas, "_chosen", None)
    monkeypatch.setattr(blas, "_numpy_openblas", lambda: None)
    monkeypatch.setenv("NBRGC_BLAS", "numpy")
    with pytest.raises(nbrgc.NbrgcError, match="does not bundle scipy-openblas"):
        blas.choose()
    monkeypatch.setenv("NBRGC_BLAS", "auto")
    assert blas.choose().name == "scipy"  # auto falls back


@pytest.mark.parametrize("var,value,words", [("NBRGC_BLAS", "mkl", "NBRGC_BLAS='mkl'"),
                                             ("NBRGC_THREADING_LAYER", "workqueue",
                                              "NBRGC_THREADING_LAYER='workqueue'")])
def test_a_bad_setting_is_one_line_from_the_command_line(var, value, words):
    env = dict(os.environ, **{var: value})
    out = subprocess.run([sys.executable, os.path.join(ROOT, "bin", "nbrgc-train"), "--steps", "1"],
                         env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and words in lines[0], out.stderr


def test_machine_description_names_the_library_the_gemms_use():
    from nbrgc.measure.machine import blas_info
    users = [b for b in blas_info() if "nbrgc GEMMs" in (b.get("used_by") or "")]
    assert len(users) == 1
    assert blas.choose().loaded_from(users[0]["filepath"])
