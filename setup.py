"""Builds the optional C kernel kernels._qmatmul; pyproject.toml holds the metadata.

The kernel is built for the machine that builds it (-march=native / -mcpu=native: this
is a local install; BRANCHCHAT_PORTABLE_BUILD=1 leaves the flag out for a build meant for
other machines). `optional=True`: a failed build leaves the NumPy path in place, so
`pip install -e .` never fails for want of a compiler. Its sources are kernels/csrc/*.c
(one file per concern, sharing kernels/csrc/qmatmul.h).
"""

from __future__ import annotations

import os
import platform
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


class BuildQmatmul(build_ext):
    """Adds optimisation, target-CPU and thread flags for the compiler at hand."""

    def build_extensions(self) -> None:
        if self.compiler.compiler_type == "msvc":
            compile_args, link_args = ["/O2"], []
        else:
            # hidden: the files' shared entry points stay inside the extension
            compile_args = ["-O3", "-std=c11", "-pthread", "-fvisibility=hidden"]
            link_args = ["-pthread"]
            if not os.environ.get("BRANCHCHAT_PORTABLE_BUILD"):
                is_x86 = platform.machine().lower() in ("x86_64", "amd64", "i386", "i686")
                if is_x86:
                    compile_args.append("-march=native")
                elif sys.platform != "darwin":  # Apple clang targets the build CPU already
                    compile_args.append("-mcpu=native")
        for ext in self.extensions:
            ext.extra_compile_args = compile_args
            ext.extra_link_args = link_args
        super().build_extensions()


setup(
    ext_modules=[
        Extension(
            "kernels._qmatmul",
            [
                f"kernels/csrc/{name}.c"
                for name in (
                    "matmul",
                    "matmul_any",
                    "attention",
                    "attention_prefill",
                    "attention_avx2",
                    "pool",
                    "int8_quant",
                    "int8_matmul",
                    "step",
                    "int8_module",
                    "step_module",
                    "module",
                )
            ],
            depends=[
                "kernels/csrc/qmatmul.h",
                "kernels/csrc/attention.h",
                "kernels/csrc/int8.h",
                "kernels/csrc/int8_ymm.h",
                "kernels/csrc/step.h",
            ],
            optional=True,
        )
    ],
    cmdclass={"build_ext": BuildQmatmul},
)
