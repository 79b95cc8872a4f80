"""Benchmarks: python -m bench {decode,edit,speculative,rollback,verify,plots}."""

import engine  # noqa: F401  (sets the BLAS environment before anything loads NumPy)
