"""Fitting a profile: least squares of the collective, compute and interference models to bench output
or nccl-tests logs, of named physical parameters to training runs, and the check on a held-out log.
"""
