"""Fixtures the kernel tests share."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from kernels import qmatmul


@pytest.fixture(params=["avx512", "avx2", "generic"])
def code_path(request: pytest.FixtureRequest) -> Iterator[str]:
    """Each test runs on every code path of the float kernel and the attention the build
    has (the machine picks the best); the path in use is restored afterwards."""
    ext = qmatmul._ext
    if ext is None:
        pytest.skip("kernels._qmatmul is not built")
    if request.param not in ext.info()["built"]:
        pytest.skip(f"built without the {request.param} code path")
    best = ext.info()["isa"]
    ext.set_isa(request.param)
    yield request.param
    ext.set_isa(best)
