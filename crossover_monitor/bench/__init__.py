"""Timing matrix multiplication: the backend contract, the timing loop, the backends and the worker."""
