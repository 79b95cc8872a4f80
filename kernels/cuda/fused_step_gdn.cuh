// The one-launch step's Gated DeltaNet mixer (a hybrid's linear layers; after
// gated_delta_row.cuh and fused_step.cuh). A layer is three phases: the in_proj rows
// (fused_step.cu, like q/k/v), then this one, then out_proj + residual. Here a block takes
// one value head and every row of the call:
//
//   a) the short causal conv over the head's q, k and v channels (its window: the layer's
//      conv state, then the call's rows, each rounded to the state's dtype first, as a
//      single step would have stored it), then SiLU;
//   b) q and k L2-normalised (q also by DK^-0.5), g = -A softplus(a + dt_bias), beta =
//      sigmoid(b), per row;
//   c) the recurrence row by row (gdn_row: GDN_PAIR threads own column S[:, j]);
//   d) o RMS-normed over the head, times the norm weight and SiLU(z).
//
// Every row's arithmetic is the same whatever the call's row count, so a verify's rows
// equal single steps bit for bit. The call's new state goes to `ssm_out` / `conv_out` (the
// inputs stay untouched: a snapshot is a reference), and, where `tape` is given, each row's
// conv input and q, k, v, g, beta (engine/recurrent_state.py's tape) for a later replay.

// float32 tape row of one layer, [TW] a row: q [NV, DK] | k [NV, DK] | v [NV, DV] | g [NV] |
// beta [NV] | the conv input [C]
template <int NK, int NV, int DK, int DV>
struct GdnDims {
  static constexpr int KEY = NK * DK, VD = NV * DV, C = 2 * KEY + VD;
  static constexpr int NIN = C + VD + 2 * NV;  // in_proj rows: q | k | v | z | b | a
  static constexpr int U = 2 * DK + DV;        // a value head's conv channels
  static constexpr int TW = 2 * NV * DK + VD + 2 * NV + C;
};

