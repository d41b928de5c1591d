"""RGC stages on MPI ranks: rank r runs stages r*P .. r*P + P - 1 (P = n_stages / ranks) with the
single-process pipeline's stage loop; only what crosses a rank is replaced.

* Activations: the last local stage copies its output for step t into send slot t mod (S + 1) and
  sends it with ``Isend`` (the slot is reused once that send completed, S + 1 steps later); the first
  local stage keeps S + 1 ``Irecv`` posted ahead into its receive slots, so a transfer overlaps the
  receiver's compute of the earlier steps. These slots are the hand-off ring of one process, split
  at the rank boundary.
* Micro-batches: every rank's main thread draws the same batches (the batcher is seeded) and
  submits them; the first local stage takes its targets and learning rate from them. No tokens
  travel.
* Consensus: each round's K decoder-gradient slots are one (K, dec) array. The rank's last local
  poster of round t starts an in-place ``Iallgather`` of the slots (and of the stages' losses, norms
  and skip flags) and goes on; the round is completed by whichever worker first needs decoder
  version t + 1 (step t + 1 + S) or by a pause: it waits for the all-gather, averages the K slots in
  stage order and applies the decoder's AdamW itself. Waiting at the post instead would make the
  rank sit idle until the last rank finished step t, serialising the ranks whatever S is. That is
  the arithmetic of the single-process RGC buffer on the same operands, so every rank holds the same decoder versions, bit for bit, with no publish
  step and no owner of the decoder's optimizer state. Not an RMA window on an owner with
  ``MPI_Fetch_and_op``: the all-gather was chosen because it keeps the average order-fixed
  (a remote accumulate or an all-reduce sums in an order MPI chooses, which breaks bitwise
  equality with one process) and needs one collective a round instead of puts, a fetch-and-op and
  a get of the new version. It has not been timed against the RMA variant (see
  benchmarks/mpi.md).
* Staleness: unchanged. Step t of every stage reads decoder version max(0, t - S); a rank's
  versions appear when its closing worker finishes the round's all-gather, rounds in order.
* Pauses (evaluation, checkpoints, stops): after the pipeline drained, an all-gather of every
  rank's parameter segment gives every rank the whole model (each rank evaluates it; rank 0 reports
  and saves), and checkpoints gather the AdamW moments the same way, so a checkpoint is exactly a
  single-process rgc-async checkpoint.
"""
import collections
import threading

import numpy as np

from ..config import parse_stage_threads, resolve_stage_workers
from ..errors import ConfigError
from ..schemes.autotune import autotune_groups
from ..schemes.rgc_async import RGCAsync, _Stopped
from .link import Stopped


