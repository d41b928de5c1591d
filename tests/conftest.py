"""Shared fixtures for the engine tests (kernels, model, local training, schemes)."""
import contextlib
import os
from pathlib import Path

import numpy as np
import pytest

import nbrgc  # noqa: F401  (selects the thread-safe Numba threading layer before anything compiles)

# A run without --out keeps a folder under $NBRGC_RUNS: the suite's runs (subprocesses inherit this)
# go to a temporary folder, never into the checkout's runs/.
if not os.environ.get("NBRGC_RUNS"):
    import tempfile
    os.environ["NBRGC_RUNS"] = tempfile.mkdtemp(prefix="nbrgc-test-runs-")

ENWIK6 = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "enwik6"


@pytest.fixture(scope="session")
def enwik6_path():
    """Path of the shared enwik6 file (first 10^6 bytes of enwik8); skips when it is not there."""
    if not ENWIK6.is_file():
        pytest.skip(f"shared test data not found: {ENWIK6}")
    return ENWIK6


@pytest.fixture(scope="session")
def enwik6(enwik6_path):
    """enwik6 as a read-only 1-D uint8 array."""
    data = np.fromfile(enwik6_path, dtype=np.uint8)
    data.flags.writeable = False
    return data


@pytest.fixture
def rng(request):
    """A NumPy Generator seeded from the test's name (stable across runs, distinct across tests)."""
    import zlib
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))


@contextlib.contextmanager
def numba_threads(n):
    """Run the block with the calling thread's Numba group set to ``n`` (restored afterwards)."""
    import numba
    old = numba.get_num_threads()
    numba.set_num_threads(max(1, min(n, numba.config.NUMBA_NUM_THREADS)))
    try:
        yield
    finally:
        numba.set_num_threads(old)


@pytest.fixture
def one_thread():
    """Finite-difference loops make thousands of tiny kernel calls; on a shared, loaded machine every
    parallel region of a multi-thread group may wait for a descheduled worker (100x slower). These
    tests check maths, not parallelism (the kernel tests and the thread-count comparisons do that), so
    they run single-threaded."""
    with numba_threads(1):
        yield


# CI reproducibility: Hypothesis draws the same examples on every run (a failure found once is found
# again, and a clean CI run cannot fail on a new random draw). Set NBRGC_HYPOTHESIS_EXPLORE=1 to let
# it search fresh random examples, which is how the edge cases fixed so far were found.
import os as _os

from hypothesis import settings as _hsettings

_hsettings.register_profile("nbrgc-ci", derandomize=True, deadline=None, print_blob=True)
_hsettings.register_profile("nbrgc-explore", deadline=None, print_blob=True)
_hsettings.load_profile("nbrgc-explore" if _os.environ.get("NBRGC_HYPOTHESIS_EXPLORE") else "nbrgc-ci")


def pytest_xdist_auto_num_workers(config):
    """``-n auto``: one worker per core up to 4. Most tests are single-threaded compiled loops or
    subprocesses; more workers than that mostly add kernel-cache loading and memory."""
    from contention import usable_cores
    return max(1, min(4, usable_cores()))
