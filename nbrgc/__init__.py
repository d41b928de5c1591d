"""nbrgc: byte-level Transformers trained on CPUs with Numba, by global backprop or by bounded-horizon
local training with Readout-Gradient Consensus (RGC).

The thread-safe threading layer is selected here, before any kernel compiles.
"""
import importlib.util as _ilu
import os as _os
import sys as _sys

_MISSING = [m for m in ("numpy", "numba", "scipy", "tqdm", "threadpoolctl") if _ilu.find_spec(m) is None]
if _MISSING:
    _msg = (f"nbrgc needs {', '.join(_MISSING)}, not installed for {_sys.executable}: run "
            f"'pip install -e .' in {_os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))}")
    if _os.path.basename(_sys.argv[0] or "").startswith("nbrgc-"):
        _sys.stderr.write(f"error: {_msg}\n")
        raise SystemExit(2)
    raise ImportError(_msg)

from .errors import NbrgcError as _NbrgcError
from .threads import select_layer as _select_layer
from .kernels.jitcache import configure as _configure_cache
from .kernels.linking import install as _install_linking

try:
    THREADING_LAYER = _select_layer()
    JIT_CACHE_DIR = _configure_cache()  # also settles which BLAS the GEMMs call (NBRGC_BLAS)
    _install_linking()
except _NbrgcError as _exc:
    # a bad NBRGC_* setting: the command-line tools answer with one line, as for a bad flag
    if _os.path.basename(_sys.argv[0] or "").startswith("nbrgc-"):
        _sys.stderr.write(f"error: {_exc}\n")
        raise SystemExit(2) from None
    raise

from .errors import NbrgcError, ConfigError, DataError, CheckpointError  # noqa: E402
from .config import ModelConfig, TrainConfig, PRESETS, preset  # noqa: E402

__version__ = "0.1.0"
__all__ = ["Model", "ModelConfig", "TrainConfig", "PRESETS", "preset", "train", "Trainer",
           "local_loss_and_grad", "register_scheme", "NbrgcError", "ConfigError", "DataError", "CheckpointError",
           "THREADING_LAYER"]


def __getattr__(name):
    # Heavier entry points load on first use so `import nbrgc` stays quick.
    if name == "Model":
        from .model import Model
        return Model
    if name == "register_scheme":
        from .schemes import register_scheme
        return register_scheme
    if name == "local_loss_and_grad":
        from .local import local_loss_and_grad
        return local_loss_and_grad
    if name in ("train", "Trainer"):
        # the module is nbrgc.trainer, so `nbrgc.train` is always the function, whatever was
        # imported before
        import importlib
        return getattr(importlib.import_module(".trainer", __name__), name)
    raise AttributeError(name)
