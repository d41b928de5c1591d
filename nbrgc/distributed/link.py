"""What the ranks send each other, counted, and every wait on another rank bounded by a deadline.

MPI's blocking calls cannot time out: a rank that stops answering would hang its peers for ever.
So every exchange is non-blocking and completed by polling ``Test`` until a deadline; past it the
waiting rank raises :class:`PeerTimeout`, which :mod:`.run` turns into a one-line error and
``MPI_Abort`` of the whole job. A rank that dies outright is seen by mpiexec, which ends the job.

Three communicators keep the callers apart: point-to-point activations (stage workers),
consensus rounds (the worker that closes a round; rounds close in order), and the main thread's
collectives (stop agreement, pauses, checkpoints). Collectives on one communicator must be called
in the same order on every rank, which one calling thread per communicator guarantees.

Bytes are counted per kind as what this rank must put on the wire:
* point-to-point sends: their payload, exactly;
* all-gather of a block of b bytes over R ranks: (R - 1) * b (every other rank needs the block,
  whatever the algorithm);
* all-reduce of n bytes: 2 (R - 1) / R * n (the bandwidth-optimal ring / reduce-scatter +
  all-gather; MPICH picks it for large messages).
"""
import collections
import os
import time

import numpy as np

from ..errors import NbrgcError
from .launch import import_mpi


class PeerTimeout(NbrgcError):
    """Another rank did not answer in time."""


class Stopped(Exception):
    """The local pipeline is stopping: give up the wait quietly."""


def _env_seconds(name, default):
    raw = os.environ.get(name)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise NbrgcError(f"{name} must be a number of seconds, got {raw!r}") from None
    if not value > 0:
        raise NbrgcError(f"{name} must be > 0, got {raw!r}")
    return value


class Link:
    # steady-state deadline: a step (and the S steps of slack) must fit; NBRGC_MPI_TIMEOUT moves it
    TIMEOUT = 20.0
    # the first step after a start or a pause: kernels load (or compile, on a cold cache), and a
    # peer may still be evaluating or writing a checkpoint
    LONG_TIMEOUT = 600.0
    POLL = 2e-4

    def __init__(self, comm):
        self.MPI = import_mpi()
        self.world = comm
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self.p2p = comm.Dup()
        self.rounds = comm.Dup()
        self.main = comm.Dup()
        self.timeout = _env_seconds("NBRGC_MPI_TIMEOUT", self.TIMEOUT)
        self.long_timeout = max(self.timeout, _env_seconds("NBRGC_MPI_LONG_TIMEOUT", self.LONG_TIMEOUT))
        self.sent = collections.Counter()

    # ------------------------------------------------------------------ waiting
    def wait(self, req, what, step, peer=None, long=False, stopping=None):
        """Poll ``req`` until it completes; PeerTimeout past the deadline, Stopped when
        ``stopping()`` turns true (a local stage failed or the pipeline is shutting down)."""
        if req.Test():
            return
        limit = self.long_timeout if long else self.timeout
        deadline = time.monotonic() + limit
        while not req.Test():
            if stopping is not None and stopping():
                raise Stopped
            if time.monotonic() > deadline:
                who = f"rank {peer}" if peer is not None else "another rank"
                raise PeerTimeout(f"{who} did not answer within {limit:.0f} s at step {step} ({what}); "
                                  "NBRGC_MPI_TIMEOUT sets the limit")
            time.sleep(self.POLL)

    # ------------------------------------------------------------------ point to point
    def isend(self, buf, dest, tag, kind="activations"):
        self.sent[kind] += buf.nbytes
        return self.p2p.Isend(buf, dest=dest, tag=tag)

    def irecv(self, buf, source, tag):
        return self.p2p.Irecv(buf, source=source, tag=tag)

    # ------------------------------------------------------------------ collectives
    def iallgather(self, comm, buf, kind):
        """In place: ``buf``'s first axis has one equal block per rank, this rank's filled."""
        self.sent[kind] += (self.size - 1) * buf.nbytes // self.size
        return comm.Iallgather(self.MPI.IN_PLACE, buf)

    def allgatherv(self, buf, counts, what, step, kind="pause"):
        """In place over a flat array: rank r's segment is ``counts[r]`` elements, in rank order."""
        counts = [int(c) for c in counts]
        displs = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(int).tolist()
        self.sent[kind] += (self.size - 1) * counts[self.rank] * buf.itemsize
        from mpi4py.util.dtlib import from_numpy_dtype
        mpi_type = from_numpy_dtype(buf.dtype)
        req = self.main.Iallgatherv(self.MPI.IN_PLACE, [buf, (counts, displs), mpi_type])
        self.wait(req, what, step, long=True)

    def allreduce(self, buf, what, step, comm=None, kind="gradient", long=False, op=None, stopping=None):
        """In place sum (or ``op``) of ``buf`` over every rank."""
        self.sent[kind] += int(2 * (self.size - 1) * buf.nbytes / self.size)
        req = (comm or self.main).Iallreduce(self.MPI.IN_PLACE, buf, op or self.MPI.SUM)
        self.wait(req, what, step, long=long, stopping=stopping)

    def bcast(self, obj, what, step, root=0):
        """A Python object from ``root`` to every rank (small control data and restored
        checkpoints), in chunks so that no message exceeds MPI's int count."""
        import pickle
        if self.size == 1:
            return obj
        data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL) if self.rank == root else b""
        n = np.array([len(data)], np.int64)
        self.wait(self.main.Ibcast(n, root=root), what, step, long=True)
        buf = np.frombuffer(data, np.uint8).copy() if self.rank == root else np.empty(int(n[0]), np.uint8)
        chunk = 1 << 30
        for lo in range(0, len(buf), chunk):
            self.wait(self.main.Ibcast(buf[lo:lo + chunk], root=root), what, step, long=True)
        if self.rank == root:
            self.sent["pause"] += (self.size - 1) * len(buf)
            return obj
        return pickle.loads(buf.tobytes())

    def allgather_obj(self, obj, what, step):
        """Every rank's ``obj`` (small), in rank order."""
        return [self.bcast(obj, what, step, root=r) for r in range(self.size)]

    def abort(self, code=1):
        self.world.Abort(code)
