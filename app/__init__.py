"""The PySide6 application."""

import engine  # noqa: F401  (sets the BLAS environment before anything loads NumPy)
