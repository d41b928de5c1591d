"""The runtime every asynchronous stage pipeline shares: worker threads with their own thread groups,
waiting on earlier steps, freezing for an evaluation, failure and shutdown. A scheme built on it
(:class:`~nbrgc.schemes.rgc_async.RGCAsync`, :class:`~nbrgc.schemes.pipe_async.PipeAsync`) supplies
the rule: ``phases_at(t)``, the actions of step t, each ``(method name, +1 or -1)``: a worker runs each
action for its stages in ascending (+1) or descending (-1) stage order, all stages' first action
before any second one. RGC has one, ``_stage_step(k, t)``: what stage k does at step t and which
step's input, decoder version and round it reads. Every wait of an action must be on an action
that comes earlier in the order (step, action, stage in that action's order): then the earliest
unfinished action can always go on, and any number of workers runs without deadlock. The scheme
also supplies its buffers (``_buffers["ws"]``, one workspace per worker) and its state.

Its attributes, set by the scheme's constructor and ``_start``: ``local_stages`` (the stages this
process runs), ``W`` workers (stage k on worker ``worker_of(k)``), ``groups`` (threads per stage),
``cond`` (the one Condition every wait uses), ``stop``, ``error``, ``results`` (a Queue of
StepResults in step order), ``next_result``, ``freezing`` and ``_where`` (per worker, see
:meth:`StageRuntime.freeze`), ``stage_step_s``/``stage_wait_s``, ``started_at``.

Waiting uses one Condition with short timeouts, so a failing stage stops every other promptly.
"""
import queue
import time

from ..errors import NbrgcError, StageError
from ..threads import set_threads

_WAIT = 0.05


class _Stopped(Exception):
    pass


