"""``echo-tune bench`` on the cluster being calibrated: the GEMM, attention, memory, collective and
interference microbenchmarks, what each plan measures, and the raw files they write.
"""
