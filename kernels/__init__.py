"""Numeric kernels the models call, each beside a plain reference it is tested against."""
