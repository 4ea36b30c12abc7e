"""Measured op times (Echo's profiling): collect the distinct traced ops of a set of layouts, time each
with real tensors on the local device, keep the times in an op-time database the simulator reads first.

The database itself, which the simulator reads, is a cost source and lives in ``cost/``
(``cost/optime/optime_db.py``, ``cost/optime/optime_device.py``: which device a time was measured on, and whether it is the
cluster's GPU); ``sim/outputs/optime_coverage.py`` checks a profile's database against the cluster. This package is
the tool that fills the database, over the public ``sim``, ``search`` and ``emulate`` APIs.
- ``collect.py``: the distinct op instances of a search space or a list of layouts.
- ``insitu.py``: op times measured in place in a real run of each shape's pieces, and the host overhead.
- ``measure.py``: time one op instance alone, rebuilt from its key (the fallback).
- ``profiler.py``: measure what the database lacks, with progress and resume.
"""
