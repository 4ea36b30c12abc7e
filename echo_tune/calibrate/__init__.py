"""Calibration: measure a cluster and fit the cost models' coefficients into a cluster profile.

* ``bench/``: ``echo-tune bench``, torch microbenchmarks launched by torchrun, writing ``calibration/<name>/raw/``.
* ``logs/``: measurements read from others' logs: nccl-tests outputs and Megatron-LM training logs.
* ``fit/``: ``echo-tune calibrate fit`` (least squares of the models in ``cost/collectives/comm.py`` and
  ``cost/kernels/compute.py``, or named physical parameters on training runs) and ``calibrate check``.
* ``datasheet``: the shipped, datasheet-derived (not measured) profiles in ``profiles/``.
"""
