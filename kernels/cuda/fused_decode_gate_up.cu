// Body of the gate_up kernel: RMSNorm + gate/up projection + SiLU(gate) * up.

  // x [M, D] f32, nw [D] f32, w [2F, D] T (gate rows, then up rows) -> act [M, F] f32
  const int M = x_shape[0];
  __shared__ float rinv[FD_MAXM];
  fd_row_rinv(x, M, D, EPS, rinv);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int n = blockIdx.x * FD_WARPS + warp;
  if (n >= F) return;
  float g[FD_MAXM], u[FD_MAXM];
#pragma unroll
  for (int m = 0; m < FD_MAXM; ++m) { g[m] = 0.f; u[m] = 0.f; }
  fd_dot_rows<T, D, true>(x, M, nw, w + (size_t)n * D, g);
  fd_dot_rows<T, D, true>(x, M, nw, w + (size_t)(F + n) * D, u);
#pragma unroll
  for (int m = 0; m < FD_MAXM; ++m) {
    if (m < M) {
      const float gs = fd_warp_sum(g[m]) * rinv[m];
      const float us = fd_warp_sum(u[m]) * rinv[m];
      if (lane == 0) act[(size_t)m * F + n] = gs / (1.0f + expf(-gs)) * us;
    }
  }
