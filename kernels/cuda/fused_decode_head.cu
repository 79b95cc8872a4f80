// Body of the head kernel: final RMSNorm + LM head.

  // x [M, D] f32, nw [D] f32, w [V, D] T -> logits [M, V] f32
  const int M = x_shape[0];
  __shared__ float rinv[FD_MAXM];
  fd_row_rinv(x, M, D, EPS, rinv);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int first = (blockIdx.x * FD_WARPS + warp) * NPW;
  for (int r = 0; r < NPW; ++r) {
    const int n = first + r;
    if (n >= V) return;
    float acc[FD_MAXM];
#pragma unroll
    for (int m = 0; m < FD_MAXM; ++m) acc[m] = 0.f;
    fd_dot_rows<T, D, true>(x, M, nw, w + (size_t)n * D, acc);
#pragma unroll
    for (int m = 0; m < FD_MAXM; ++m) {
      if (m < M) {
        const float s = fd_warp_sum(acc[m]) * rinv[m];
        if (lane == 0) logits[(size_t)m * V + n] = s;
      }
    }
  }
