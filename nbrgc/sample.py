"""Loading a trained model back from a checkpoint, and autoregressive byte generation.

    from nbrgc.sample import load_model, generate
    model, meta, path = load_model("runs/small")          # a run folder (its newest good checkpoint)
    text = generate(model, b"The ", 200, temperature=0.8, top_k=40, seed=1)   # 200 new bytes

Every checkpoint of every mode holds the whole network's parameters (``params``) and its
``model_config``; for an RGC run the full network's prediction is that of the last stage, which is the
ordinary forward pass, so the same model serves every mode.

Generation conditions each new byte on the last ``ctx`` bytes of prompt + output. The window is run at
the model's full ``ctx`` width (right-padded): attention is causal, so the padding does not change the
prediction at the last real position, and one workspace serves the whole generation.
"""
import math
import os

import numpy as np

from . import checkpoint as ckpt
from .config import ModelConfig
from .errors import CheckpointError, ConfigError

#: the byte an empty prompt starts from (it is not part of the output)
EMPTY_PROMPT_START = b"\n"


def resolve_checkpoint(path, log=None):
    """``(file, arrays, meta)`` for a checkpoint file, or for a run folder's newest checkpoint that
    loads (corrupt ones are skipped with a note through ``log``). Raises CheckpointError."""
    if path is None or not str(path).strip():
        raise CheckpointError("no checkpoint given (a ckpt-*.nbrgc file or a run folder)")
    path = os.path.expanduser(os.fspath(path))
    if os.path.isdir(path):
        found = ckpt.latest(path, log=log)
        if found is None:
            if ckpt.list_checkpoints(path):
                raise CheckpointError(f"{path}: no checkpoint there loads (all are corrupt or truncated)")
            raise CheckpointError(f"{path}: no checkpoint in this folder (ckpt-*.nbrgc)")
        return found
    if not os.path.exists(path):
        raise CheckpointError(f"no such checkpoint file or run folder: {path}")
    arrays, meta = ckpt.load(path)
    return path, arrays, meta


def model_from_checkpoint(arrays, meta, path="checkpoint"):
    """Rebuild the Model of a loaded checkpoint (``meta["model_config"]``, ``arrays["params"]``)."""
    from .model import Model
    try:
        cfg = ModelConfig.from_dict(dict(meta["model_config"]))
    except (KeyError, TypeError, ValueError) as exc:
        if isinstance(exc, ConfigError):
            raise CheckpointError(f"{path}: bad model_config in checkpoint: {exc}") from None
        raise CheckpointError(f"{path}: checkpoint has no usable model_config ({exc})") from None
    params = arrays.get("params")
    if params is None:
        raise CheckpointError(f"{path}: checkpoint holds no 'params' array")
    if params.dtype not in (np.dtype(np.float32), np.dtype(np.float64)):
        raise CheckpointError(f"{path}: params have dtype {params.dtype}, expected float32 or float64")
    model = Model(cfg, seed=0, dtype=params.dtype)
    if params.shape != model.flat.shape:
        raise CheckpointError(f"{path}: params hold {params.size:,} values but model_config "
                              f"{cfg.to_dict()} needs {model.n_params:,}")
    if not np.isfinite(params).all():
        raise CheckpointError(f"{path}: params hold non-finite values")
    model.flat[...] = params
    return model


def load_model(path, log=None):
    """``(model, meta, checkpoint_file)`` from a checkpoint file or a run folder."""
    file, arrays, meta = resolve_checkpoint(path, log=log)
    return model_from_checkpoint(arrays, meta, file), meta, file


def check_sampling(n_bytes, temperature, top_k, vocab=256):
    """Validate generation settings; returns (n_bytes, temperature, top_k) or raises ConfigError.

    ``temperature`` 0 means greedy decoding (always the most likely byte; ``top_k`` and the seed then
    do not matter); otherwise it must be a positive finite number. ``top_k`` is in 1..vocab."""
    if isinstance(n_bytes, bool) or not isinstance(n_bytes, (int, np.integer)) or n_bytes < 0:
        raise ConfigError(f"bytes must be an integer >= 0, got {n_bytes!r}")
    try:
        temperature = float(temperature)
    except (TypeError, ValueError):
        raise ConfigError(f"temperature must be a number, got {temperature!r}") from None
    if not math.isfinite(temperature) or temperature < 0:
        raise ConfigError(f"temperature must be >= 0 (0: greedy), got {temperature}")
    if isinstance(top_k, bool) or not isinstance(top_k, (int, np.integer)) or not 1 <= top_k <= vocab:
        raise ConfigError(f"top-k must be an integer in 1..{vocab}, got {top_k!r}")
    return int(n_bytes), temperature, int(top_k)


def next_byte(logits, temperature, top_k, rng):
    """Pick one byte from a logits vector (length vocab)."""
    z = np.asarray(logits, dtype=np.float64)
    if not np.isfinite(z).all():
        from .errors import DivergenceError
        raise DivergenceError("the model produced non-finite logits")
    if temperature == 0:
        return int(np.argmax(z))
    z = z / temperature
    if top_k < z.shape[0]:
        keep = np.argpartition(z, -top_k)[-top_k:]
    else:
        keep = np.arange(z.shape[0])
    zk = z[keep]
    p = np.exp(zk - zk.max())
    p /= p.sum()
    return int(keep[rng.choice(len(keep), p=p)])


def iter_generate(model, prompt, n_bytes, temperature=1.0, top_k=256, seed=0):
    """Yield ``n_bytes`` generated byte values (ints) one at a time, continuing ``prompt`` (bytes)."""
    n_bytes, temperature, top_k = check_sampling(n_bytes, temperature, top_k, model.cfg.vocab)
    if isinstance(prompt, str):
        prompt = prompt.encode("utf-8")
    ctx = model.cfg.ctx
    hist = bytearray(bytes(prompt)[-ctx:] or EMPTY_PROMPT_START)
    rng = np.random.default_rng(seed)
    window = np.zeros((1, ctx), np.int32)
    for _ in range(n_bytes):
        n = len(hist)
        window[0, :n] = np.frombuffer(bytes(hist), dtype=np.uint8)
        window[0, n:] = 0
        logits = model.logits(window)[0, n - 1]
        b = next_byte(logits, temperature, top_k, rng)
        yield b
        hist.append(b)
        if len(hist) > ctx:
            del hist[0]


def generate(model, prompt, n_bytes, temperature=1.0, top_k=256, seed=0):
    """The ``n_bytes`` generated bytes (without the prompt), seeded: same arguments, same bytes."""
    return bytes(iter_generate(model, prompt, n_bytes, temperature, top_k, seed))
