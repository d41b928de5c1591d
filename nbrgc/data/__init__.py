"""Byte-level datasets: enwik8, TinyStories, a bundled default corpus, and any file or folder of files.

    from nbrgc.data import load_dataset, Dataset, Batches, eval_batches
    ds = load_dataset("enwik8")                    # or "tinystories", "default", "text:PATH", a path
    b = Batches(ds.train, batch=16, seq=256, seed=0)
    x, y = b.next()                                # int32 (16, 256); y is x shifted by one byte

Splits are 1-D uint8 arrays memory-mapped from files. The data directory is the ``data_dir`` argument,
else ``$NBRGC_DATA``, else ``~/.cache/nbrgc``. Every problem raises a one-line
:class:`~nbrgc.errors.DataError`.
"""
from __future__ import annotations

import os
from pathlib import Path

from ..errors import DataError
from .batches import Batches, eval_batches
from .download import data_dir
from .text import Dataset, load_text

__all__ = ["load_dataset", "as_dataset", "Dataset", "Batches", "eval_batches", "data_dir", "CHOICES"]

CHOICES = ("enwik8", "tinystories", "default", "text:PATH", "a path to a file or folder")
_CHOICES_TEXT = ", ".join(CHOICES[:-1]) + " or " + CHOICES[-1]


def _quiet(*args, **kwargs):
    pass


def _looks_like_path(s):
    return os.sep in s or "/" in s or s.startswith(("~", ".")) or "." in os.path.basename(s)


def load_dataset(spec, data_dir=None, log=print, download=True, *, url=None, progress=True, seq=None) -> Dataset:
    """Load a dataset by name or path.

    ``spec``: ``"enwik8"`` | ``"tinystories"`` | ``"default"`` | ``"text:PATH"`` | a path to a file or folder
    (a file whose name starts with ``enwik`` is read as enwik8 or a prefix of it; ``.zip`` is unzipped
    into the data directory). ``log`` gets progress notes and warnings; ``download=False`` never touches
    the network; ``url`` overrides the enwik8 URL or the TinyStories URL base; ``progress`` shows the
    download bar; with ``seq`` the splits are checked to hold at least one window (``check_min``).
    """
    log = log or _quiet
    if isinstance(spec, os.PathLike):
        spec = os.fspath(spec)
    if not isinstance(spec, str) or not spec.strip():
        raise DataError(f"no dataset given; choose {_CHOICES_TEXT}")
    s = spec.strip()
    key = s.lower()
    if key == "enwik8":
        from .enwik8 import load_enwik8
        ds = load_enwik8(None, data_dir, url=url, download=download, log=log, progress=progress)
    elif key == "tinystories":
        from .tinystories import load_tinystories
        ds = load_tinystories(data_dir, url=url, download=download, log=log, progress=progress)
    elif key == "default":
        from .default import load_default
        ds = load_default()
    elif key.startswith("text:"):
        path = s[5:].strip()
        if not path:
            raise DataError("text: needs a path, e.g. text:corpus.txt or text:folder/")
        ds = load_text(path, data_dir, log)
    else:
        p = Path(os.path.expanduser(s))
        if p.is_dir():
            ds = load_text(p, data_dir, log)
        elif p.exists():
            if p.name.lower().startswith("enwik"):
                from .enwik8 import load_enwik8
                ds = load_enwik8(p, data_dir, log=log)
            else:
                ds = load_text(p, data_dir, log)
        elif _looks_like_path(s):
            raise DataError(f"no such file or folder: {s}")
        else:
            raise DataError(f"unknown dataset {s!r}; choose {_CHOICES_TEXT}")
    if seq is not None:
        ds.check_min(seq)
    return ds


def as_dataset(data, log=print) -> Dataset:
    """What a Trainer accepts as data: a Dataset as is, a 1-D uint8 array (90% train, the rest both
    val and test), else a :func:`load_dataset` spec (None: ``default``)."""
    import numpy as np
    if isinstance(data, Dataset):
        return data
    if isinstance(data, np.ndarray):
        cut = int(len(data) * 0.9)
        return Dataset(name="array", train=data[:cut], val=data[cut:], test=data[cut:], source="array")
    return load_dataset(data if data is not None else "default", log=log)
