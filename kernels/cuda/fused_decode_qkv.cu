// Body of the qkv kernel (kernels/fused_decode_cuda.py wraps it with mx.fast.cuda_kernel,
// after the model's constants): RMSNorm + fused q/k/v projection + RoPE.

  // x [M, D] f32, nw [D] f32, w [(H + 2 HKV) * DH, D], pos [1] int32
  // -> q [M, H * DH] f32 (roped), k_rows / v_rows [HKV, M, DH] (roped k) in T
  const int M = x_shape[0];
  __shared__ float rinv[FD_MAXM];
  fd_row_rinv(x, M, D, EPS, rinv);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int p = blockIdx.x * FD_WARPS + warp;  // one warp: one pair of outputs
  if (p >= (H + 2 * HKV) * DH / 2) return;
  int n0, n1, fi;
  fd_qkv_pair<H, HKV, DH, TRADITIONAL>(p, n0, n1, fi);
  float a0[FD_MAXM], a1[FD_MAXM];
#pragma unroll
  for (int m = 0; m < FD_MAXM; ++m) { a0[m] = 0.f; a1[m] = 0.f; }
  fd_dot_rows<T, D, true>(x, M, nw, w + (size_t)n0 * D, a0);
  fd_dot_rows<T, D, true>(x, M, nw, w + (size_t)n1 * D, a1);
  const int head = n0 / DH;
  const int d0 = n0 % DH, d1 = n1 % DH;
  const float inv_freq = fi >= 0 ? exp2f(-(2.0f * fi / DH) * LOG2_BASE) : 0.f;
#pragma unroll
  for (int m = 0; m < FD_MAXM; ++m) {
    if (m < M) {
      float s0 = fd_warp_sum(a0[m]) * rinv[m];
      float s1 = fd_warp_sum(a1[m]) * rinv[m];
      if (lane == 0) {
        if (fi >= 0) {
          float sn, cs;
          sincosf(static_cast<float>(pos[0] + m) * inv_freq, &sn, &cs);
          const float r0 = s0 * cs - s1 * sn;
          s1 = s0 * sn + s1 * cs;
          s0 = r0;
        }
        if (head < H) {
          q[m * H * DH + n0] = s0;
          q[m * H * DH + n1] = s1;
        } else if (head < H + HKV) {
          const size_t base = ((size_t)(head - H) * M + m) * DH;
          k_rows[base + d0] = static_cast<T>(s0);
          k_rows[base + d1] = static_cast<T>(s1);
        } else {
          const size_t base = ((size_t)(head - H - HKV) * M + m) * DH;
          v_rows[base + d0] = static_cast<T>(s0);
          v_rows[base + d1] = static_cast<T>(s1);
        }
      }
    }
  }
