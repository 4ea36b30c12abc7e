"""The cost models: what a traced op, a collective or the host that issues them costs on a cluster, read from
the cluster profile (datasheet-derived, calibrated or fitted, each labelled).
"""
