"""Recipe features that change a step's schedule or memory: CUDA graphs, activation offloading,
deferred wgrad, the EP all-to-all overlap, deterministic mode, --test-mode's checks.
"""
