"""The JIT cache folder is named by what the compiled code depends on, the target CPU included."""
import llvmlite.binding as llb
from numba.core import config

from nbrgc.kernels import jitcache


class _Features:
    def __init__(self, s):
        self.s = s

    def flatten(self):
        return self.s


def _host(monkeypatch, name, features):
    monkeypatch.setattr(config, "CPU_NAME", None)
    monkeypatch.setattr(config, "CPU_FEATURES", None)
    monkeypatch.setattr(llb, "get_host_cpu_name", lambda: name)
    monkeypatch.setattr(llb, "get_host_cpu_features", lambda: _Features(features))


def test_cache_key_follows_the_cpu_numba_compiles_for(monkeypatch):
    _host(monkeypatch, "skylake-avx512", "+avx2,+avx512f,+fma")
    avx512 = jitcache.cache_key()
    assert jitcache.cache_key() == avx512 and len(avx512) == 16
    _host(monkeypatch, "znver3", "+avx2,-avx512f,+fma")
    assert jitcache.cache_key() != avx512                       # another machine
    _host(monkeypatch, "skylake-avx512", "+avx2,-avx512f,+fma")
    assert jitcache.cache_key() != avx512                       # same name, other features
    _host(monkeypatch, "skylake-avx512", "+avx2,+avx512f,+fma")
    assert jitcache.cache_key() == avx512
    # Numba's own overrides win over the host, as they do for its code generation
    monkeypatch.setattr(config, "CPU_NAME", "haswell")
    monkeypatch.setattr(config, "CPU_FEATURES", "+avx2")
    assert jitcache.cpu_key() == "haswell:+avx2"
    assert jitcache.cache_key() != avx512


def test_configure_uses_the_keyed_folder(monkeypatch, tmp_path):
    import numba
    monkeypatch.delenv("NUMBA_CACHE_DIR", raising=False)
    monkeypatch.setenv("NBRGC_CACHE", str(tmp_path))
    monkeypatch.setattr(numba.config, "CACHE_DIR", numba.config.CACHE_DIR)  # restored afterwards
    _host(monkeypatch, "znver3", "+avx2")
    a = jitcache.configure()
    _host(monkeypatch, "sapphirerapids", "+avx2,+avx512f")
    b = jitcache.configure()
    assert a != b and {p.name for p in (tmp_path / "numba").iterdir()} == {a[-16:], b[-16:]}
    assert numba.config.CACHE_DIR == b
