"""What a search writes and reports: trials.csv, best.json, the Megatron arguments, the Pareto
front, the summary and the coverage notes.
"""
