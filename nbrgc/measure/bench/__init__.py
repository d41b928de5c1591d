"""Speed and memory of the training modes, side by side (the engine of ``nbrgc-bench``).

Method (what the figures mean):

* Every (mode, round) runs in its own fresh Python process (``python -m nbrgc.measure.bench --worker
  SPEC``, :mod:`.worker`, started by :mod:`.launch`), so no mode inherits another's heap, page cache
  of kernels or thread pools. Rounds are interleaved (A B C, A B C, ...: :mod:`.plan`) so slow drifts
  of the machine hit every mode alike, and every mode gets the same thread budget (``--threads``;
  rgc-async splits it over its stages unless ``--stage-threads`` says otherwise).
* A worker builds the model and scheme through the library (``Model`` + ``make_scheme``, the same
  objects ``nbrgc.train`` drives), runs ``warmup_steps`` steps (kernel loading, first-touch page
  faults) and drains, then times ``steps`` steps: the clock starts before the first timed ``submit``
  and stops after ``drain()`` returns, so for rgc-async the span includes filling and emptying the
  pipeline, and tokens/s = tokens of completed steps / wall time. Batches are drawn inside the timed
  loop, as in training; evaluation and checkpoints are not part of it.
* Peak RSS is the worker process's own high-water mark from the OS: ``ru_maxrss`` of that one child
  from ``wait4`` (reported as ``peak_rss_mib``), with the worker's ``VmHWM`` and the resident size
  before the model was built alongside. It includes the interpreter, NumPy/Numba and the loaded
  kernels, which every mode pays alike.
* Model FLOPs per token are ``6*N + 6*L*T*d`` (:data:`FLOPS_FORMULA`, :mod:`.flops`), the same for
  every mode, so achieved GFLOP/s = FLOPs/token x tokens/s is proportional to throughput; RGC's
  extra work (each stage also runs the shared decoder) is reported separately as
  ``executed_flops_per_token``.
* The ratio of a mode's tokens/s to BP's is taken within each round (the two runs closest in time),
  then summarised over rounds (median, min, max: :mod:`.figures`); :mod:`.report` writes the
  markdown, :mod:`nbrgc.measure.plot` the picture.
"""
from .figures import aggregate, round_ratios
from .flops import (FLOPS_FORMULA, executed_flops_per_token, flops_per_token, gemm_shape_for,
                    non_embedding_params)
from .launch import launch
from .plan import (ALL_MODES, BASE, NBRGC_MODES, default_n_stages, interleaved, parse_attention,
                   parse_int_list, parse_modes, parse_stage_groups, parse_worker_sweep, plan_variants)
from .report import markdown, profile_table
from .run import run_bench, write_json

__all__ = ["ALL_MODES", "BASE", "FLOPS_FORMULA", "NBRGC_MODES", "aggregate", "default_n_stages",
           "executed_flops_per_token", "flops_per_token", "gemm_shape_for", "interleaved", "launch",
           "markdown", "non_embedding_params", "parse_attention", "parse_int_list", "parse_modes",
           "parse_stage_groups", "parse_worker_sweep", "plan_variants", "profile_table",
           "round_ratios", "run_bench", "write_json"]