class RGCAsyncMPI(RGCAsync):
    def can_snapshot(self):
        return False  # a checkpoint gathers every rank's segment: it pauses (see state())

    def __init__(self, model, tc, link=None, **kw):
        super().__init__(model, tc, **kw)
        self.link = link
        R, r = link.size, link.rank
        P = self.K // R
        self.P = P
        self.local_stages = list(range(r * P, (r + 1) * P))
        explicit = parse_stage_threads(tc.stage_threads, self.K)
        if tc.stage_workers:
            self.W = min(tc.stage_workers, P)
        elif explicit is not None:
            self.W = P
        else:
            self.W = max(w for w in range(1, max(1, min(P, self.budget)) + 1) if P % w == 0)
        if explicit is not None:
            for w in range(self.W):
                mine = {explicit[k] for k in self.local_stages[w::self.W]}
                if len(mine) != 1:
                    raise ConfigError(f"stage_threads gives stages {self.local_stages[w::self.W]} (all on "
                                      f"worker {w} of rank {r}) different groups {sorted(mine)}")
        # parameter segment of each rank: its stages' blocks (rank 0 also the embeddings)
        seg = []
        for q in range(R):
            ks = range(q * P, (q + 1) * P)
            seg.append(self.ranges[ks[-1]][1] - self.ranges[ks[0]][0])
        self.segments = seg
        self.stage_last_step = {}       # stage -> the step it was running (for error messages)
        self._failed = False
        self._rreq = None
        self._sreq = None

    # ------------------------------------------------------------------ set-up
    def tune(self, B, T):
        if self.groups is None:
            local = self.local_stages
            if self.W < len(local):
                per, extra = divmod(self.budget, self.W)
                wg = [max(1, per + (w < extra)) for w in range(self.W)]
                mine = [wg[i % self.W] for i in range(len(local))]
            else:
                mine = autotune_groups(self.model, [self.stages[k] for k in local], self.budget, B, T,
                                       self.log)
            every = self.link.allgather_obj(mine, "stage-thread groups", 0)
            self.groups = [g for part in every for g in part]
        return self.groups

    def _alloc(self, B, T):
        super()._alloc(B, T)
        d, S = self.model.cfg.d_model, self.S
        b = self._buffers
        # receive and send slots at the rank boundaries (the ring's share across ranks)
        b["recv"] = np.zeros((S + 1, B * T, d), self.model.dtype) if self.local_stages[0] > 0 else None
        b["send"] = np.zeros((S + 1, B * T, d), self.model.dtype) if self.local_stages[-1] + 1 < self.K else None
        b["meta"] = np.zeros((S + 1, self.link.size, 3 * self.P))

    def _start(self, step0, B, T):
        self._rreq = None
        self._sreq = [None] * (self.S + 1)
        self._long_until = step0
        self._opened = step0                    # rounds whose all-gather this rank has started
        self._open_rounds = collections.deque()  # (t, lr, k, requests), oldest first
        self._finishing = threading.Lock()       # one finisher at a time: rounds finish in order
        super()._start(step0, B, T)

    # ------------------------------------------------------------------ hand-offs across ranks
    def _stopping(self):
        return self.stop

    def _mpi_wait(self, req, what, t, peer=None):
        try:
            self.link.wait(req, what, t, peer=peer, long=t <= self._long_until, stopping=self._stopping)
        except Stopped:
            raise _Stopped from None

    def _post_recv(self, t):
        b = self._buffers
        i = t % (self.S + 1)
        self._rreq[i] = self.link.irecv(b["recv"][i], self.link.rank - 1, tag=self.local_stages[0] - 1)

    def _receive(self, k, t, ws):
        if k != self.local_stages[0]:
            return super()._receive(k, t, ws)
        S = self.S
        if self._rreq is None:  # the first step since the start: post S + 1 receives ahead
            self._rreq = [None] * (S + 1)
            for s in range(t, t + S + 1):
                self._post_recv(s)
        i = t % (S + 1)
        self._mpi_wait(self._rreq[i], f"stage {k} waiting for stage {k - 1}'s activations", t,
                       peer=self.link.rank - 1)
        h = self.input_buffer(ws)
        h[...] = self._buffers["recv"][i]
        self._post_recv(t + S + 1)
        return h

    def _hand_on(self, k, t, out):
        if k != self.local_stages[-1]:
            return super()._hand_on(k, t, out)
        i = t % (self.S + 1)
        if self._sreq[i] is not None:
            self._mpi_wait(self._sreq[i], f"stage {k + 1} to take stage {k}'s activations", t,
                           peer=self.link.rank + 1)
        buf = self._buffers["send"][i]
        buf[...] = out
        self._sreq[i] = self.link.isend(buf, self.link.rank + 1, tag=k)

    def _close_round(self, t, lr, k):
        """Start round t's all-gather; :meth:`_finish_rounds` completes it. Rounds start in order on
        every rank: collectives on one communicator must."""
        b, P, link = self._buffers, self.P, self.link
        self._wait(lambda: self._opened >= t, k)
        r = t % (self.S + 1)
        local = self.local_stages
        meta = b["meta"][r]
        mine = meta[link.rank]
        mine[:P] = b["losses"][r, local]
        mine[P:2 * P] = b["norms"][r, local]
        mine[2 * P:] = b["skipped"][r, local]
        reqs = [link.iallgather(link.rounds, b["rgc"].slots[r], "consensus"),
                link.iallgather(link.rounds, meta, "control")]
        with self.cond:
            self._open_rounds.append((t, lr, k, reqs))
            self._opened = t + 1
            self.cond.notify_all()

    def _finish_rounds(self, upto):
        """Complete every started round before ``upto``, oldest first: wait for its all-gather, then
        average, update and publish the decoder version as one process does."""
        with self._finishing:
            while self._open_rounds and self._open_rounds[0][0] < upto:
                t, lr, k, reqs = self._open_rounds[0]
                for req in reqs:
                    self._mpi_wait(req, f"the consensus round of step {t}", t)
                super()._close_round(t, lr, k)
                self._open_rounds.popleft()

    def _gather_round(self, t, r, k):
        b, P = self._buffers, self.P
        meta = b["meta"][r]
        b["losses"][r, :] = meta[:, :P].ravel()
        b["norms"][r, :] = meta[:, P:2 * P].ravel()
        b["skipped"][r, :] = meta[:, 2 * P:].ravel() != 0

    def _step_begins(self, k, t):
        """What every stage step across ranks starts with (RGC's, and pipe-async's forward)."""
        self.stage_last_step[k] = t
        # the version step t reads, max(0, t - S), exists once rounds before t - S are finished;
        # finishing them here also frees their slots before this step writes round t's
        self._finish_rounds(t - self.S)

    def _stage_step(self, k, t):
        self._step_begins(k, t)
        return super()._stage_step(k, t)

    # ------------------------------------------------------------------ pauses and state
    def _raise_if_failed(self):
        if self.error is not None:
            self._failed = True
        return super()._raise_if_failed()

    def _gather_segments(self, flat, what):
        dec_lo = self.dec_lo
        self.link.allgatherv(flat[:dec_lo], self.segments, what, self.submitted)

    def drain(self):
        # the rounds no step needs yet: finish each as soon as this rank has started it
        try:
            while self._threads and self.version < self.submitted:
                with self.cond:
                    while not (self._opened > self.version or self.stop or self.error is not None):
                        self.cond.wait(0.05)
                if self.stop or self.error is not None:
                    break
                self._finish_rounds(self._opened)
        except _Stopped:
            pass
        out = super().drain()
        if not self._failed:
            # every rank's trained parameters into every rank's model (for evaluation and saving)
            self._gather_segments(self.model.flat, "the parameter gather of a pause")
            self._long_until = self.submitted
        return out

    def state(self):
        arrays, meta = super().state()
        self._gather_optimizers(meta, [self._rank_of(k) for k in range(self.K)] + [0])
        return arrays, meta

    def _rank_of(self, k):
        return k // self.P

    def _gather_optimizers(self, meta, owner):
        """Every rank's optimizer moments and step counts into this rank's checkpoint: ``owner``
        gives, per optimizer in ``meta["opt_steps"]`` order, the rank that steps it (the decoder's:
        any, every rank holds the same)."""
        self._gather_segments(self.M, "the checkpoint gather")
        self._gather_segments(self.V, "the checkpoint gather")
        steps = meta["opt_steps"]
        mine = {i: steps[i] for i in range(len(steps)) if owner[i] == self.link.rank}
        every = self.link.allgather_obj(mine, "the checkpoint gather", self.submitted)
        meta["opt_steps"] = [every[owner[i]][i] for i in range(len(steps))]

    def stage_profile(self):
        step, wait = np.array(self.stage_step_s), np.array(self.stage_wait_s)
        both = np.concatenate([step, wait])
        self.link.allreduce(both, "the stage-profile sum", self.submitted, kind="pause", long=True)
        step, wait = both[:self.K].tolist(), both[self.K:].tolist()
        return {"step_s": step, "wait_s": wait,
                "busy_frac": [(s - w) / s if s > 0 else None for s, w in zip(step, wait)]}

    def close(self):
        try:
            super().close()
        finally:
            for req in (self._rreq or []):
                if req is not None:
                    req.Cancel()
                    req.Free()
            self._rreq = None
