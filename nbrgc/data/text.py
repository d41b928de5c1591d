"""Byte datasets from files: the :class:`Dataset` type, memory-mapping, 90/5/5 splits, and ``text:PATH``
(one file, or a folder of files concatenated once into a cache file in the data directory)."""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np

from ..errors import DataError
from .download import data_dir as _data_dir, ensure_dir, read_chunks, remove, _why

SPLIT_NAMES = ("train", "val", "test")
#: A 90/5/5 split needs 20 * (seq + 1) bytes for every split to hold one window of seq + 1 bytes.
PROPORTIONAL_FACTOR = 20
#: The shortest file accepted at all: one window of seq = 1 (2 bytes) in every split of a 90/5/5 split.
MIN_BYTES = PROPORTIONAL_FACTOR * 2


class Dataset:
    """Three 1-D uint8 byte arrays (memory-mapped where they come from files) plus where they came from.

    ``split`` says how the splits were made: ``"90/5/5"`` (positional, proportional) or ``"files"``
    (separate files, e.g. TinyStories' train and valid files; there ``test`` is ``val``).
    """

    def __init__(self, name, train, val, test, source, split="90/5/5"):
        self.name = str(name)
        self.train = train
        self.val = val
        self.test = test
        self.source = str(source)
        self.split_kind = split

    def split(self, name):
        """The split called ``name`` (``train``, ``val``/``valid``/``validation`` or ``test``)."""
        key = {"valid": "val", "validation": "val"}.get(name, name)
        if key not in SPLIT_NAMES:
            raise DataError(f"unknown split {name!r}; choose train, val or test")
        return getattr(self, key)

    def __len__(self):
        return len(self.train) + len(self.val) + (0 if self.test is self.val else len(self.test))

    def min_bytes(self, seq):
        """The file size needed so that every split holds one window of ``seq + 1`` bytes (90/5/5 splits)."""
        return PROPORTIONAL_FACTOR * (int(seq) + 1)

    def check_min(self, seq):
        """Raise DataError if any split is shorter than ``seq + 1`` bytes (one window), naming the minimum."""
        seq = int(seq)
        need = seq + 1
        for key in SPLIT_NAMES:
            n = len(getattr(self, key))
            if n < need:
                if self.split_kind == "90/5/5":
                    hint = f"; with the 90/5/5 split the data needs at least {self.min_bytes(seq):,} bytes"
                else:
                    hint = f"; every split file needs at least {need:,} bytes"
                raise DataError(f"{self.name} ({self.source}) is too short for seq {seq}: its {key} split has "
                                f"{n:,} bytes, one window needs seq+1 = {need:,}{hint}")
        return self

    def __repr__(self):
        return (f"Dataset({self.name!r}, train={len(self.train):,} B, val={len(self.val):,} B, "
                f"test={len(self.test):,} B, source={self.source!r})")


def memmap_file(path) -> np.memmap:
    """A read-only uint8 memory map of a non-empty regular file, or a one-line DataError."""
    p = Path(path)
    try:
        st = p.stat()
    except FileNotFoundError:
        raise DataError(f"no such file: {p}") from None
    except OSError as e:
        raise DataError(f"cannot read {p}: {_why(e)}") from None
    if p.is_dir():
        raise DataError(f"{p} is a folder, not a file")
    if not p.is_file():
        raise DataError(f"{p} is not a regular file")
    if st.st_size == 0:
        raise DataError(f"{p} is empty (0 bytes)")
    try:
        with open(p, "rb") as f:
            f.read(1)
        return np.memmap(p, dtype=np.uint8, mode="r")
    except (OSError, ValueError) as e:
        raise DataError(f"cannot read {p}: {_why(e)}") from None


def split_sizes(n):
    """(train, val, test) sizes of a positional 90/5/5 split of ``n`` bytes; exactly 90M/5M/5M for 10^8."""
    n = int(n)
    train = n * 9 // 10
    val = n // 20
    return train, val, n - train - val


def proportional(name, data, source) -> Dataset:
    """A 90/5/5 positional split of ``data``; DataError if it is too short for any window at all."""
    n = len(data)
    if n < MIN_BYTES:
        raise DataError(f"{source} is too short: {n:,} bytes; a 90/5/5 split needs at least {MIN_BYTES} bytes "
                        f"(and {PROPORTIONAL_FACTOR} x (seq+1) for windows of seq bytes)")
    tr, va, _ = split_sizes(n)
    return Dataset(name, data[:tr], data[tr:tr + va], data[tr + va:], source)


def _folder_files(root: Path):
    files = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for fn in filenames:
            if fn.startswith("."):
                continue
            p = Path(dirpath) / fn
            if p.is_file():
                files.append(p)
    return sorted(files, key=lambda p: p.relative_to(root).as_posix())


def concat_folder(root, data_dir=None, log=print) -> Path:
    """Concatenate the files of ``root`` (sorted by relative path, newline-separated) into a cache file in
    the data directory, keyed by a hash of the paths, sizes and mtimes; reuse it while they are unchanged."""
    root = Path(root)
    files = _folder_files(root)
    if not files:
        raise DataError(f"folder {root} has no files")
    key = hashlib.sha256(str(root.resolve()).encode())
    sizes = []
    for p in files:
        try:
            st = p.stat()
        except OSError as e:
            raise DataError(f"cannot read {p}: {_why(e)}") from None
        sizes.append(st.st_size)
        key.update(f"\0{p.relative_to(root).as_posix()}\0{st.st_size}\0{st.st_mtime_ns}".encode("utf-8", "replace"))
    total = sum(sizes) + len(files) - 1
    if sum(sizes) == 0:
        raise DataError(f"folder {root} holds only empty files")
    cache_dir = ensure_dir(_data_dir(data_dir) / "text")
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in root.resolve().name) or "root"
    cache = cache_dir / f"{safe}-{key.hexdigest()[:16]}.bin"
    if cache.is_file() and cache.stat().st_size == total:
        return cache
    log(f"concatenating {len(files)} files of {root} ({total:,} bytes) into {cache}")
    tmp = cache.with_name(f"{cache.name}.{os.getpid()}.part")
    try:
        with open(tmp, "wb") as out:
            for i, p in enumerate(files):
                if i:
                    out.write(b"\n")
                try:
                    with open(p, "rb") as f:
                        for b in read_chunks(f):
                            out.write(b)
                except OSError as e:
                    raise DataError(f"cannot read {p}: {_why(e)}") from None
        if tmp.stat().st_size != total:
            raise DataError(f"files in {root} changed while they were read; run again")
        os.replace(tmp, cache)
    except OSError as e:
        raise DataError(f"cannot write {cache}: {_why(e)}") from None
    finally:
        remove(tmp)
    return cache


def load_text(path, data_dir=None, log=print) -> Dataset:
    """``text:PATH``: a file (memory-mapped as is) or a folder of files, split 90/5/5."""
    p = Path(os.path.expanduser(os.fspath(path)))
    if not p.exists():
        raise DataError(f"no such file or folder: {p}")
    if p.is_dir():
        src = concat_folder(p, data_dir, log)
        return proportional(f"text:{p.name or p}", memmap_file(src), f"{p} (concatenated in {src})")
    return proportional(f"text:{p.name}", memmap_file(p), p)
