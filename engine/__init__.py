"""The inference engine: models, loaders, tokenizer, state and rollback, sampling,
speculative decoding and the engine thread. Never imports Qt."""

import os

# OpenBLAS (NumPy's BLAS, used for prefill chunks on the CPU) busy-waits ~0.1 s after
# each call by default, competing with the decode kernel's own threads and the window;
# a short spin lets its threads sleep (on 2 cores beside another busy process, decode
# and prefill ran faster and steadier with it). Read when NumPy loads OpenBLAS, so it is
# set before anything imports NumPy.
os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")