class StageRuntime:
    """Mixin of the worker-thread runtime (see the module docstring)."""

    phases = (("_stage_step", 1),)

    def phases_at(self, t):
        """The actions of step t (the same for every step unless a rule says otherwise)."""
        return self.phases

    def worker_stages(self, w):
        return self.local_stages[w::self.W]

    def worker_of(self, k):
        return (k - self.local_stages[0]) % self.W

    def poll(self):
        out = []
        while True:
            try:
                out.append(self.results.get_nowait())
            except queue.Empty:
                break
        if out:
            self.next_result = out[-1].step + 1  # rounds close in order
        self._raise_if_failed()
        return out

    def results_through(self, step):
        """The results not yet returned, up to that of step ``step - 1`` (waiting for it, which
        needs only submitted steps): an evaluation of boundary ``step`` is reported after them."""
        out = []
        while self.next_result < step:
            self._raise_if_failed()
            try:
                res = self.results.get(timeout=_WAIT)
            except queue.Empty:
                if not self._threads:
                    break
                continue
            out.append(res)
            self.next_result = res.step + 1
        self._raise_if_failed()
        return out

    def freeze(self):
        """Hold every worker where it computes nothing (before a stage step, or waiting on an
        earlier step) and return a workspace no worker is using, for an evaluation on the whole
        thread budget while the pipeline stays full. The workers' next steps are the ones they
        would have run anyway, so the trajectory is unchanged; :meth:`unfreeze` lets them go on.

        A free workspace exists once all are held: the worker of the earliest unfinished
        (step, stage) waits on nothing earlier, so it is held before that step, not inside it."""
        with self.cond:
            self.freezing = True
            self.cond.notify_all()
            while True:
                if self.stop or not self._threads:
                    self.freezing = False
                    break
                ws = self._held_workspace()
                if ws is not None:
                    return ws
                self.cond.wait(_WAIT)
        self._raise_if_failed()
        raise NbrgcError("rgc-async: the workers stopped while the pipeline was being frozen")

    def unfreeze(self):
        with self.cond:
            self.freezing = False
            self.cond.notify_all()

    def _held_workspace(self):
        """Under ``self.cond``: a free worker's workspace once every worker is held, else None."""
        free = None
        for w, where in enumerate(self._where):
            if where is None:
                return None  # computing
            if isinstance(where, tuple):
                pred, holds_ws = where
                if pred():
                    return None  # about to go on
                if holds_ws:
                    continue
            if free is None:
                free = w
        if free is None:  # pragma: no cover - excluded by the argument in freeze's docstring
            raise NbrgcError("rgc-async: every worker holds its workspace while frozen")
        return self._buffers["ws"][free]

    def _park(self, w):
        """Where a worker may be held by :meth:`freeze`: before a stage step."""
        with self.cond:
            if self.freezing:
                self._where[w] = "parked"
                self.cond.notify_all()
                while self.freezing:
                    if self.stop:
                        raise _Stopped
                    self.cond.wait(_WAIT)
            self._where[w] = None

    def close(self):
        self._shutdown()

    def _shutdown(self):
        with self.cond:
            self.stop = True
            self.cond.notify_all()
        inq = getattr(self, "_inq", None)
        if inq is not None:  # wake stage 0 at once rather than at its next poll (up to _WAIT later)
            try:
                inq.put_nowait(None)
            except queue.Full:
                pass  # then stage 0 is not blocked on it
        deadline = time.monotonic() + 10.0
        for th in self._threads:
            th.join(timeout=max(0.0, deadline - time.monotonic()))
        alive = [th.name for th in self._threads if th.is_alive()]
        self._threads = []
        if alive:  # pragma: no cover - a kernel that never returns
            raise NbrgcError(f"rgc-async workers did not stop: {', '.join(alive)}")

    def _raise_if_failed(self):
        if self.error is not None:
            k, exc = self.error
            self.error = None
            self._shutdown()
            raise StageError(k, exc) from exc

    def _wait(self, pred, k, holds_ws=True):
        """Wait for ``pred`` (on an earlier step). ``holds_ws``: whether the worker's workspace is
        in use meanwhile (a :meth:`freeze` may lend it out only if not)."""
        t0 = time.perf_counter()
        w = self.worker_of(k)
        try:
            with self.cond:
                if not pred():
                    self._where[w] = (pred, holds_ws)
                    if self.freezing:
                        self.cond.notify_all()
                    while not pred():
                        if self.stop:
                            raise _Stopped
                        self.cond.wait(_WAIT)
                    self._where[w] = None
                if self.stop:
                    raise _Stopped
        finally:
            self.stage_wait_s[k] += time.perf_counter() - t0

    def stage_profile(self):
        """{"step_s", "wait_s", "busy_frac"} per stage since the workers last started: where the
        pipeline's time went (a stage that is rarely busy waits on a slower neighbour)."""
        step, wait = list(self.stage_step_s), list(self.stage_wait_s)
        return {"step_s": step, "wait_s": wait,
                "busy_frac": [(s - w) / s if s > 0 else None for s, w in zip(step, wait)]}

    # ------------------------------------------------------------------ the stage loop
    def _worker(self, w):
        k = w  # the stage a failure is reported against (the one running, once one runs)
        try:
            mine = self.worker_stages(w)
            set_threads(self.groups[mine[0]])
            t = self.started_at
            plans = {}  # the actions of a step, resolved once per distinct phase list
            while True:
                spec = self.phases_at(t)
                if spec not in plans:
                    plans[spec] = [(getattr(self, name), mine if order > 0 else mine[::-1])
                                   for name, order in spec]
                for action, stages in plans[spec]:
                    for k in stages:
                        self._park(w)
                        t0 = time.perf_counter()
                        try:
                            action(k, t)
                        finally:
                            self.stage_step_s[k] += time.perf_counter() - t0
                t += 1
        except _Stopped:
            return
        except BaseException as exc:  # noqa: BLE001 - handed to the main thread with the stage named
            with self.cond:
                if self.error is None:
                    self.error = (k, exc)
                self.stop = True
                self.cond.notify_all()
