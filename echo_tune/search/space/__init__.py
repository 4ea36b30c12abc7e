"""The search space: the space file and the automatic one, the layouts it holds (drawn or enumerated,
valid ones only), their Optuna parameters, labels and the layouts that can only be slower.
"""
