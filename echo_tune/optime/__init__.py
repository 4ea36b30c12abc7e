"""Measured op times (Echo's profiling): collect the distinct traced ops of a set of layouts, time each
with real tensors on the local device, keep the times in an op-time database the simulator reads first.

- ``device.py``: which device a time was measured on, and whether it is the cluster's GPU.
- ``db.py``: the SQLite op-time database (``calibration/<cluster>/optime.sqlite``).
- ``collect.py``: the distinct op instances of a search space or a list of layouts.
- ``insitu.py``: op times measured in place in a real run of each shape's pieces, and the host overhead.
- ``measure.py``: time one op instance alone, rebuilt from its key (the fallback).
- ``profiler.py``: measure what the database lacks, with progress and resume.
"""
