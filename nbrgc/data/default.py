"""The bundled ``default`` corpus: a few hundred KB of English-like text, shipped with the package
so that a first run needs no network. ``tools/make_default_corpus.py`` (not part of the package)
generated it."""
from __future__ import annotations

from pathlib import Path

from ..errors import DataError
from .text import Dataset, memmap_file, proportional

CORPUS_FILE = Path(__file__).with_name("default_corpus.txt")


def load_default() -> Dataset:
    """The shipped corpus, 90/5/5 split; nothing is downloaded or written."""
    if not CORPUS_FILE.is_file():
        raise DataError(f"the bundled corpus {CORPUS_FILE} is missing: reinstall nbrgc "
                        f"(or, in a checkout, run python3 tools/make_default_corpus.py)")
    return proportional("default", memmap_file(CORPUS_FILE), CORPUS_FILE)
