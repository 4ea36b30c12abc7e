"""Measured op times: the database `echo-tune profile` writes, the device it was measured on, and
the bounds a measured time must keep.
"""
