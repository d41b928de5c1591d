"""The trainer on MPI ranks (``mpiexec -n R nbrgc-train ... --distributed mpi``).

Every rank runs the same loop (:class:`nbrgc.trainer.Trainer`) on the same batches; rank 0 alone
prints, logs, writes ``run.json`` and checkpoints, so its output is what one process prints. The
ranks agree after every step on whether to stop (``--time`` or a signal on any rank), so every
rank pauses, evaluates and stops at the same step. Evaluation runs on every rank with the whole
model (gathered at the pause): no rank waits for another's evaluation.

Failures end the job: a rank that raises prints one line naming itself and the step and calls
``MPI_Abort``; a rank that waits on a silent peer past the deadline does the same (see
:mod:`.link`); a rank that dies is seen by mpiexec, which stops the others.
"""
import os
import sys
from dataclasses import replace

import numpy as np

from ..atomic import write_json
from ..errors import NbrgcError, StageError
from ..threads import cpu_count
from ..trainer import Trainer
from .link import Link, Stopped


class AgreedError(NbrgcError):
    """An error every rank meets alike (a bad flag, a missing file): rank 0 reports it once."""


class RankFault:
    """NBRGC_FAULT under data-parallel BP: the STAGE field names the rank that fails."""

    def __init__(self, hook, rank):
        self.hook, self.rank = hook, rank

    def bind(self, model, ranges):
        if hasattr(self.hook, "bind"):
            self.hook.bind(model, ranges)

    def __call__(self, k, t):
        if k == 0:
            self.hook(self.rank, t)


class DistributedTrainer(Trainer):
    def __init__(self, *args, link=None, **kw):
        self.link = link
        self.scheme = None
        if link.rank:
            kw.update(progress=False, json_lines=False)
        super().__init__(*args, **kw)

    # rank 0 speaks for the job
    def info(self, msg):
        if self.link.rank == 0:
            super().info(msg)

    def emit(self, rec):
        if self.link.rank == 0:
            super().emit(rec)

    def _make_scheme(self, model):
        if self.tc.mode == "bp":
            from .dp import DataParallelBP
            self.scheme = DataParallelBP(model, self.tc, link=self.link)
        elif self.tc.pipe_rule:
            from .pipe import PipeAsyncMPI
            self.scheme = PipeAsyncMPI(model, self.tc, link=self.link, fault_hook=self.fault_hook,
                                       log=self.info)
        else:
            from .pipeline import RGCAsyncMPI
            self.scheme = RGCAsyncMPI(model, self.tc, link=self.link, fault_hook=self.fault_hook,
                                      log=self.info)
        return self.scheme

    def _agree_stop(self, step, time_up):
        """Stop for time, or for a signal, when any rank would: the flags' maximum over ranks."""
        flags = np.array([float(time_up), float(self._stop.is_set())])
        scheme = self.scheme
        try:
            self.link.allreduce(flags, "the stop agreement", step, kind="control", long=True,
                                op=self.link.MPI.MAX,
                                stopping=lambda: getattr(scheme, "error", None) is not None)
        except Stopped:
            scheme.poll()  # raises the local stage's failure
            raise
        if flags[1] and not self._stop.is_set():
            self.request_stop("stop requested on another rank")
        return bool(flags[0])

    def _agree(self, fn, what):
        """Run ``fn`` on rank 0 and hand its result (or its one-line error) to every rank."""
        out = None
        if self.link.rank == 0:
            try:
                out = ("ok", fn())
            except NbrgcError as exc:
                out = ("error", str(exc))
        out = self.link.bcast(out, what, 0)
        if out[0] == "error":
            raise AgreedError(out[1])
        return out[1]

    def _prepare_out(self):
        self._agree(lambda: Trainer._prepare_out(self), "the run folder")
        if self.link.rank and self.out is not None:
            os.makedirs(self.out, exist_ok=True)

    def _save(self, model, scheme, batches, step):
        if self.out is None:
            return None
        arrays, meta = scheme.state()  # every rank: RGC gathers the optimizer state here
        if self.link.rank:
            return None
        return self.write_checkpoint(step, arrays, meta, model.flat, batches.state())


