"""Training and evaluation batches: random windows of ``seq + 1`` bytes from a 1-D uint8 array.

``Batches`` draws window starts from its own ``np.random.Generator(PCG64(seed))``; its ``state()`` is a
JSON-serialisable dict and ``set_state`` restores it exactly, so a resumed run sees the same batches.
"""
from __future__ import annotations

import numpy as np

from ..errors import CheckpointError, DataError

STATE_KIND = "nbrgc.data.Batches"
STATE_VERSION = 1


def _pos_int(name, v):
    if isinstance(v, bool) or int(v) != v or int(v) < 1:
        raise ValueError(f"{name} must be a positive integer, got {v!r}")
    return int(v)


def _check_data(data, seq):
    if not isinstance(data, np.ndarray):
        data = np.asarray(data)
    if data.ndim != 1 or data.dtype != np.uint8:
        raise TypeError(f"data must be a 1-D uint8 array, got {data.ndim}-D {data.dtype}")
    if len(data) < seq + 1:
        raise DataError(f"data has {len(data):,} bytes, fewer than seq+1 = {seq + 1:,} needed for one window "
                        f"of seq {seq}")
    return data


def windows(data, starts, seq):
    """(x, y): int32 (len(starts), seq) arrays; row i is data[s:s+seq] and data[s+1:s+seq+1]."""
    starts = np.asarray(starts, dtype=np.int64)
    w = np.empty((len(starts), seq + 1), dtype=np.int32)
    for i, s in enumerate(starts.tolist()):
        w[i] = data[s:s + seq + 1]
    return np.ascontiguousarray(w[:, :-1]), np.ascontiguousarray(w[:, 1:])


class Batches:
    """Random windows of ``data``: ``next()`` gives (x, y), int32 (batch, seq), y = x shifted by one byte."""

    def __init__(self, data, batch, seq, seed=0):
        self.batch = _pos_int("batch", batch)
        self.seq = _pos_int("seq", seq)
        self.data = _check_data(data, self.seq)
        self.seed = int(seed)
        self._rng = np.random.Generator(np.random.PCG64(self.seed))
        self.count = 0  # batches drawn so far

    def starts(self):
        """The next batch's window starts (advances the generator)."""
        return self._rng.integers(0, len(self.data) - self.seq, size=self.batch, dtype=np.int64)

    def next(self):
        x, y = windows(self.data, self.starts(), self.seq)
        self.count += 1
        return x, y

    __next__ = next

    def __iter__(self):
        return self

    def state(self) -> dict:
        """JSON-serialisable state (the 128-bit PCG64 words as decimal strings)."""
        st = self._rng.bit_generator.state
        return {
            "kind": STATE_KIND, "version": STATE_VERSION,
            "seed": self.seed, "batch": self.batch, "seq": self.seq, "n": int(len(self.data)),
            "count": self.count,
            "rng": {"bit_generator": st["bit_generator"], "state": str(st["state"]["state"]),
                    "inc": str(st["state"]["inc"]), "has_uint32": int(st["has_uint32"]),
                    "uinteger": int(st["uinteger"])},
        }

    def set_state(self, d, strict=True):
        """Restore a ``state()``; ``next()`` then continues exactly as the saved one would have.

        With ``strict`` (default) the saved batch, seq and data length must match (DataError otherwise).
        """
        try:
            if d.get("kind", STATE_KIND) != STATE_KIND:
                raise ValueError(f"kind {d.get('kind')!r}")
            r = d["rng"]
            if r["bit_generator"] != "PCG64":
                raise ValueError(f"bit generator {r['bit_generator']!r}")
            st = {"bit_generator": "PCG64",
                  "state": {"state": int(r["state"]), "inc": int(r["inc"])},
                  "has_uint32": int(r["has_uint32"]), "uinteger": int(r["uinteger"])}
            saved = (int(d["batch"]), int(d["seq"]), int(d["n"]))
            count = int(d["count"])
            seed = int(d["seed"])
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise CheckpointError(f"corrupt batch-sampler state ({type(e).__name__}: {e})") from None
        if strict and saved != (self.batch, self.seq, len(self.data)):
            raise DataError(f"batch-sampler state was saved for batch {saved[0]}, seq {saved[1]} on "
                            f"{saved[2]:,} bytes of data, not batch {self.batch}, seq {self.seq} on "
                            f"{len(self.data):,} bytes")
        self._rng.bit_generator.state = st
        self.count = count
        self.seed = seed
        return self


def eval_batches(data, batch, seq, n_batches, seed=1234):
    """``n_batches`` fixed (x, y) batches of random windows, identical for the same arguments."""
    n_batches = int(n_batches)
    if n_batches < 0:
        raise ValueError(f"n_batches must be >= 0, got {n_batches}")
    b = Batches(data, batch, seq, seed)
    return [b.next() for _ in range(n_batches)]