template <int NK, int NV, int DK, int DV, int CONVK, bool TILED, int MAXM, int GDN_PAIR, typename TC>
__device__ void fs_gdn_heads(
    int M, const float* mix, const TC* conv_in, const float* conv_w, const float* vec,
    const float* ssm_in, float* ssm_out, TC* conv_out, float* tape, float* go, float eps,
    float qscale, float* smem) {
  using Dm = GdnDims<NK, NV, DK, DV>;
  constexpr int KEY = Dm::KEY, VD = Dm::VD, C = Dm::C, NIN = Dm::NIN, U = Dm::U, TW = Dm::TW;
  constexpr float L2_EPS = 1e-6f;  // flash-linear-attention's l2norm
  constexpr int DKP = DK / GDN_PAIR;
  static_assert(GDN_PAIR * DV <= 256 && DK % GDN_PAIR == 0 &&
                (GDN_PAIR == 1 || (GDN_PAIR * DV) % 32 == 0), "threads a value column, whole warps");
  // conv'd q | k | v of each row [MAXM][U], the head's outputs [MAXM][DV]: in the launch's
  // dynamic memory (`smem`, FQ_SMEM_X floats, free in this phase) where they fit, so that
  // a verify build's static memory stays within the 48 KB a launch takes without opting in
  constexpr int ROWS_FLOATS = MAXM * (U + DV);
  constexpr bool IN_DYNAMIC = ROWS_FLOATS <= FQ_SMEM_X;
  __shared__ float s_rows[IN_DYNAMIC ? 1 : ROWS_FLOATS];
  float* rows = IN_DYNAMIC ? smem : s_rows;
  float (*s_u)[U] = reinterpret_cast<float (*)[U]>(rows);
  float (*s_o)[DV] = reinterpret_cast<float (*)[DV]>(rows + MAXM * U);
  __shared__ float s_decay[MAXM], s_beta[MAXM], s_qf[MAXM], s_kf[MAXM];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int hv = blockIdx.x; hv < NV; hv += gridDim.x) {
    const int hk = TILED ? hv % NK : hv / (NV / NK);
    const bool first = TILED ? hv < NK : hv % (NV / NK) == 0;  // hk's first value head
    auto channel = [&](int u) {
      return u < DK ? hk * DK + u : u < 2 * DK ? KEY + hk * DK + u - DK : 2 * KEY + hv * DV + u - 2 * DK;
    };
    // a) conv + SiLU
    for (int e = threadIdx.x; e < M * U; e += blockDim.x) {
      const int m = e / U, u = e % U, c = channel(u);
      float y = 0.f;
#pragma unroll
      for (int t = 0; t < CONVK; ++t) {
        const int r = m + t - (CONVK - 1);  // < 0: the stored window's row CONVK - 1 + r
        const TC xin = r < 0 ? conv_in[(CONVK - 1 + r) * C + c]
                             : static_cast<TC>(__ldcg(mix + (size_t)r * NIN + c));
        y = __fmaf_rn(__ldg(conv_w + c * CONVK + t), static_cast<float>(xin), y);
      }
      s_u[m][u] = __fdiv_rn(y, __fadd_rn(1.0f, expf(-y)));
    }
    __syncthreads();
    // b) per row: the sums of squares of q and k (a warp each), decay and beta
    for (int item = warp; item < 3 * M; item += FD_WARPS) {
      const int m = item / 3, what = item % 3;
      if (what < 2) {
        float ss = 0.f;
        for (int i = lane; i < DK; i += 32) ss = __fmaf_rn(s_u[m][what * DK + i], s_u[m][what * DK + i], ss);
        ss = fd_warp_sum(ss);
        const float inv = __fdiv_rn(1.0f, sqrtf(__fadd_rn(ss, L2_EPS)));
        if (lane == 0) (what ? s_kf : s_qf)[m] = what ? inv : __fmul_rn(inv, qscale);
      } else if (lane == 0) {
        const float a = __fadd_rn(__ldcg(mix + (size_t)m * NIN + C + VD + NV + hv), __ldg(vec + NV + hv));
        const float softplus = a > 20.f ? a : log1pf(expf(a));
        s_decay[m] = expf(__fmul_rn(__ldg(vec + hv), softplus));  // vec: -A | dt_bias | norm
        const float b = __ldcg(mix + (size_t)m * NIN + C + VD + hv);
        s_beta[m] = __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-b)));
        if (tape) {
          float* row = tape + (size_t)m * TW + 2 * NV * DK + VD;
          row[hv] = __fmul_rn(__ldg(vec + hv), softplus);
          row[NV + hv] = s_beta[m];
        }
      }
    }
    __syncthreads();
    // q and k normalised (and into the tape with v)
    for (int e = threadIdx.x; e < M * U; e += blockDim.x) {
      const int m = e / U, u = e % U;
      float val = s_u[m][u];
      if (u < 2 * DK) {
        val = __fmul_rn(val, u < DK ? s_qf[m] : s_kf[m]);
        s_u[m][u] = val;
      }
      if (tape) {
        float* row = tape + (size_t)m * TW;
        const int at = u < DK ? hv * DK + u : u < 2 * DK ? NV * DK + hv * DK + u - DK
                                                         : 2 * NV * DK + hv * DV + u - 2 * DK;
        row[at] = val;
      }
    }
    if (tape) {  // the raw conv input of this head's v channels (q, k: the key head's first)
      for (int e = threadIdx.x; e < M * U; e += blockDim.x) {
        const int m = e / U, u = e % U;
        if (u >= 2 * DK || first)
          tape[(size_t)m * TW + TW - C + channel(u)] = __ldcg(mix + (size_t)m * NIN + channel(u));
      }
    }
    __syncthreads();
    // c) the recurrence
    if (threadIdx.x < GDN_PAIR * DV) {
      const int j = threadIdx.x / GDN_PAIR, part = threadIdx.x % GDN_PAIR;
      const size_t col0 = ((size_t)hv * DK + part * DKP) * DV + j;  // S[part * DKP, j]
      float s[DKP];
#pragma unroll
      for (int i = 0; i < DKP; ++i) s[i] = __ldg(ssm_in + col0 + (size_t)i * DV);
      for (int m = 0; m < M; ++m) {
        const float o = gdn_row<DKP, GDN_PAIR>(s, s_u[m] + part * DKP, s_u[m] + DK + part * DKP,
                                     s_u[m][2 * DK + j], s_decay[m], s_beta[m]);
        if (part == 0) s_o[m][j] = o;
      }
#pragma unroll
      for (int i = 0; i < DKP; ++i) ssm_out[col0 + (size_t)i * DV] = s[i];
    }
    // the conv window after the call: the last CONVK - 1 rows of (window, rows)
    {
      for (int e = threadIdx.x; e < (CONVK - 1) * U; e += blockDim.x) {
        const int t = e / U, u = e % U, c = channel(u);
        if (u < 2 * DK && !first) continue;
        const int r = M + t - (CONVK - 1);
        conv_out[t * C + c] = r < 0 ? conv_in[(M + t) * C + c]
                                    : static_cast<TC>(__ldcg(mix + (size_t)r * NIN + c));
      }
    }
    __syncthreads();
    // d) the gated RMS norm, a warp a row
    for (int m = warp; m < M; m += FD_WARPS) {
      float ss = 0.f;
      for (int j = lane; j < DV; j += 32) ss = __fmaf_rn(s_o[m][j], s_o[m][j], ss);
      ss = fd_warp_sum(ss);
      const float rinv = __fdiv_rn(1.0f, sqrtf(__fadd_rn(__fdiv_rn(ss, static_cast<float>(DV)), eps)));
      for (int j = lane; j < DV; j += 32) {
        const float z = __ldcg(mix + (size_t)m * NIN + C + hv * DV + j);
        const float gate = __fdiv_rn(z, __fadd_rn(1.0f, expf(-z)));
        const float normed = __fmul_rn(__fmul_rn(s_o[m][j], rinv), __ldg(vec + 2 * NV + j));
        go[(size_t)m * VD + hv * DV + j] = __fmul_rn(normed, gate);
      }
    }
    __syncthreads();  // shared memory is free for the next head
  }
}
