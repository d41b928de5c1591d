"""The convergence study behind ``nbrgc-study``: is bounded-horizon RGC non-inferior to backprop at
a margin, with every arm at its own tuned learning rate and backprop converged?

* :mod:`~nbrgc.measure.study.arms`: the arms (bp, rgc-sync, rgc-async, S = 0 and the variants) as
  TrainConfig overrides, and the parsing of arms, seeds and learning rates.
* :mod:`~nbrgc.measure.study.fingerprint`: the numerics version in every run's cache key.
* :mod:`~nbrgc.measure.study.plan`: the plan (sweep, then paired main runs) and the key each
  result is filed under.
* :mod:`~nbrgc.measure.study.protocol`: running it: the child processes, twin arms, resumption and
  signals.
* :mod:`~nbrgc.measure.study.runner`: one run in its own process (train or resume, score the test split).
* :mod:`~nbrgc.measure.study.report`: study.json, study.md and curves.png (drawn by
  :mod:`nbrgc.measure.plot`).
"""
from .arms import ARMS, BASE, parse_arms, parse_lrs, parse_seeds, train_config
from .plan import PHASES, StudyPlan, best_of
from .protocol import Study, StudyInterrupted
from .report import convergence, last20_rel_improvement, markdown, value_at, verdicts

__all__ = ["ARMS", "BASE", "PHASES", "Study", "StudyInterrupted", "StudyPlan", "best_of", "convergence",
           "last20_rel_improvement", "markdown", "parse_arms", "parse_lrs", "parse_seeds",
           "train_config", "value_at", "verdicts"]
