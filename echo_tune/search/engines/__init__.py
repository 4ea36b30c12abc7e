"""The ways a search runs: the default (auto), exhaustive, the Optuna samplers, sliced and shared
runs over worker processes, and the objective every one of them evaluates.
"""
