"""Is this process one rank of an MPI job, and what may it use. Every refusal is one line."""
import os

from ..errors import ConfigError

# Set by the process managers that start MPI ranks: MPICH's hydra (PMI_*), Open MPI / PRRTE
# (OMPI_*, PMIX_*). A process started by hand has none of them.
_LAUNCHER_VARS = ("PMI_RANK", "PMI_SIZE", "PMI_FD", "PMI_PORT", "PMIX_RANK", "OMPI_COMM_WORLD_SIZE")

EXTRA_HINT = "pip install -e '.[mpi]' (mpi4py and the mpich wheel, whose mpiexec lands in the environment's bin/)"


def under_mpiexec(environ=None):
    env = os.environ if environ is None else environ
    return any(v in env for v in _LAUNCHER_VARS)


def import_mpi():
    """mpi4py's MPI module, initialised for calls from several threads (the stage workers and the
    main thread each talk to other ranks)."""
    try:
        import mpi4py
    except ImportError:
        raise ConfigError(f"--distributed mpi needs mpi4py: {EXTRA_HINT}") from None
    mpi4py.rc.thread_level = "multiple"
    try:
        from mpi4py import MPI
    except ImportError as exc:  # mpi4py without an MPI library it can load
        raise ConfigError(f"--distributed mpi: mpi4py cannot load an MPI library ({exc}); {EXTRA_HINT}") from None
    if MPI.Query_thread() < MPI.THREAD_MULTIPLE:
        raise ConfigError("--distributed mpi needs an MPI library with MPI_THREAD_MULTIPLE (MPICH has it)")
    return MPI


def init():
    """The world communicator, or a one-line error when this process was not started by mpiexec."""
    if not under_mpiexec():
        raise ConfigError("--distributed mpi: this process was not started by mpiexec; run "
                          "mpiexec -n R nbrgc-train ... --distributed mpi")
    return import_mpi().COMM_WORLD


def ranks_on_this_host(comm):
    """How many ranks of ``comm`` share this machine (they share its cores)."""
    MPI = import_mpi()
    local = comm.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        return local.Get_size()
    finally:
        local.Free()


def check_fit(mode, n_ranks, n_stages, batch):
    """One-line refusal of a rank count (or a mode) the run cannot use."""
    if mode == "pipe-sync":
        raise ConfigError("--distributed mpi runs bp (data parallel), rgc-async or pipe-async (stages "
                          "on ranks); pipe-sync is their one-thread reference: use pipe-async, which "
                          "computes the same")
    if mode == "rgc-sync":
        raise ConfigError("--distributed mpi runs bp (data parallel), rgc-async or pipe-async (stages "
                          "on ranks); rgc-async with --max-staleness 0 computes what rgc-sync computes")
    if mode == "bp":
        if batch < n_ranks:
            raise ConfigError(f"--distributed mpi with bp: {n_ranks} ranks need a batch of at least "
                              f"{n_ranks} sequences (each rank takes a slice), got --batch {batch}")
        return
    if n_stages % n_ranks:
        divisors = [d for d in range(1, n_stages + 1) if n_stages % d == 0]
        raise ConfigError(f"--distributed mpi with {mode}: {n_ranks} ranks cannot share {n_stages} "
                          f"stages equally; start {', '.join(map(str, divisors))} ranks or change --n-stages")
