"""TinyStories (V2, GPT-4 generated): the train and valid text files, downloaded once into the data
directory (size checked against Content-Length; no published checksum), memory-mapped with their bytes
as they are (stories separated by ``<|endoftext|>`` lines). train = train file; val = test = valid file.
"""
from __future__ import annotations

import os

from ..errors import DataError
from .download import data_dir as _data_dir, download as _download, ensure_dir, file_lock, manual_hint
from .text import Dataset, memmap_file

TINYSTORIES_URL = "https://huggingface.co/datasets/roneneldan/TinyStories/resolve/main/"
TRAIN_FILE = "TinyStoriesV2-GPT4-train.txt"
VALID_FILE = "TinyStoriesV2-GPT4-valid.txt"


def tinystories_base(url=None) -> str:
    """The URL base the two file names are appended to: ``url``, else ``$NBRGC_TINYSTORIES_URL``, else
    the Hugging Face one."""
    base = url or os.environ.get("NBRGC_TINYSTORIES_URL") or TINYSTORIES_URL
    return base if base.endswith("/") else base + "/"


def fetch_tinystories(data_dir=None, *, url=None, download=True, log=print, progress=True):
    """Paths of the (train, valid) files in the data directory, downloading the missing ones."""
    d = _data_dir(data_dir)
    base = tinystories_base(url)
    paths = {}
    for fname in (VALID_FILE, TRAIN_FILE):  # the small one first: a network problem shows at once
        dest = d / fname
        if not dest.is_file():
            if not download:
                raise DataError(f"TinyStories file {fname} is not in {d} and downloading is off; "
                                f"{manual_hint(base + fname, dest)}")
            ensure_dir(d)
            with file_lock(d / f".{fname}.lock"):
                if not dest.is_file():
                    _download(base + fname, dest, log=log, progress=progress)
        paths[fname] = dest
    return paths[TRAIN_FILE], paths[VALID_FILE]


def load_tinystories(data_dir=None, *, url=None, download=True, log=print, progress=True) -> Dataset:
    train, valid = fetch_tinystories(data_dir, url=url, download=download, log=log, progress=progress)
    val = memmap_file(valid)
    return Dataset("tinystories", memmap_file(train), val, val, train.parent, split="files")
