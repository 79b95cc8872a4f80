// Body of the residual kernels (o_proj, down): a projection plus the residual add; K and N
// come from the call's template arguments.

  // a [M, K] f32, w [N, K] T, res [M, N] f32 -> y [M, N] = res + a @ w.T
  const int M = a_shape[0];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int n = blockIdx.x * FD_WARPS + warp;
  if (n >= N) return;
  float acc[FD_MAXM];
#pragma unroll
  for (int m = 0; m < FD_MAXM; ++m) acc[m] = 0.f;
  fd_dot_rows<T, K, false>(a, M, nullptr, w + (size_t)n * K, acc);
#pragma unroll
  for (int m = 0; m < FD_MAXM; ++m) {
    if (m < M) {
      const float s = fd_warp_sum(acc[m]);
      if (lane == 0) y[(size_t)m * N + n] = res[(size_t)m * N + n] + s;
    }
  }
