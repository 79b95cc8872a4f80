"""The inference engine: models, loaders, tokenizer, state and rollback, sampling,
speculative decoding and the engine thread. Never imports Qt."""

import os

# OpenBLAS (NumPy's BLAS, used for prefill chunks on the CPU) busy-waits ~0.1 s after
# each call by default, competing with the decode kernel's own threads and the window;
# a short spin lets its threads sleep (measured on 2 cores under load: decode +12%,
# prefill steadier). Read when NumPy loads OpenBLAS, so set before anything imports it.
os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")
