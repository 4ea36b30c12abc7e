"""Calibration: measure a cluster and fit the cost models' coefficients (issue #4).

* ``microbench`` (+ ``bench_compute``, ``bench_comm``, ``plans``, ``raw``): ``echo-tune bench``,
  torch microbenchmarks launched by torchrun, writing ``calibration/<name>/raw/``.
* ``nccl_tests``: a parser for every nccl-tests output layout.
* ``fit`` (+ ``fit_comm``, ``fit_compute``, ``results``): ``echo-tune calibrate fit``, least squares
  of the models in ``cost/collectives/comm.py`` and ``cost/kernels/compute.py``, written as a profile YAML.
* ``check``: ``echo-tune calibrate check``, a profile against a log it was not fitted on.
* ``datasheet``: the shipped, datasheet-derived (not measured) profiles in ``profiles/``.
"""
