// Body of the one-launch step kernel (kernels/fused_step_cuda.py wraps it with
// mx.fast.cuda_kernel, after the model's constants and the KEYS / VALUES arrays). T is the
// KV rows' dtype; the weights are read from the table as stored (fused_step.cuh); MAXM is
// the build's most rows (1 for decode, FD_MAXM for verify: the same arithmetic per row).
// A hybrid's build (FS_HYBRID, from step_source) also runs Gated DeltaNet layers
// (fused_step_gdn.cuh) and gated attention with partial rotary embeddings (GATED, RD); a
// Gemma 3 build sliding layers through their KV rings (FS_SLIDING, FS_KV_ROW, WINDOW),
// sandwich norms (SANDWICH: phases C2, E2), GELU (ACT) and scaled embeddings.

  // Host-written inputs (ids, pos) are read once per block; every buffer the blocks
  // share (scratch, sync) is a large allocation of its own: MLX's small buffers share
  // managed-memory pages with host-touched arrays, and GPU atomics or reads on such a
  // page cross the bus (a 150-barrier step went from 0.4 ms to 77 ms).
  const int M = ids_shape[0];
  __shared__ int s_ids[FD_MAXM];
  __shared__ int s_p0;
  if (threadIdx.x < M) s_ids[threadIdx.x] = ids[threadIdx.x];
  if (threadIdx.x == 0) s_p0 = pos[0];
  __syncthreads();
  const int p0 = s_p0;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int gw = blockIdx.x * FD_WARPS + warp, nw = gridDim.x * FD_WARPS;
  const float NEG_INF = __int_as_float(0xff800000);
  unsigned int* sync = sync_buf;
  unsigned int* counters = sync_buf + 4096;  // attention chunks done, a (row, head)
  unsigned int phase = 0;
  constexpr int HD = H * DH;
  // of q/k/v outputs: RoPE pairs (fd_qkv_pair), or with the output gate adjacent pairs of
  // [query | gate] per head, k and v (normed and rotated in A2)
  constexpr int PAIRS = GATED ? HD + HKV * DH : (H + 2 * HKV) * DH / 2;
  const FqTable tab{meta, words, scales, biases};
  constexpr int HEAD_MAT = 4 * L, TABLE_MAT = 4 * L + 1;  // the head's and the table's rows
  auto fs_prefetch_qkv = [&](int layer) {  // the first pair of q/k/v rows this warp takes
    if (FS_LINEAR(layer) || GATED) {
      if (2 * gw < (FS_LINEAR(layer) ? GDN_NIN : 2 * PAIRS)) fq_prefetch_row(tab, 4 * layer, 2 * gw);
    } else if (gw < PAIRS) {
      int n0, n1, fi;
      fd_qkv_pair<H, HKV, DH, TRADITIONAL>(gw, n0, n1, fi);
      fq_prefetch_row(tab, 4 * layer, n0);
    }
  };
