"""The engine's configuration: one frozen `EngineConfig`, built once at an edge (the CLI,
the app, the bench, a test) and handed down to the loader, the runner and the session.

`EngineConfig.from_environment` reads the `BRANCHCHAT_*` variables; nothing below the
edge reads the environment. `configure_process` applies the process-wide part, and
must run before anything imports NumPy (it sets variables OpenBLAS reads as it loads),
which is why neither importing this module nor building a config loads NumPy.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from engine.state import SnapshotPolicy

BACKENDS = ("numpy", "mlx")
DTYPES = ("bfloat16", "float16", "float32")
KV_DTYPES = ("float16", "float32")
FUSED_MODES = ("step", "layers")
CPU_MATMULS = ("int8", "float")
GPU_MATMULS = ("quantized", "dense32", "dense16", "quantized16")
GDN_PREFILLS = ("chunked", "recurrent")


@dataclass(frozen=True)
class EngineConfig:
    backend: str | None = None  # "numpy" or "mlx"; None: by MLX's default device
    dtype: str | None = None  # the MLX compute dtype; None: float32 on a CPU, bfloat16 on a GPU
    fused: bool = True  # the fused CUDA kernels for small full-attention models on CUDA
    fused_mode: str | None = None  # "step" (one launch) or "layers"; None: "step" where it runs
    fused_compile: bool = True  # trace the five-kernel step once with mx.compile
    # the one-launch step kernel's build knobs, "NAME=VALUE,..." over
    # kernels/fused_step_cuda.py's TUNING (each keeps a row's bits); None: TUNING's values
    step_tuning: str | None = None
    # a hybrid's (Qwen3.5) decode through the one-launch step; None: the runner's default
    hybrid_step: bool | None = None
    # Gemma 3's decode through the one-launch step; None: the runner's default
    gemma_step: bool | None = None
    qmatmul: bool | None = None  # the CPU C kernel for packed weights; None: where SIMD was built
    # how that kernel multiplies: "int8" (activations quantized to int8 blocks, integer dot
    # products, kernels/int8_matmul.py) or "float" (weights dequantized to float32 in
    # registers, kernels/qmatmul.py); None: "int8" where an int8 SIMD path runs
    cpu_matmul: str | None = None
    # how a GPU multiplies a prefill chunk's rows by a quantized weight (kernels/ops_mlx.py):
    # "quantized" (MLX's quantized_matmul on float32 rows), "dense32" (the weight
    # dequantized to float32, one float32 GEMM), "dense16" (rows and weight in the compute
    # dtype) or "quantized16" (quantized_matmul on rows rounded to the compute dtype);
    # None: the default, quantized16
    gpu_matmul: str | None = None
    # whether a GPU forward hands each layer's rows to the device as soon as they are built,
    # so the device computes while Python builds the next layer; None: the default
    # (kernels/ops_mlx.py's OVERLAP_LAYERS)
    gpu_overlap: bool | None = None
    # how a GPU prefill chunk runs a hybrid's Gated DeltaNet recurrence: "chunked" (the
    # chunked form's matmuls, kernels/gated_delta_mlx.py) or "recurrent" (the CUDA kernel's
    # row by row, kernels/gated_delta_cuda.py; MLX on CUDA only); None: "recurrent" where
    # MLX runs on CUDA, else "chunked"
    gdn_prefill: str | None = None
    # rows a prefill chunk carries (None: the runner's default for its device, see
    # engine/runner/runner.py); the C step still cuts them into its own pieces
    prefill_chunk: int | None = None
    threads: int | None = None  # the C kernel's threads; None: the cores this process may use
    cpu_step: bool = True  # NumPy backend: decode and verify rows as one C call (cpu_step.py)
    # what the NumPy backend stores K/V rows in (None: float16, each row rounded once when
    # written; halves the bytes a long-context step reads); MLX keeps K/V in its compute
    # dtype, and refuses another value at load
    kv_dtype: str | None = None
    blas_threads: int | None = None  # OpenBLAS / OpenMP threads; None: their own default
    # None: SnapshotPolicy()'s defaults (engine.state loads NumPy, so none is built here)
    snapshot_policy: SnapshotPolicy | None = None
    # one budget over the live state, snapshots, branch cache and drafter index
    # (engine/memory.py says what is evicted first); None: a quarter of physical memory
    memory_budget_bytes: int | None = None
    # where conversations' computed state survives a restart, a folder per model (None: it
    # does not); the CLI and the app pass `default_prompt_cache_dir()`
    prompt_cache_dir: str | None = None
    # the trained block drafter (engine/block_drafter.py): None, the one shipped for the
    # loaded model where there is one; "off"; or a drafter file's path
    block_drafter: str | None = None
    drafter_compile: bool = True  # its pass as one call: traced on an MLX GPU, C on NumPy
    # whether Auto pools it with prompt lookup (None or False: not). Nowhere was it
    # measured paying beside lookup alone since lookup's drafts carry a confidence by match
    # length (the CPU, session 28: greedy open chat 1.19x against lookup's 1.20x, mixed
    # 1.39x against 1.45x, sampled below lookup on four of four; a GPU: never),
    # docs/BENCHMARKS.md. The "block" choice pools it whatever this says.
    auto_block: bool | None = None
    # on MLX, each plain step queued before the host reads the token it takes
    # (engine/runner/ahead.py); off: one forward a step, each token read first
    queue_steps: bool = True
    # on an MLX GPU, a short prompt's forwards run once at load (ModelRunner.warm_up), so
    # the kernels a first prompt needs are compiled while the model loads, not while
    # someone waits for a first reply; off: they compile in the first request
    warm_up: bool = True

    def __post_init__(self) -> None:
        if self.backend is not None and self.backend not in BACKENDS:
            raise ValueError(f"backend must be 'numpy' or 'mlx', not {self.backend!r}")
        if self.dtype is not None and self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {sorted(DTYPES)}, not {self.dtype!r}")
        if self.fused_mode is not None and self.fused_mode not in FUSED_MODES:
            raise ValueError(f"fused_mode must be 'step' or 'layers', not {self.fused_mode!r}")
        if self.cpu_matmul is not None and self.cpu_matmul not in CPU_MATMULS:
            raise ValueError(f"cpu_matmul must be 'int8' or 'float', not {self.cpu_matmul!r}")
        if self.gpu_matmul is not None and self.gpu_matmul not in GPU_MATMULS:
            raise ValueError(
                f"gpu_matmul must be one of {list(GPU_MATMULS)}, not {self.gpu_matmul!r}"
            )
        if self.gdn_prefill is not None and self.gdn_prefill not in GDN_PREFILLS:
            raise ValueError(
                f"gdn_prefill must be one of {list(GDN_PREFILLS)}, not {self.gdn_prefill!r}"
            )
        if self.kv_dtype is not None and self.kv_dtype not in KV_DTYPES:
            raise ValueError(f"kv_dtype must be one of {list(KV_DTYPES)}, not {self.kv_dtype!r}")
        for name in ("threads", "blas_threads", "prefill_chunk"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"{name} must be a positive integer, not {value!r}")
        budget = self.memory_budget_bytes
        if budget is not None and (not isinstance(budget, int) or budget < 0):
            raise ValueError(f"memory_budget_bytes must be >= 0 or None, not {budget!r}")
        if self.block_drafter is not None and not str(self.block_drafter).strip():
            raise ValueError("block_drafter must be 'off' or a drafter file's path")
        if self.prompt_cache_dir is not None and not str(self.prompt_cache_dir).strip():
            raise ValueError("prompt_cache_dir must name a folder (None turns the cache off)")

    @classmethod
    def from_environment(
        cls, environ: Mapping[str, str] | None = None, **overrides: Any
    ) -> EngineConfig:
        """The BRANCHCHAT_* variables of `environ` (default: this process's), with
        `overrides` (field=value, from flags or settings) taking precedence. An override
        of None counts as not given, so argparse's defaults can be passed as they are; a
        variable whose field is overridden is not read (nor validated)."""
        env = os.environ if environ is None else environ
        given = {name: value for name, value in overrides.items() if value is not None}
        unknown = sorted(set(given) - {f.name for f in fields(cls)})
        if unknown:
            raise TypeError(f"EngineConfig has no field(s) {', '.join(unknown)}")
        values = {
            name: parse(env.get(variable, ""))
            for name, (variable, parse) in _VARIABLES.items()
            if name not in given
        }
        return cls(**{**values, **given})


def _backend(value: str) -> str | None:
    if value and value not in BACKENDS:
        raise ValueError(f"BRANCHCHAT_BACKEND must be 'numpy' or 'mlx', not {value!r}")
    return value or None


def _dtype(value: str) -> str | None:
    # BRANCHCHAT_DTYPE=float32 on a GPU: bit-stable greedy speculation for comparisons
    if value and value not in DTYPES:
        raise ValueError(f"BRANCHCHAT_DTYPE must be one of {sorted(DTYPES)}, not {value!r}")
    return value or None


def _fused_mode(value: str) -> str | None:
    if value and value not in FUSED_MODES:
        raise ValueError(f"BRANCHCHAT_FUSED_MODE must be 'step' or 'layers', not {value!r}")
    return value or None


def _step_tuning(value: str) -> str | None:
    value = value.strip()
    if value:
        parse_step_tuning(value)
    return value or None


def parse_step_tuning(value: str) -> dict[str, int]:
    """ "NAME=VALUE,..." as integers by name (the kernel module checks the names)."""
    knobs: dict[str, int] = {}
    for item in value.split(","):
        name, sep, number = item.strip().partition("=")
        if not sep or not name or not number.strip().lstrip("-").isdigit():
            raise ValueError(f"BRANCHCHAT_STEP_TUNING must be NAME=INTEGER,..., not {value!r}")
        knobs[name.strip()] = int(number)
    return knobs


def _kv_dtype(value: str) -> str | None:
    if value and value not in KV_DTYPES:
        raise ValueError(f"BRANCHCHAT_KV_DTYPE must be one of {list(KV_DTYPES)}, not {value!r}")
    return value or None


def _on_unless_zero(value: str) -> bool:
    return value != "0"


def _qmatmul(value: str) -> bool | None:
    if value not in ("", "0", "1"):
        raise ValueError(f"BRANCHCHAT_QMATMUL must be 0 or 1, not {value!r}")
    return None if not value else value == "1"


def _cpu_matmul(value: str) -> str | None:
    if value and value not in CPU_MATMULS:
        raise ValueError(f"BRANCHCHAT_CPU_MATMUL must be 'int8' or 'float', not {value!r}")
    return value or None


def _gpu_overlap(value: str) -> bool | None:
    if value not in ("", "0", "1"):
        raise ValueError(f"BRANCHCHAT_GPU_OVERLAP must be 0 or 1, not {value!r}")
    return None if not value else value == "1"


def _gdn_prefill(value: str) -> str | None:
    if value and value not in GDN_PREFILLS:
        raise ValueError(
            f"BRANCHCHAT_GDN_PREFILL must be one of {', '.join(GDN_PREFILLS)}, not {value!r}"
        )
    return value or None


def _step_opt_in(name: str) -> Any:
    def parse(value: str) -> bool | None:
        if value not in ("", "0", "1"):
            raise ValueError(f"{name} must be 0 or 1, not {value!r}")
        return None if not value else value == "1"

    return parse


def _gpu_matmul(value: str) -> str | None:
    if value and value not in GPU_MATMULS:
        raise ValueError(f"BRANCHCHAT_GPU_MATMUL must be one of {list(GPU_MATMULS)}, not {value!r}")
    return value or None


def _prefill_chunk(value: str) -> int | None:
    if value and not (value.isdigit() and int(value) > 0):
        raise ValueError(f"BRANCHCHAT_PREFILL_CHUNK must be a positive integer, not {value!r}")
    return int(value) if value else None


def _threads(value: str) -> int | None:
    if not value:
        return None
    if not value.isdigit() or int(value) < 1:
        raise ValueError(f"BRANCHCHAT_THREADS must be a positive integer, not {value!r}")
    return int(value)


def _byte_size(value: str) -> int | None:
    """ "4G", "512M", "1048576": a size in bytes (K, M, G, T: powers of 1024)."""
    text = value.strip().upper().removesuffix("B").removesuffix("I")
    if not text:
        return None
    scale = 1 << (10 * " KMGT".index(text[-1])) if text[-1] in "KMGT" else 1
    number = text[:-1] if scale > 1 else text
    try:
        size = float(number)
    except ValueError:
        size = -1.0
    if not 0 <= size < 1 << 60:  # NaN and infinity fail this too
        raise ValueError(f"BRANCHCHAT_MEMORY_BUDGET must be a size such as 4G, not {value!r}")
    return int(size * scale)


# field -> (the variable that sets it, its parser from the variable's text; "" when unset)
_VARIABLES = {
    "backend": ("BRANCHCHAT_BACKEND", _backend),
    "dtype": ("BRANCHCHAT_DTYPE", _dtype),
    "fused": ("BRANCHCHAT_FUSED", _on_unless_zero),
    "fused_mode": ("BRANCHCHAT_FUSED_MODE", _fused_mode),
    "fused_compile": ("BRANCHCHAT_FUSED_COMPILE", _on_unless_zero),
    "step_tuning": ("BRANCHCHAT_STEP_TUNING", _step_tuning),
    "hybrid_step": ("BRANCHCHAT_HYBRID_STEP", _step_opt_in("BRANCHCHAT_HYBRID_STEP")),
    "gemma_step": ("BRANCHCHAT_GEMMA_STEP", _step_opt_in("BRANCHCHAT_GEMMA_STEP")),
    "qmatmul": ("BRANCHCHAT_QMATMUL", _qmatmul),
    "cpu_matmul": ("BRANCHCHAT_CPU_MATMUL", _cpu_matmul),
    "gpu_matmul": ("BRANCHCHAT_GPU_MATMUL", _gpu_matmul),
    "gpu_overlap": ("BRANCHCHAT_GPU_OVERLAP", _gpu_overlap),
    "gdn_prefill": ("BRANCHCHAT_GDN_PREFILL", _gdn_prefill),
    "prefill_chunk": ("BRANCHCHAT_PREFILL_CHUNK", _prefill_chunk),
    "threads": ("BRANCHCHAT_THREADS", _threads),
    "cpu_step": ("BRANCHCHAT_CPU_STEP", _on_unless_zero),
    "kv_dtype": ("BRANCHCHAT_KV_DTYPE", _kv_dtype),
    "memory_budget_bytes": ("BRANCHCHAT_MEMORY_BUDGET", _byte_size),
    "block_drafter": ("BRANCHCHAT_BLOCK_DRAFTER", lambda value: value.strip() or None),
    "drafter_compile": ("BRANCHCHAT_DRAFTER_COMPILE", _on_unless_zero),
    "auto_block": ("BRANCHCHAT_AUTO_BLOCK", _step_opt_in("BRANCHCHAT_AUTO_BLOCK")),
    "queue_steps": ("BRANCHCHAT_QUEUE_STEPS", _on_unless_zero),
    "warm_up": ("BRANCHCHAT_WARM_UP", _on_unless_zero),
}


def default_prompt_cache_dir(environ: Mapping[str, str] | None = None) -> str | None:
    """Where the CLI and the app keep the prompt cache: BRANCHCHAT_PROMPT_CACHE (a folder,
    or "off"), else the user cache dir's prompt-cache folder. Read at the edges only."""
    env = os.environ if environ is None else environ
    value = env.get("BRANCHCHAT_PROMPT_CACHE", "").strip()
    if value.lower() in ("off", "0"):
        return None
    if value:
        return os.path.expanduser(value)
    import platformdirs

    return os.path.join(platformdirs.user_cache_dir("branchchat"), "prompt-cache")


def configure_process(config: EngineConfig) -> None:
    """Apply the process-wide settings: call it at the edge before anything imports NumPy."""
    # OpenBLAS (NumPy's BLAS, used for prefill chunks on the CPU) busy-waits ~0.1 s after
    # each call by default, competing with the decode kernel's own threads and the window;
    # a short spin lets its threads sleep (on 2 cores beside another busy process, decode
    # and prefill ran faster and steadier with it). Read when NumPy loads OpenBLAS.
    os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")
    # MLX multiplies float32 matrices in TF32 (a 10-bit mantissa) on GPUs that have it
    # unless told not to: the engine's float32 (the recurrent states, the chunked gated
    # delta kernel, BRANCHCHAT_DTYPE=float32) is to be float32. Read before MLX's first product.
    os.environ.setdefault("MLX_ENABLE_TF32", "0")
    if config.blas_threads is not None:
        os.environ["OPENBLAS_NUM_THREADS"] = os.environ["OMP_NUM_THREADS"] = str(
            config.blas_threads
        )
    if config.threads is not None:
        from kernels import qmatmul  # loads NumPy: only after the variables above are set

        qmatmul.set_num_threads(config.threads)
