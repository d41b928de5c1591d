"""Numba kernels (nogil, thread-safe building blocks) used by nbrgc."""