#ifndef FQ_VERIFY_ROWS
#define FQ_VERIFY_ROWS 4
#endif
  constexpr int G = MAXM == 1 ? 1 : FQ_VERIFY_ROWS;  // rows a dot product's pass takes
  // rows of x a phase over rows of D stages at once (int8 x: what fits; float: every row);
  // the phases over D (in_proj, qkv, gate_up) are normed: int8 follows qkv's rule
  constexpr int PD = fq_pass_rows<D, G, MAXM, FQ_ROLE_QKV>();
  static_assert(PD >= G, "a pass stages a dot product's rows of x");
  // attention: a warp takes CK keys of one (row, head); LPK lanes share a key (8 dims
  // each), KPI keys a load; a lane owns VD dims of the output (lanes past VOWN mirror)
  constexpr int LPK = DH / 8, KPI = 32 / LPK, KIT = CK / KPI;
  constexpr int VD = DH >= 32 ? DH / 32 : 1, VOWN = DH / VD;
  static_assert(32 % LPK == 0 && CK % KPI == 0 && CK <= 64, "attention split");
  static_assert(4096 + FD_MAXM * H <= 16384, "attention counters fit the sync buffer");
  float* work = const_cast<float*>(scratch);
  float* qs = work;
  float* ao = qs + FD_MAXM * HD;
  float* hs = ao + FD_MAXM * HD;
  float* act = hs + FD_MAXM * D;
  float* xs = act + FD_MAXM * F;
  // a linear layer's in_proj rows [row, GDN_NIN]; the gate of a gated attention layer or
  // the normed output of a linear one [row, GDN_GO]
  float* mix = xs + FD_MAXM * D;
  float* gbuf = mix + FD_MAXM * GDN_NIN;
  // FQ_INT8_ONCE: the attention output and the MLP's activation in int8 as their phases
  // round them, [row] x (K bytes), and a scale a block of 32 (fused_step_cuda.int8_once_floats)
  unsigned char* oq8 = reinterpret_cast<unsigned char*>(gbuf + FD_MAXM * GDN_GO);
  float* od8 = reinterpret_cast<float*>(oq8 + FD_MAXM * HD);
  unsigned char* aq8 = reinterpret_cast<unsigned char*>(od8 + FD_MAXM * (HD / 32));
  float* ad8 = reinterpret_cast<float*>(aq8 + FD_MAXM * F);
  float* part = ad8 + FD_MAXM * (F / 32);  // attention partials [row, head, chunk] x (max, sum, DH)
  // which of o's and down's x their producers round (a head's dims a warp's blocks of 32;
  // gate_up's blocks of 8 warps take 32 outputs)
  constexpr bool ONCE_O = FQ_INT8_ONCE && fq_int8<HD, FQ_ROLE_O>() && DH % 32 == 0;
  constexpr bool ONCE_A = FQ_INT8_ONCE && fq_int8<F, FQ_ROLE_DOWN>() && FD_WARPS == 8;
  static_assert(FQ_SMEM_X % 8 == 0 && FQ_SMEM_X <= 49152, "staged x: a multiple of 8 floats");
  extern __shared__ __align__(16) float s_x[];  // fq_stage's x: the launch's dynamic memory
  fq_gather_rows<D>(tab, TABLE_MAT, s_ids, M, xs, EMBED_SCALE);  // embedding rows, float32
  fs_prefetch_qkv(0);
  fs_grid_sync(sync, ++phase);
  const float* x = xs;
  for (int l = 0; l < L; ++l) {
    T* kc = const_cast<T*>(KEYS[l]);
    T* vc = const_cast<T*>(VALUES[l]);
    // a sliding layer's rows lie in a ring (position p in row p % ring: FS_KV_ROW), the
    // others' in the cache (row p); each layer rotates by its own table
    const bool slide = FS_SLIDING(l);
    const int rows_l = slide ? ring : cap;
    const float* lfreqs = freqs + l * ROPE_STRIDE;  // ROPE_STRIDE 0: one table
    if (PREFETCH && l + 1 < L) {  // the next layer's weights into L2 while this one runs
      // (a layer's matrices lie together in the table, followed by the next one's)
      const int64_t w0 = tab.field(4 * (l + 1), 0, FQ_WORDS), w1 = tab.field(4 * (l + 2), 0, FQ_WORDS);
      const int64_t g0 = tab.field(4 * (l + 1), 0, FQ_GROUPS), g1 = tab.field(4 * (l + 2), 0, FQ_GROUPS);
      const int64_t b0 = tab.field(4 * (l + 1), 0, FQ_BIAS), b1 = tab.field(4 * (l + 2), 0, FQ_BIAS);
      fs_prefetch_l2(words + w0, (size_t)(w1 - w0) * 4);
      fs_prefetch_l2(scales + g0, (size_t)(g1 - g0) * 4);
      fs_prefetch_l2(biases + b0, (size_t)(b1 - b0) * 4);
    }
#if FS_HYBRID
    if (FS_LINEAR(l)) {
      // -- G1: norm + in_proj (q | k | v | z | b | a) -> mix; a warp takes rows n, n + 1
      const FqUnits units(GDN_NIN / 2, M, G);
      for (int pass0 = 0; pass0 < M; pass0 += PD) {
        const FqX xg = fq_stage_pass<D, PD, FQ_ROLE_QKV>(x, M, pass0, nw1 + l * D, s_x);
        for (int u = gw; u < units.count(); u += nw) {
          const int n = 2 * units.item(u);
          int lo, hi;
          units.rows(u, M, G, lo, hi);
          FqPart part;
          int r0;
          const int fmt = tab.part(4 * l, n, part, r0);  // parts start on even rows
          const int rows[2] = {r0, r0 + 1};
          for (int m0 = max(lo, pass0); m0 < min(hi, pass0 + PD); m0 += G) {
            float acc[G][2], ss[G];
            fq_dot<D, 2, G, true, true, FQ_ROLE_QKV>(fmt, part, rows, nw1 + l * D, xg.at((m0 - pass0) * D), min(G, M - m0), acc, ss);
#pragma unroll
            for (int g = 0; g < G; ++g) {
              const int m = m0 + g;
              if (m < M && lane == 0) {
                const float rinv = 1.0f / sqrtf(ss[g] / D + EPS);
                mix[(size_t)m * GDN_NIN + n] = acc[g][0] * rinv;
                mix[(size_t)m * GDN_NIN + n + 1] = acc[g][1] * rinv;
              }
            }
          }
        }
        fq_pass_done(pass0, PD, M);
      }
      fs_grid_sync(sync, ++phase);
      // -- G2: conv, recurrence, gated norm, a block a value head -> gbuf; the new state
      {
        const int gi = FS_LINEAR_INDEX(l);
        using Dm = GdnDims<GDN_NK, GDN_NV, GDN_DK, GDN_DV>;
        float* tape = gstate + (size_t)GDN_LAYERS * GDN_NV * GDN_DK * GDN_DV + (size_t)gi * M * Dm::TW;
        fs_gdn_heads<GDN_NK, GDN_NV, GDN_DK, GDN_DV, GDN_CONVK, GDN_TILED, MAXM, GDN_PAIR, TC>(
            M, mix, CONVS[l], gconvw + (size_t)gi * Dm::C * GDN_CONVK, gvec + gi * (2 * GDN_NV + GDN_DV),
            SSMS[l], gstate + (size_t)gi * GDN_NV * GDN_DK * GDN_DV, gconv + (size_t)gi * (GDN_CONVK - 1) * Dm::C,
            tape, gbuf, EPS, GDN_QSCALE, s_x);
      }
      if (gw < D) fq_prefetch_row(tab, 4 * l + 1, gw);
      fs_grid_sync(sync, ++phase);
      // -- G3: out_proj + residual -> hs
      fq_residual_phase<GDN_NV * GDN_DV, D, G, FQ_ROLE_O, MAXM>(tab, 4 * l + 1, gbuf, x, hs, M, gw, nw, s_x);
    } else
#endif
    {
    // -- A: norm + qkv + rope; q to qs, k / v rows into the cache at pos + m
    const FqUnits units(PAIRS, M, G);
    for (int pass0 = 0; pass0 < M; pass0 += PD) {
      const FqX xa = fq_stage_pass<D, PD, FQ_ROLE_QKV>(x, M, pass0, nw1 + l * D, s_x);
      for (int u = gw; u < units.count(); u += nw) {
        const int p = units.item(u);
        int lo, hi;
        units.rows(u, M, G, lo, hi);
        int n0, n1, fi;
        auto pair_rows = [&](int p, int& a, int& b, int& f) {
          if (GATED) {
            a = 2 * p, b = a + 1, f = -1;
          } else {
            fd_qkv_pair<H, HKV, DH, TRADITIONAL>(p, a, b, f);
          }
        };
        pair_rows(p, n0, n1, fi);
        FqPart part;
        int r0;
        const int fmt = tab.part(4 * l, n0, part, r0);  // a pair lies in one part
        const int rows[2] = {r0, r0 + (n1 - n0)};
        const int head = n0 / DH;
        const int d0 = n0 % DH, d1 = n1 % DH;
        const float inv_freq = fi >= 0 ? __ldg(lfreqs + fi) : 0.f;
        for (int m0 = max(lo, pass0); m0 < min(hi, pass0 + PD); m0 += G) {
          float acc[G][2], ss[G];
          fq_dot<D, 2, G, true, true, FQ_ROLE_QKV>(fmt, part, rows, nw1 + l * D, xa.at((m0 - pass0) * D), min(G, M - m0), acc, ss);
#pragma unroll
          for (int g = 0; g < G; ++g) {
            const int m = m0 + g;
            if (m < M && lane == 0) {
              const float rinv = 1.0f / sqrtf(ss[g] / D + EPS);
              float s0 = acc[g][0] * rinv, s1 = acc[g][1] * rinv;
              if (GATED) {  // [query | gate] per head, k, v; q and k normed and rotated in A2
                float* dst;
                if (n0 < 2 * HD) {
                  const int hh = n0 / (2 * DH), w = n0 % (2 * DH);
                  dst = (w < DH ? qs : gbuf) + m * HD + hh * DH + w % DH;
                } else if (n0 < 2 * HD + HKV * DH) {
                  dst = ao + m * HKV * DH + n0 - 2 * HD;
                } else {
                  const int e = n0 - 2 * HD - HKV * DH;
                  const size_t base = ((size_t)(e / DH) * rows_l + FS_KV_ROW(p0 + m)) * DH + e % DH;
                  vc[base] = static_cast<T>(s0);
                  vc[base + 1] = static_cast<T>(s1);
                  continue;
                }
                dst[0] = s0;
                dst[1] = s1;
                continue;
              }
              if (QK_NORM && head < H + HKV) {  // normed per head, then rotated: phase A2
                float* raw = head < H ? qs + m * HD : ao + m * HKV * DH - H * DH;
                raw[n0] = s0;
                raw[n1] = s1;
                continue;
              }
              if (fi >= 0) fs_rotate(s0, s1, p0 + m, inv_freq);
              if (head < H) {
                qs[m * HD + n0] = s0;
                qs[m * HD + n1] = s1;
              } else if (head < H + HKV) {
                const size_t base = ((size_t)(head - H) * rows_l + FS_KV_ROW(p0 + m)) * DH;
                kc[base + d0] = static_cast<T>(s0);
                kc[base + d1] = static_cast<T>(s1);
              } else {
                const size_t base = ((size_t)(head - H - HKV) * rows_l + FS_KV_ROW(p0 + m)) * DH;
                vc[base + d0] = static_cast<T>(s0);
                vc[base + d1] = static_cast<T>(s1);
              }
            }
          }
        }
      }
      fq_pass_done(pass0, PD, M);
    }
    fs_grid_sync(sync, ++phase);
    if (QK_NORM) {
      // -- A2: each (row, q or k head) RMS-normed over its DH features, scaled by the
      // layer's q_norm / k_norm weight, rotated; k into the cache. A lane takes pairs: the
      // RD / 2 RoPE pairs of the rotated features, then adjacent ones of the rest (RD < DH).
      constexpr int HALF = DH / 2, PPL = (HALF + 31) / 32, RH = RD / 2;
      auto pair_of = [](int i, int& a, int& b) {
        a = TRADITIONAL ? 2 * i : i < RH ? i : RD + 2 * (i - RH);
        b = a + (TRADITIONAL || i >= RH ? 1 : RH);
      };
      for (int item = gw; item < M * (H + HKV); item += nw) {
        const int m = item / (H + HKV), head = item % (H + HKV);
        const bool isq = head < H;
        float* raw = isq ? qs + m * HD + head * DH : ao + (m * HKV + head - H) * DH;
        const float* wn = (isq ? qnorm : knorm) + l * DH;
        float va[PPL], vb[PPL], ss = 0.f;
#pragma unroll
        for (int j = 0; j < PPL; ++j) {
          const int i = lane + 32 * j;
          if (i < HALF) {
            int a, b;
            pair_of(i, a, b);
            va[j] = __ldcg(raw + a);
            vb[j] = __ldcg(raw + b);
            ss = __fmaf_rn(va[j], va[j], ss);
            ss = __fmaf_rn(vb[j], vb[j], ss);
          }
        }
        ss = fd_warp_sum(ss);
        const float rinv = 1.0f / sqrtf(ss / DH + EPS);
#pragma unroll
        for (int j = 0; j < PPL; ++j) {
          const int i = lane + 32 * j;
          if (i < HALF) {
            int a, b;
            pair_of(i, a, b);
            float s0 = va[j] * rinv * __ldg(wn + a), s1 = vb[j] * rinv * __ldg(wn + b);
            if (i < RH) fs_rotate(s0, s1, p0 + m, __ldg(lfreqs + i));
            if (isq) {
              raw[a] = s0;
              raw[b] = s1;
            } else {
              const size_t base = ((size_t)(head - H) * rows_l + FS_KV_ROW(p0 + m)) * DH;
              kc[base + a] = static_cast<T>(s0);
              kc[base + b] = static_cast<T>(s1);
            }
          }
        }
      }
      fs_grid_sync(sync, ++phase);
    }
    // -- B: attention. A block takes (row m, head h, block chunk c): keys c * BK .. of row
    // m's n (positions lo .. p0 + m: all of them, or a sliding layer's last WINDOW), CK of
    // them a warp (scores, the warp's max and sum, its weighted values), combined in shared
    // memory in warp order. A row of one block chunk is done; otherwise the block that
    // completes a (row, head) combines its chunks in chunk order (which block finishes
    // last changes nothing in the arithmetic).
    {
      constexpr int BK = FD_WARPS * CK;
      const int span = slide ? min(p0 + M, WINDOW) : p0 + M;  // the last row's keys
      const int C = (span + BK - 1) / BK;  // block chunks of the last row
      const int CMAX = (((SLD0 | SLD1) ? max(cap, ring) : cap) + BK - 1) / BK;  // partials' stride
      const int sub = lane / LPK, part8 = lane % LPK;
      const int vdim = (lane % VOWN) * VD;
      const float qscale = ATTN_SCALE > 0.f ? ATTN_SCALE : rsqrtf(static_cast<float>(DH));
      __shared__ float s_m[FD_WARPS], s_l[FD_WARPS], s_acc[FD_WARPS][DH];
      __shared__ unsigned int s_last;
      for (int item = blockIdx.x; item < M * H * C; item += gridDim.x) {
        const int c = item % C, mh = item / C, h = mh % H, m = mh / H;
        const int lo = slide ? max(0, p0 + m - WINDOW + 1) : 0;  // the first key's position
        const int n = p0 + m + 1 - lo, nc = (n + BK - 1) / BK;
        if (c >= nc) continue;  // the same for the whole block
        // key j's row: lo + j, in a ring from lo's slot on, wrapped (n <= WINDOW <= ring)
        const int s0 = FS_KV_ROW(lo);
        auto key_row = [&](int j) { return !slide ? j : s0 + j >= rows_l ? s0 + j - rows_l : s0 + j; };
        const int j0 = c * BK + warp * CK;
        float cmax = NEG_INF, lsum = 0.f, acc[VD];
#pragma unroll
        for (int d = 0; d < VD; ++d) acc[d] = 0.f;
        if (j0 < n) {
          const int kvh = h / (H / HKV);
          const T* kb = kc + (size_t)kvh * rows_l * DH;
          const T* vb = vc + (size_t)kvh * rows_l * DH;
          FsRaw<8 * sizeof(T)> kr[KIT];
          FsRaw<VD * sizeof(T)> vr[CK];
#pragma unroll
          for (int it = 0; it < KIT; ++it) {
            const int j = min(j0 + it * KPI + sub, n - 1);
            kr[it].load_cg(kb + (size_t)key_row(j) * DH + part8 * 8);
          }
#pragma unroll
          for (int i = 0; i < CK; ++i)
            vr[i].load_cg(vb + (size_t)key_row(min(j0 + i, n - 1)) * DH + vdim);
          float q[8];
          fs_load8_cg(qs + (size_t)m * HD + h * DH + part8 * 8, q);
          float sc[KIT];
#pragma unroll
          for (int it = 0; it < KIT; ++it) {
            float kv[8];
            fs_unpack<T, 8>(kr[it], kv);
            float d = 0.f;
#pragma unroll
            for (int i = 0; i < 8; ++i) d += (q[i] * qscale) * kv[i];
#pragma unroll
            for (int o = LPK / 2; o > 0; o >>= 1) d += __shfl_xor_sync(FD_FULL, d, o);
            sc[it] = j0 + it * KPI + sub < n ? d : NEG_INF;
            cmax = fmaxf(cmax, sc[it]);
          }
#pragma unroll
          for (int o = LPK; o < 32; o <<= 1) cmax = fmaxf(cmax, __shfl_xor_sync(FD_FULL, cmax, o));
          float pr[KIT];
#pragma unroll
          for (int it = 0; it < KIT; ++it) {
            pr[it] = sc[it] == NEG_INF ? 0.f : expf(sc[it] - cmax);
            lsum += pr[it];
          }
#pragma unroll
          for (int o = LPK; o < 32; o <<= 1) lsum += __shfl_xor_sync(FD_FULL, lsum, o);
#pragma unroll
          for (int i = 0; i < CK; ++i) {
            const float pi = __shfl_sync(FD_FULL, pr[i / KPI], (i % KPI) * LPK);
            float vv[VD];
            fs_unpack<T, VD>(vr[i], vv);
#pragma unroll
            for (int d = 0; d < VD; ++d) acc[d] += pi * vv[d];
          }
        }
        if (lane == 0) { s_m[warp] = cmax; s_l[warp] = lsum; }
        if (lane < VOWN) {
#pragma unroll
          for (int d = 0; d < VD; ++d) s_acc[warp][vdim + d] = acc[d];
        }
        __syncthreads();
        float* out = ao + (size_t)m * HD + h * DH;
        float* slots = part + (size_t)mh * CMAX * (DH + 2);  // [chunk] x (max, sum, DH)
        if (threadIdx.x < DH) {  // thread d: output dim d over the block's warps
          const int d = threadIdx.x;
          float gm = NEG_INF;
#pragma unroll
          for (int w = 0; w < FD_WARPS; ++w) gm = fmaxf(gm, s_m[w]);
          float gl = 0.f, go = 0.f;
#pragma unroll
          for (int w = 0; w < FD_WARPS; ++w) {
            const float e = s_m[w] == NEG_INF ? 0.f : expf(s_m[w] - gm);
            gl += s_l[w] * e;
            go += s_acc[w][d] * e;
          }
          if (nc == 1) {
            const float o = fs_gated<GATED>(go / gl, gbuf, m * HD + h * DH + d);
            out[d] = o;
            if (ONCE_O) fq_round_warp(o, h * DH + d - lane, oq8 + (size_t)m * HD, od8 + (size_t)m * (HD / 32));
          } else {
            float* mine = slots + (size_t)c * (DH + 2);
            if (d == 0) { mine[0] = gm; mine[1] = gl; }
            mine[2 + d] = go;
            __threadfence();
          }
        }
        if (nc > 1) {
          __syncthreads();
          if (threadIdx.x == 0) s_last = atomicAdd(counters + mh, 1u) == (unsigned int)nc - 1;
          __syncthreads();
          if (s_last && threadIdx.x < DH) {  // every chunk of (m, h) is in: combine in order
            __threadfence();
            const int d = threadIdx.x;
            float gm = NEG_INF;
            for (int cc = 0; cc < nc; ++cc) gm = fmaxf(gm, __ldcg(slots + (size_t)cc * (DH + 2)));
            float gl = 0.f, go = 0.f;
            for (int cc = 0; cc < nc; ++cc) {
              const float* sl = slots + (size_t)cc * (DH + 2);
              const float e = expf(__ldcg(sl) - gm);
              gl += __ldcg(sl + 1) * e;
              go += __ldcg(sl + 2 + d) * e;
            }
            const float o = fs_gated<GATED>(go / gl, gbuf, m * HD + h * DH + d);
            out[d] = o;
            if (ONCE_O) fq_round_warp(o, h * DH + d - lane, oq8 + (size_t)m * HD, od8 + (size_t)m * (HD / 32));
            if (d == 0) counters[mh] = 0;  // for the next layer, past a grid barrier
          }
        }
        __syncthreads();  // shared memory is free for the next item
      }
    }
    if (gw < D) fq_prefetch_row(tab, 4 * l + 1, gw);
    fs_grid_sync(sync, ++phase);
    // -- C: o_proj + residual -> hs (with sandwich norms, o_proj alone: then C2)
    fq_residual_phase<HD, D, G, FQ_ROLE_O, MAXM, !SANDWICH>(tab, 4 * l + 1, ao, x, hs, M, gw, nw, s_x,
                                                           ONCE_O ? oq8 : nullptr, od8);
    }
    if (SANDWICH) {  // -- C2: hs = x + norm(o_proj) * the post-attention norm
      fs_grid_sync(sync, ++phase);
      fs_post_norm<D>(hs, x, pn1 + (size_t)l * D, M, gw, nw, EPS);
    }
    const int first_n = ONCE_A ? 32 * blockIdx.x + 4 * warp : 2 * gw;  // this warp's first pair
    if (first_n < F) {
      fq_prefetch_row(tab, 4 * l + 2, first_n);
      fq_prefetch_row(tab, 4 * l + 2, F + first_n);
    }
    fs_grid_sync(sync, ++phase);
    // -- D: norm + gate/up + SiLU(gate) * up -> act; a warp takes outputs n, n + 1 (with
    // ONCE_A a block takes 32, warp w 4w .. 4w + 3, and rounds them into aq8 / ad8)
    __shared__ float s_act[ONCE_A ? G : 1][32];
    // rows m0 .. m0 + Mg of outputs n, n + 1 (gate rows rg, rg + 1 of part pg, format fg;
    // up's ru, pu, fu) into act (and s_act's columns c, c + 1)
    auto gate_up = [&](const FqX& xh, int pass0, int n, int m0, int c, int fg, const FqPart& pg,
                       int rg, int fu, const FqPart& pu, int ru) {
      const FqX xm = xh.at((m0 - pass0) * D);
      const int Mg = min(G, M - m0);
      // gate n, n + 1 and up n, n + 1: two passes (their parts may differ in format)
      const int gr[2] = {rg, rg + 1}, ur[2] = {ru, ru + 1};
      float ga[G][2], ua[G][2], ss[G], uss[G];
      fq_dot<D, 2, G, true, true, FQ_ROLE_GATE_UP>(fg, pg, gr, nw2 + l * D, xm, Mg, ga, ss);
      fq_dot<D, 2, G, true, false, FQ_ROLE_GATE_UP>(fu, pu, ur, nw2 + l * D, xm, Mg, ua, uss);
#pragma unroll
      for (int g = 0; g < G; ++g) {
        const int m = m0 + g;
        if (m < M && lane == 0) {
          const float rinv = 1.0f / sqrtf(ss[g] / D + EPS);
#pragma unroll
          for (int j = 0; j < 2; ++j) {
            const float gs = ga[g][j] * rinv, us = ua[g][j] * rinv;
            const float a = fs_act<ACT>(gs) * us;
            act[(size_t)m * F + n + j] = a;
            if (ONCE_A) s_act[g][c + j] = a;
          }
        }
      }
    };
    for (int pass0 = 0; pass0 < M; pass0 += PD) {
      const FqX xh = fq_stage_pass<D, PD, FQ_ROLE_QKV>(hs, M, pass0, nw2 + l * D, s_x);
      if constexpr (ONCE_A) {
        const FqUnits blocks(F / 32, M, G);  // a unit: 32 outputs of a group of rows
        for (int u = blockIdx.x; u < blocks.count(); u += gridDim.x) {
          const int n0 = 32 * blocks.item(u);
          int lo, hi;
          blocks.rows(u, M, G, lo, hi);
          for (int m0 = max(lo, pass0); m0 < min(hi, pass0 + PD); m0 += G) {
#pragma unroll 1
            for (int c = 4 * warp; c < 4 * warp + 4; c += 2) {
              FqPart pg, pu;
              int rg, ru;
              const int fg = tab.part(4 * l + 2, n0 + c, pg, rg);
              const int fu = tab.part(4 * l + 2, F + n0 + c, pu, ru);
              gate_up(xh, pass0, n0 + c, m0, c, fg, pg, rg, fu, pu, ru);
            }
            __syncthreads();
            for (int g = warp; g < min(G, M - m0); g += FD_WARPS)
              fq_round_warp(s_act[g][lane], n0, aq8 + (size_t)(m0 + g) * F, ad8 + (size_t)(m0 + g) * (F / 32));
            __syncthreads();  // s_act is free for the next rows
          }
        }
      } else {
        const FqUnits units(F / 2, M, G);
        for (int u = gw; u < units.count(); u += nw) {
          const int n = 2 * units.item(u);
          int lo, hi;
          units.rows(u, M, G, lo, hi);
          FqPart pg, pu;
          int rg, ru;
          const int fg = tab.part(4 * l + 2, n, pg, rg), fu = tab.part(4 * l + 2, F + n, pu, ru);
          for (int m0 = max(lo, pass0); m0 < min(hi, pass0 + PD); m0 += G)
            gate_up(xh, pass0, n, m0, 0, fg, pg, rg, fu, pu, ru);
        }
      }
      fq_pass_done(pass0, PD, M);
    }
    if (gw < D) fq_prefetch_row(tab, 4 * l + 3, gw);
    fs_grid_sync(sync, ++phase);
    // -- E: down + residual -> xs (with sandwich norms, down alone: then E2)
    fq_residual_phase<F, D, G, FQ_ROLE_DOWN, MAXM, !SANDWICH>(tab, 4 * l + 3, act, hs, xs, M, gw, nw, s_x,
                                                              ONCE_A ? aq8 : nullptr, ad8);
    if (SANDWICH) {  // -- E2: xs = hs + norm(down) * the post-MLP norm
      fs_grid_sync(sync, ++phase);
      fs_post_norm<D>(xs, hs, pn2 + (size_t)l * D, M, gw, nw, EPS);
    }
    if (l + 1 < L) fs_prefetch_qkv(l + 1);
    else if (HEAD_MODE != 0 && 4 * gw < V) fq_prefetch_row(tab, HEAD_MAT, 4 * gw);
    fs_grid_sync(sync, ++phase);
    x = xs;
  }
  // -- head: final norm + LM head for rows [r0, M); RH outputs a warp (one part: the
  // table's check), the next item's rows fetched into L2 while these are summed
  if (HEAD_MODE != 0) {
#ifndef FQ_HEAD_ROWS
#define FQ_HEAD_ROWS 0
#endif
    constexpr int GH = MAXM == 1 || FQ_HEAD_ROWS == 0 ? G : FQ_HEAD_ROWS;  // rows a pass
    const int r0 = HEAD_MODE == 1 ? M - 1 : 0;
    const int rows_n = M - r0;
    constexpr int RH = 4;
    constexpr int ITEMS = (V + RH - 1) / RH;
    FqPart part;
    int first;
    const int fmt = tab.part(HEAD_MAT, 0, part, first);
    constexpr int PH = fq_pass_rows<D, GH, MAXM, FQ_ROLE_HEAD>();
    static_assert(PH >= GH, "a pass stages a dot product's rows of x");
    for (int pass0 = 0; pass0 < rows_n; pass0 += PH) {
      const FqX xf = fq_stage_pass<D, PH, FQ_ROLE_HEAD>(xs + (size_t)r0 * D, rows_n, pass0, nwf, s_x);
      for (int item = gw; item < ITEMS; item += nw) {
        int rows[RH];
#pragma unroll
        for (int j = 0; j < RH; ++j) rows[j] = min(RH * item + j, V - 1);
        if (item + nw < ITEMS) {
          const int next = RH * (item + nw), count = min(RH, V - next);
          const char* w = reinterpret_cast<const char*>(part.w + (size_t)next * part.row_words);
          for (int off = lane * 128; off < count * part.row_words * 4; off += 32 * 128)
            asm volatile("prefetch.global.L2 [%0];" ::"l"(w + off));
        }
        for (int m0 = pass0; m0 < min(rows_n, pass0 + PH); m0 += GH) {
          float acc[GH][RH], ss[GH];
          fq_dot<D, RH, GH, true, true, FQ_ROLE_HEAD>(fmt, part, rows, nwf, xf.at((m0 - pass0) * D), min(GH, rows_n - m0), acc, ss);
#pragma unroll
          for (int g = 0; g < GH; ++g) {
            if (m0 + g < rows_n && lane == 0) {
              const float rinv = 1.0f / sqrtf(ss[g] / D + EPS);
#pragma unroll
              for (int j = 0; j < RH; ++j)
                if (RH * item + j < V) logits[(size_t)(m0 + g) * V + RH * item + j] = acc[g][j] * rinv;
            }
          }
        }
      }
      fq_pass_done(pass0, PH, rows_n);
    }
  }
  if (blockIdx.x == 0 && threadIdx.x == 0) status[0] = sync[1];
