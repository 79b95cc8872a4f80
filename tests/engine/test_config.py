"""EngineConfig: the BRANCHCHAT_* variables parsed with their messages, overrides, and
validation that raises ValueError; configure_process applied by the real entry points
before NumPy loads."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from engine.config import EngineConfig, parse_step_tuning
from engine.state import SnapshotPolicy
from kernels import qmatmul
from kernels.ops import make_ops


def test_switched_off_by_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BRANCHCHAT_QMATMUL", "0")
    config = EngineConfig.from_environment()
    assert config.qmatmul is False
    assert not qmatmul.enabled(config.qmatmul) and not make_ops("numpy", qmatmul=False).packed
    monkeypatch.setenv("BRANCHCHAT_QMATMUL", "yes")
    with pytest.raises(ValueError, match="BRANCHCHAT_QMATMUL must be 0 or 1, not 'yes'"):
        EngineConfig.from_environment()


def test_cpu_matmul_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """BRANCHCHAT_CPU_MATMUL picks the numpy backend's kernel; unset, the int8 one where an
    int8 SIMD path runs."""
    from kernels import int8_matmul

    monkeypatch.setenv("BRANCHCHAT_CPU_MATMUL", "float")
    config = EngineConfig.from_environment()
    assert config.cpu_matmul == "float"
    assert make_ops("numpy", cpu_matmul=config.cpu_matmul).cpu_matmul == "float"
    monkeypatch.delenv("BRANCHCHAT_CPU_MATMUL")
    assert EngineConfig.from_environment().cpu_matmul is None
    default = "int8" if int8_matmul.has_simd() else "float"
    assert make_ops("numpy").cpu_matmul == default
    monkeypatch.setenv("BRANCHCHAT_CPU_MATMUL", "int4")
    with pytest.raises(ValueError, match="BRANCHCHAT_CPU_MATMUL must be 'int8' or 'float'"):
        EngineConfig.from_environment()
    with pytest.raises(ValueError, match="cpu_matmul must be 'int8' or 'float'"):
        EngineConfig(cpu_matmul="int4")


def test_gpu_prefill_settings_from_environment(tiny_llama_gguf) -> None:
    """BRANCHCHAT_GPU_MATMUL reaches the MLX backend's wide products, and
    BRANCHCHAT_PREFILL_CHUNK the runner's prefill rows (unset: 256 rows off a GPU, 2,048 on
    one), BRANCHCHAT_GPU_OVERLAP whether layers are started as they are built."""
    import mlx.core as mx

    from engine.loader import load_model
    from engine.runner.runner import GPU_PREFILL_ROWS, PREFILL_ROWS
    from kernels.ops_mlx import DEFAULT_WIDE_MATMUL, OVERLAP_LAYERS

    environ = {
        "BRANCHCHAT_GPU_MATMUL": "dense32",
        "BRANCHCHAT_PREFILL_CHUNK": "48",
        "BRANCHCHAT_GPU_OVERLAP": "1",
    }
    config = EngineConfig.from_environment(environ, backend="mlx")
    assert (config.gpu_matmul, config.prefill_chunk, config.gpu_overlap) == ("dense32", 48, True)
    loaded = load_model(tiny_llama_gguf[0], config)
    assert loaded.ops.wide_matmul == "dense32" and loaded.runner.prefill_rows == 48
    assert loaded.ops.overlap_layers is True  # asked for: on any device
    plain = load_model(tiny_llama_gguf[0], EngineConfig(backend="mlx"))
    on_gpu = mx.default_device() == mx.gpu
    rows = GPU_PREFILL_ROWS if on_gpu else PREFILL_ROWS
    assert plain.ops.wide_matmul == DEFAULT_WIDE_MATMUL and plain.runner.prefill_rows == rows
    assert plain.ops.overlap_layers is (on_gpu and OVERLAP_LAYERS)  # the default
    off = EngineConfig.from_environment({"BRANCHCHAT_GPU_OVERLAP": "0"}, backend="mlx")
    assert load_model(tiny_llama_gguf[0], off).ops.overlap_layers is False


def test_a_hybrids_prefill_recurrence_is_chosen_and_refused_off_cuda(tiny_llama_gguf) -> None:
    """BRANCHCHAT_GDN_PREFILL reaches the MLX backend; "recurrent" is the CUDA kernel's (the
    default there), so where MLX has no CUDA GPU the load refuses it by name instead of
    running the other."""
    from engine.loader import load_model
    from kernels import gated_delta_cuda

    config = EngineConfig.from_environment({"BRANCHCHAT_GDN_PREFILL": "recurrent"}, backend="mlx")
    assert config.gdn_prefill == "recurrent"
    assert EngineConfig.from_environment({}).gdn_prefill is None
    with pytest.raises(ValueError, match="gdn_prefill must be one of"):
        EngineConfig(gdn_prefill="fast")
    plain = load_model(tiny_llama_gguf[0], EngineConfig(backend="mlx"))
    # unasked, the CUDA recurrence where MLX runs on CUDA, the chunked form elsewhere
    assert plain.ops.gdn_prefill == ("recurrent" if gated_delta_cuda.is_available() else "chunked")
    if gated_delta_cuda.is_available():
        assert load_model(tiny_llama_gguf[0], config).ops.gdn_prefill == "recurrent"
    else:
        with pytest.raises(ValueError, match="it needs MLX on a CUDA GPU"):
            load_model(tiny_llama_gguf[0], config)


def test_thread_count_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BRANCHCHAT_THREADS", "3")
    assert EngineConfig.from_environment().threads == 3
    monkeypatch.delenv("BRANCHCHAT_THREADS")
    assert EngineConfig.from_environment().threads is None  # the kernel's default:
    assert qmatmul.default_num_threads() >= 1
    monkeypatch.setenv("BRANCHCHAT_THREADS", "0")
    with pytest.raises(ValueError, match="BRANCHCHAT_THREADS must be a positive integer"):
        EngineConfig.from_environment()


def test_every_variable_is_read() -> None:
    environ = {
        "BRANCHCHAT_BACKEND": "numpy",
        "BRANCHCHAT_DTYPE": "float32",
        "BRANCHCHAT_FUSED": "0",
        "BRANCHCHAT_FUSED_MODE": "layers",
        "BRANCHCHAT_FUSED_COMPILE": "0",
        "BRANCHCHAT_QMATMUL": "1",
        "BRANCHCHAT_THREADS": "2",
    }
    config = EngineConfig.from_environment(environ)
    assert (config.backend, config.dtype, config.fused, config.fused_mode) == (
        "numpy",
        "float32",
        False,
        "layers",
    )
    assert (config.fused_compile, config.qmatmul, config.threads) == (False, True, 2)


def test_the_step_kernels_knobs_are_read_by_name() -> None:
    config = EngineConfig.from_environment(
        {"BRANCHCHAT_STEP_TUNING": "FQ_BLOCKS=2, FQ_SMEM_X=8192"}
    )
    assert parse_step_tuning(config.step_tuning or "") == {"FQ_BLOCKS": 2, "FQ_SMEM_X": 8192}


def test_an_unknown_step_knob_is_refused_at_load(tiny_models) -> None:
    from engine.loader import load_model

    path, _ = tiny_models.gguf(qtype="F32")
    config = EngineConfig(backend="numpy", step_tuning="FQ_SLICE=8")
    with pytest.raises(
        ValueError, match="unknown step kernel knobs .'FQ_SLICE'. .known: FQ_SLICES"
    ):
        load_model(path, config)
    with pytest.raises(ValueError, match="FQ_BLOCKS must be 1..4"):
        load_model(path, EngineConfig(backend="numpy", step_tuning="FQ_BLOCKS=9"))


def test_unset_variables_give_the_defaults() -> None:
    assert EngineConfig.from_environment({}) == EngineConfig()
    config = EngineConfig()
    assert config.backend is None and config.dtype is None and config.fused_mode is None
    assert config.fused and config.fused_compile and config.qmatmul is None
    assert config.memory_budget_bytes is None  # engine.memory's default: a share of RAM
    assert config.snapshot_policy is None  # the runner's states take SnapshotPolicy()
    # as before: only "0" switches the fused kernels or their compiled trace off
    on = EngineConfig.from_environment({"BRANCHCHAT_FUSED": "1", "BRANCHCHAT_FUSED_COMPILE": ""})
    assert on.fused and on.fused_compile


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        ("BRANCHCHAT_BACKEND", "cuda", "BRANCHCHAT_BACKEND must be 'numpy' or 'mlx', not 'cuda'"),
        ("BRANCHCHAT_DTYPE", "fp8", "BRANCHCHAT_DTYPE must be one of"),
        ("BRANCHCHAT_FUSED_MODE", "fast", "BRANCHCHAT_FUSED_MODE must be 'step' or 'layers'"),
        ("BRANCHCHAT_THREADS", "two", "BRANCHCHAT_THREADS must be a positive integer, not 'two'"),
        ("BRANCHCHAT_GPU_MATMUL", "int4", "BRANCHCHAT_GPU_MATMUL must be one of"),
        ("BRANCHCHAT_GPU_OVERLAP", "yes", "BRANCHCHAT_GPU_OVERLAP must be 0 or 1"),
        ("BRANCHCHAT_GDN_PREFILL", "fast", "BRANCHCHAT_GDN_PREFILL must be one of chunked, rec"),
        ("BRANCHCHAT_HYBRID_STEP", "on", "BRANCHCHAT_HYBRID_STEP must be 0 or 1"),
        ("BRANCHCHAT_PREFILL_CHUNK", "0", "BRANCHCHAT_PREFILL_CHUNK must be a positive integer"),
        ("BRANCHCHAT_PREFILL_CHUNK", "2k", "BRANCHCHAT_PREFILL_CHUNK must be a positive integer"),
        ("BRANCHCHAT_STEP_TUNING", "FQ_BLOCKS:2", "BRANCHCHAT_STEP_TUNING must be NAME=INTEGER"),
        ("BRANCHCHAT_STEP_TUNING", "FQ_BLOCKS=two", "BRANCHCHAT_STEP_TUNING must be NAME="),
    ],
)
def test_malformed_variables_are_named(variable: str, value: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        EngineConfig.from_environment({variable: value})


def test_overrides_take_precedence_and_skip_their_variable() -> None:
    environ = {"BRANCHCHAT_BACKEND": "cuda", "BRANCHCHAT_THREADS": "3"}
    config = EngineConfig.from_environment(environ, backend="mlx", blas_threads=None)
    assert config.backend == "mlx" and config.threads == 3 and config.blas_threads is None
    with pytest.raises(TypeError, match="no field"):
        EngineConfig.from_environment({}, backends="mlx")


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("backend", "cuda"),
        ("dtype", "int8"),
        ("fused_mode", "fast"),
        ("threads", 0),
        ("blas_threads", -1),
        ("memory_budget_bytes", -1),
        ("gpu_matmul", "int4"),
        ("prefill_chunk", 0),
    ],
)
def test_invalid_fields_raise_value_error(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=field):
        EngineConfig(**{field: value})  # type: ignore[arg-type]


def test_config_is_frozen() -> None:
    config = EngineConfig()
    with pytest.raises(AttributeError):
        config.backend = "mlx"  # type: ignore[misc]


def test_building_a_config_loads_no_numpy() -> None:
    """configure_process must run before NumPy loads, so neither the config's module nor
    building a config may load NumPy."""
    code = (
        "import sys\n"
        "from engine.config import EngineConfig\n"
        "EngineConfig.from_environment({'BRANCHCHAT_THREADS': '2'}, backend='numpy')\n"
        "print('numpy' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.stdout.strip() == "False", out.stderr


def test_the_runner_builds_states_with_the_configured_policy(tiny_llama_gguf) -> None:
    from engine.loader import load_model

    policy = SnapshotPolicy(stride=8, stride_capacity=4)
    loaded = load_model(tiny_llama_gguf[0], EngineConfig(backend="numpy", snapshot_policy=policy))
    assert loaded.runner.new_state().policy == policy
    assert load_model(tiny_llama_gguf[0]).runner.new_state().policy == SnapshotPolicy()


def test_the_entry_points_let_blas_threads_sleep(tmp_path: Path) -> None:
    """OPENBLAS_THREAD_TIMEOUT is set before NumPy loads OpenBLAS (unless the user set it),
    by configure_process and by `python -m engine`, which calls it first."""
    direct = (
        "import os, sys\n"
        "from engine.config import EngineConfig, configure_process\n"
        "configure_process(EngineConfig())\n"
        "assert 'numpy' not in sys.modules\n"
        "import numpy\n"
        "print(os.environ['OPENBLAS_THREAD_TIMEOUT'])"
    )
    missing = str(tmp_path / "none.gguf")
    cli = (  # a missing model: the command fails fast, after the process is configured
        "import os\n"
        "from engine.__main__ import main\n"
        f"assert main(['generate', '--model', {missing!r}, '--prompt', 'hi']) == 1\n"
        "print(os.environ['OPENBLAS_THREAD_TIMEOUT'])"
    )
    for code in (direct, cli):
        env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_THREAD_TIMEOUT"}
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
        assert out.stdout.strip().splitlines()[-1:] == ["4"], out.stderr
        env["OPENBLAS_THREAD_TIMEOUT"] = "9"
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
        assert out.stdout.strip().splitlines()[-1:] == ["9"], out.stderr
