"""Benchmarks: python -m bench {decode,edit,speculative,rollback,verify,plots}."""
