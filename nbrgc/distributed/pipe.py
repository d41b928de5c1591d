"""Pipelined training on MPI ranks: pipe-async (and rgc-async with a horizon, an auxiliary weight or
readout blocks) with its stages split over the ranks as :class:`~nbrgc.distributed.pipeline.RGCAsyncMPI`
splits RGC's. Everything RGC sends travels as there (activations forward, the consensus rounds'
all-gathers, the parameter gathers of a pause); what is new is the boundary gradient that travels
backward where a rank boundary cuts the pipeline.

* **Messages.** The message for boundary k (written by stage k+1, read by stage k's late action) is a
  B·T·d array in a ring of d + 1 slots (``--boundary-delay d``) on both ranks. The writer sends each
  one with ``Isend`` from its slot once it is written, and writes the slot again only once that send
  has completed (d + 1 micro-batches later). The reader keeps the next d + 1 ``Irecv`` posted into its
  slots, in micro-batch order, and posts the next one as soon as it has read a slot. Every message is
  written and read once and in micro-batch order, so sends and receives match in order.
* **A start at boundary n** (a fresh run, a resume): the messages written before n and read after it
  are in the reader's ring (a resume reads them from the checkpoint); the reader posts receives only
  for the messages written from step n on, each once the slot it lands in has been read.
* **Checkpoints.** After the pipeline drained, each ring comes from the rank that owns it (the
  stage's for kept inputs, own gradients and stashed weights, the writer's for messages), as do the
  readout blocks and the optimizer moments: a checkpoint is exactly a single-process pipe-async
  checkpoint, and every rank resumes from it.

The losses are those of one process, bit for bit (``tests/test_mpi.py``).
"""
from ..schemes.pipe_async import PipeAsync
from .pipeline import RGCAsyncMPI


class PipeAsyncMPI(PipeAsync, RGCAsyncMPI):
    def __init__(self, model, tc, **kw):
        super().__init__(model, tc, **kw)
        self._msend = {}   # boundary -> per slot, the Isend in flight from it (we are the writer)
        self._mrecv = {}   # boundary -> per slot, the Irecv posted into it (we are the reader)

    def _crosses(self, k):
        """Whether boundary k (between stages k and k+1) is between two ranks."""
        return self._rank_of(k) != self._rank_of(k + 1)

    def _tag(self, k):
        return self.K + k  # activations use tags 0..K-1

    # ------------------------------------------------------------------ the schedule of messages
    def _start(self, step0, B, T):
        """Post the first receives before the workers start (PipeAsync's _start then finds the rings)."""
        self._msend, self._mrecv = {}, {}
        if self._rings is None or self._shape != (B, T):
            self._alloc_rings(B, T)
        if self.hops:
            self._open_messages(step0)
        super()._start(step0, B, T)

    def _open_messages(self, step0):
        d = self.d
        for k in range(self.K - 1):
            if not self._crosses(k):
                continue
            if self._rank_of(k + 1) == self.link.rank:
                self._msend[k] = [None] * (d + 1)
            elif self._rank_of(k) == self.link.rank:
                self._mrecv[k] = [None] * (d + 1)
                first = next(s for s in range(max(0, step0 - self.D[0] - 1), step0 + 1)
                             if self._written_at(k, s)[1] >= step0)
                for s in range(first, first + d + 1):
                    prev = s - (d + 1)  # the slot's message before: read before step0?
                    if prev < 0 or self._late_step(k, prev) < step0:
                        self._post_message_recv(k, s)

    def _post_message_recv(self, k, s):
        i = s % (self.d + 1)
        self._mrecv[k][i] = self.link.irecv(self._rings[f"message{k}"][i], self.link.rank + 1,
                                            tag=self._tag(k))

    def _message_ready(self, k, s):
        if k not in self._mrecv:
            return super()._message_ready(k, s)
        req = self._mrecv[k][s % (self.d + 1)]
        if req is None:  # read from the checkpoint (written before the start)
            return
        self._mpi_wait(req, f"stage {k} waiting for stage {k + 1}'s boundary gradient", s,
                       peer=self.link.rank + 1)
        self._mrecv[k][s % (self.d + 1)] = None

    def _message_read(self, k, s):
        if k in self._mrecv:
            self._post_message_recv(k, s + self.d + 1)

    def _message_free(self, k, s):
        if k not in self._msend:
            return super()._message_free(k, s)
        req = self._msend[k][s % (self.d + 1)]
        if req is not None:
            self._mpi_wait(req, f"stage {k} to take stage {k + 1}'s boundary gradient", s,
                           peer=self.link.rank - 1)

    def _message_sent(self, k, s):
        if k in self._msend:
            i = s % (self.d + 1)
            self._msend[k][i] = self.link.isend(self._rings[f"message{k}"][i], self.link.rank - 1,
                                                tag=self._tag(k), kind="boundary gradients")

    # ------------------------------------------------------------------ the stage actions
    def _stage_forward(self, k, t):
        self._step_begins(k, t)
        return super()._stage_forward(k, t)

    # ------------------------------------------------------------------ pauses and state
    def state(self):
        arrays, meta = super().state()  # PipeAsync's: this rank's view
        link, K = self.link, self.K
        stages = [self._rank_of(k) for k in range(K)]
        # optimizers: the stages', the decoder's, the readout blocks' of stages 0..K-2
        self._gather_optimizers(meta, stages + [0] + stages[:len(self.ro_opts)])
        for name in sorted(self._rings or {}):
            ring = self._rings[name]
            ring[...] = link.bcast(ring, "the checkpoint gather", self.submitted,
                                   root=self._rank_of(self._ring_stage(name)))
        if self.readout is not None:
            ro = self.readout
            for k in range(K - 1):
                lo, hi = ro.ranges[k]
                for arr in (ro.model.flat, ro.M, ro.V):
                    arr[lo:hi] = link.bcast(arr[lo:hi], "the checkpoint gather", self.submitted,
                                            root=self._rank_of(k))
            arrays.update(ro.state())
        return arrays, meta

    def _ring_stage(self, name):
        """The stage whose rank holds ring ``name`` as one process would (a message: its writer)."""
        if name == "tokens":
            return 0
        k = int(name.lstrip("abcdefghijklmnopqrstuvwxyz"))
        return k + 1 if name.startswith("message") else k

    def close(self):
        try:
            super().close()
        finally:
            for reqs in self._mrecv.values():
                for req in reqs:
                    if req is not None:
                        req.Cancel()
                        req.Free()
            self._mrecv = {}
