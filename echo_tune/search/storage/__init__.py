"""Where a study lives: its journal or database, locks, leases and liveness, resuming and rerunning,
and the files --overwrite may remove.
"""
