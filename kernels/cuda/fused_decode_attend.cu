// Body of the attend kernel: attention of each query row over the KV buffer.

  // q [M, H * DH] f32, keys / values [HKV, CAP, DH] T, pos [1] int32 -> o [M, H * DH] f32
  // Block (h, m): query row m (position pos + m) of head h over keys 0 .. pos + m.
  const int h = blockIdx.x, m = blockIdx.y;
  const int cap = keys_shape[1];
  const int n = pos[0] + m + 1;
  const int kvh = h / (H / HKV);
  const float NEG_INF = __int_as_float(0xff800000);
  float qv[DH], acc[DH];
  const float scale = rsqrtf(static_cast<float>(DH));
#pragma unroll
  for (int d = 0; d < DH; ++d) {
    qv[d] = q[(size_t)m * H * DH + h * DH + d] * scale;
    acc[d] = 0.f;
  }
  float mx = NEG_INF, l = 0.f;
  const T* kb = keys + (size_t)kvh * cap * DH;
  const T* vb = values + (size_t)kvh * cap * DH;
  for (int j = threadIdx.x; j < n; j += THREADS) {
    float s = 0.f;
#pragma unroll
    for (int d = 0; d < DH; d += 8) {
      float kv[8];
      fd_load8(kb + (size_t)j * DH + d, kv);
#pragma unroll
      for (int i = 0; i < 8; ++i) s += qv[d + i] * kv[i];
    }
    float c = 1.f, e = 1.f;
    if (s > mx) { c = expf(mx - s); mx = s; } else { e = expf(s - mx); }
    l = l * c + e;
#pragma unroll
    for (int d = 0; d < DH; d += 8) {
      float vv[8];
      fd_load8(vb + (size_t)j * DH + d, vv);
#pragma unroll
      for (int i = 0; i < 8; ++i) acc[d + i] = acc[d + i] * c + e * vv[i];
    }
  }
  // combine the lanes of each warp (symmetric: every lane ends with the same values)
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    const float omx = __shfl_xor_sync(FD_FULL, mx, off);
    const float ol = __shfl_xor_sync(FD_FULL, l, off);
    const float nm = fmaxf(mx, omx);
    const float c1 = mx == NEG_INF ? 0.f : expf(mx - nm);
    const float c2 = omx == NEG_INF ? 0.f : expf(omx - nm);
    l = l * c1 + ol * c2;
#pragma unroll
    for (int d = 0; d < DH; ++d) {
      const float oa = __shfl_xor_sync(FD_FULL, acc[d], off);
      acc[d] = acc[d] * c1 + oa * c2;
    }
    mx = nm;
  }
  constexpr int NW = THREADS / 32;
  __shared__ float s_m[NW], s_l[NW], s_acc[NW][DH];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) {
    s_m[warp] = mx;
    s_l[warp] = l;
#pragma unroll
    for (int d = 0; d < DH; ++d) s_acc[warp][d] = acc[d];
  }
  __syncthreads();
  if (threadIdx.x < DH) {
    const int d = threadIdx.x;
    float gm = NEG_INF;
    for (int w = 0; w < NW; ++w) gm = fmaxf(gm, s_m[w]);
    float gl = 0.f, go = 0.f;
    for (int w = 0; w < NW; ++w) {
      const float c = s_m[w] == NEG_INF ? 0.f : expf(s_m[w] - gm);
      gl += s_l[w] * c;
      go += s_acc[w][d] * c;
    }
    o[(size_t)m * H * DH + h * DH + d] = go / gl;
  }
