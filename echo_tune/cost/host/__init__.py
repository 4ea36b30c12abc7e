"""The host: the time it takes to issue a kernel (fitted on published runs, with its command) and
where the GPU waits on it.
"""
