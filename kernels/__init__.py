"""Numeric kernels the models call, each beside a plain reference it is tested against.

Convention: a kernel family `name` keeps its plain reference (float64 NumPy loops or plain
MLX ops, written to be obviously right, not fast) in `name_ref.py`; each fast version of it
is tested against that reference in tests/kernels/ (the fused decode kernels in
tests/engine/test_fused_decode.py, which needs a whole model):

    gated_delta_ref   gated_delta (NumPy), gated_delta_mlx (MLX), gated_delta_cuda (CUDA)
    qmatmul_ref       qmatmul: packed-weight matmul and decode attention in C (csrc/)
    fused_decode_ref  fused_decode_cuda (five kernels a layer) and, through them,
                      fused_step_cuda (the same phases in one launch)

CUDA sources live in cuda/*.cu and are read when a kernel is built. `ops` is the op set
the models are written against (`make_ops` picks a backend: ops_numpy or ops_mlx).
"""