def _failed_step(trainer, exc):
    scheme = trainer.scheme if trainer is not None else None
    if scheme is None:
        return 0
    if isinstance(exc, StageError):
        return getattr(scheme, "stage_last_step", {}).get(exc.stage, scheme.submitted)
    return getattr(scheme, "last_step", None) or getattr(scheme, "submitted", 0)


def _load_data(a, tc, mcfg, link):
    """Rank 0 first (it may download), then the others from its cache."""
    from ..data import load_dataset

    def load(log):
        return load_dataset(a.dataset, data_dir=a.data_dir, log=log, seq=tc.seq or mcfg.ctx)
    err = None
    if link.rank == 0:
        try:
            ds = load(lambda m: print(m, file=sys.stderr))
        except NbrgcError as exc:
            err = str(exc)
    err = link.bcast(err, "the dataset", 0)
    if err is not None:
        raise AgreedError(err)
    if link.rank:
        ds = load(lambda m: None)
    return ds


def bytes_report(link, steps):
    """Per rank: bytes sent by kind, in all and per trained step (pauses apart)."""
    every = link.allgather_obj(dict(link.sent), "the byte counts", steps)
    per_step = [{k: v / steps for k, v in sent.items() if k != "pause"} if steps else {} for sent in every]
    return {"ranks": link.size, "steps": steps, "bytes_sent": every, "bytes_sent_per_step": per_step}


def run_ranks(mcfg, tc, a, fault_hook):
    from .launch import check_fit, init, ranks_on_this_host
    comm = init()
    link = Link(comm)
    trainer = None
    try:
        try:
            check_fit(tc.mode, link.size, tc.n_stages, tc.batch)
        except NbrgcError as exc:
            raise AgreedError(str(exc)) from None
        if not tc.threads:  # the cores of this machine, shared by the ranks on it
            tc = replace(tc, threads=max(1, cpu_count() // ranks_on_this_host(comm)))
        if fault_hook is not None and tc.mode == "bp":
            fault_hook = RankFault(fault_hook, link.rank)
        ds = _load_data(a, tc, mcfg, link)
        trainer = DistributedTrainer(mcfg, tc, ds, a.out, resume=a.resume, force=a.force,
                                     json_lines=a.json, progress=not a.quiet, data_spec=a.dataset,
                                     max_memory=None if a.max_memory is None else a.max_memory * 2**20,
                                     time_limit=a.time, fault_hook=fault_hook, link=link)
        summary = trainer.run()
        report = bytes_report(link, summary["tokens"] // (tc.batch * trainer.seq))
        if link.rank == 0:
            per = ", ".join(f"rank {r} " + " + ".join(f"{k} {v / 1e6:.3f} MB" for k, v in sorted(d.items()))
                            for r, d in enumerate(report["bytes_sent_per_step"]))
            trainer.info(f"mpi: {link.size} ranks; bytes sent per step: {per}")
            if a.out is not None:
                write_json(os.path.join(a.out, "mpi.json"), dict(report, mode=tc.mode, n_stages=tc.n_stages))
        return 0
    except AgreedError as exc:
        if link.rank == 0:
            raise NbrgcError(str(exc)) from None
        return 2
    except BaseException as exc:  # noqa: BLE001 - any failure of one rank ends the job
        what = str(exc) if isinstance(exc, NbrgcError) else f"{type(exc).__name__}: {exc}"
        line = " ".join(f"error: rank {link.rank} at step {_failed_step(trainer, exc)}: {what}".split())
        print(line, file=sys.stderr, flush=True)
        import time
        time.sleep(1.0)  # mpiexec forwards output asynchronously: let the line out before the abort
        link.abort(1)
