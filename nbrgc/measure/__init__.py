"""What measures nbrgc, apart from what trains it: nothing here is imported by a training run.

* :mod:`~nbrgc.measure.bench`: speed and memory of the modes, side by side (``nbrgc-bench``).
* :mod:`~nbrgc.measure.study`: the convergence study of RGC against backprop (``nbrgc-study``).
* :mod:`~nbrgc.measure.stats`: the paired statistics behind the study's verdicts.
* :mod:`~nbrgc.measure.machine`: the machine description every report carries.
* :mod:`~nbrgc.measure.peers`: the optional eager-PyTorch peer the bench compares against.
* :mod:`~nbrgc.measure.runlog`: a run folder's ``log.jsonl`` read back as curves.
* :mod:`~nbrgc.measure.plot`: every picture (``nbrgc-plot``, the study's and the bench's).
"""
