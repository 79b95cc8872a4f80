// Body of a prefill chunk's causal attention in one launch (kernels/prefill_attention_cuda.py
// wraps it with mx.fast.cuda_kernel; T, D, BK and G from its template arguments, the rows L
// and keys S from q's and k's shapes, so one build takes every length: no build a shape,
// as cuDNN's graphs need). Row i sits at position S - L + i and reads keys 0 .. S - L + i.
//
// A block takes BQ = 16 rows of one query head (4 warps of 4 rows), and walks the keys its
// last row reads in tiles of BK, staged in shared memory as float32 beside its rows of q
// (scaled). A warp takes its rows one at a time: lane l scores key l % BK of the tile over
// 64 of the D features (32 / BK lanes a key, each every 32 / BK-th feature, so the 32
// lanes read 32 shared-memory banks; summed by a butterfly), then the row's
// running maximum, sum and D outputs (D / 32 a lane) take the tile the online-softmax way
// (Milakov & Gimelshein 2018; FlashAttention, Dao et al. 2022). Scores, softmax and sums in
// float32; the outputs in T.

    constexpr int WARPS = 4, ROWS = 4, BQ = WARPS * ROWS;
    constexpr int SUBS = 32 / BK;  // lanes a key
    constexpr int SLICE = D / SUBS;  // features a lane sums for its key
    constexpr int DL = D / 32;  // outputs a lane keeps
    const int L = q_shape[2], S = k_shape[2];
    const int offset = S - L;
    const int h = blockIdx.y, kvh = h / G;
    const int row0 = blockIdx.x * BQ;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int key_lane = lane % BK, sub = lane / BK;
    __shared__ float s_q[BQ][D];
    __shared__ float s_k[BK][D + SUBS];  // + SUBS: a score's 32 lanes read 32 banks
    __shared__ float s_v[BK][D];
    __shared__ float s_p[WARPS][BK];
    const float sc = scale[0];
    const float neg_inf = __int_as_float(0xff800000u);  // nvrtc's headers name no INFINITY
    for (int e = threadIdx.x; e < BQ * D; e += blockDim.x) {
        const int r = e / D, d = e % D, row = row0 + r;
        s_q[r][d] = row < L ? static_cast<float>(q[(static_cast<size_t>(h) * L + row) * D + d]) * sc
                            : 0.f;
    }
    float m[ROWS], l[ROWS], acc[ROWS][DL];
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
        m[r] = neg_inf;
        l[r] = 0.f;
#pragma unroll
        for (int c = 0; c < DL; ++c) acc[r][c] = 0.f;
    }
    const int last_row = min(row0 + BQ, L) - 1;
    const int key_end = offset + last_row + 1;  // keys the block's last row reads
    const size_t kv_base = static_cast<size_t>(kvh) * S;
    for (int k0 = 0; k0 < key_end; k0 += BK) {
        __syncthreads();  // the last tile's reads are done (and s_q is written, at the first)
        for (int e = threadIdx.x; e < BK * D; e += blockDim.x) {
            const int j = e / D, d = e % D, key = k0 + j;
            const bool in = key < S;
            s_k[j][d] = in ? static_cast<float>(k[(kv_base + key) * D + d]) : 0.f;
            s_v[j][d] = in ? static_cast<float>(v[(kv_base + key) * D + d]) : 0.f;
        }
        __syncthreads();
#pragma unroll
        for (int rr = 0; rr < ROWS; ++rr) {
            const int r = warp * ROWS + rr, row = row0 + r;
            const int limit = offset + row;  // the last key this row reads
            if (row >= L || k0 > limit) continue;  // the same for the whole warp
            float partial = 0.f;
#pragma unroll 8
            for (int i = 0; i < SLICE; ++i) {
                const int d = i * SUBS + sub;  // a key's lanes take every SUBS-th feature
                partial = fmaf(s_q[r][d], s_k[key_lane][d], partial);
            }
#pragma unroll
            for (int o = BK; o < 32; o <<= 1) partial += __shfl_xor_sync(0xffffffffu, partial, o);
            const bool valid = k0 + key_lane <= limit;
            const float score = valid ? partial : neg_inf;
            float top = score;
#pragma unroll
            for (int o = 1; o < BK; o <<= 1) top = fmaxf(top, __shfl_xor_sync(0xffffffffu, top, o));
            const float m_new = fmaxf(m[rr], top);  // finite: key k0 <= limit is read
            const float alpha = expf(m[rr] - m_new);  // 0 at the first tile (m = -inf)
            const float p = valid ? expf(score - m_new) : 0.f;
            float sum = p;
#pragma unroll
            for (int o = 1; o < BK; o <<= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
            l[rr] = l[rr] * alpha + sum;
            m[rr] = m_new;
            if (sub == 0) s_p[warp][key_lane] = p;
            __syncwarp();
#pragma unroll
            for (int c = 0; c < DL; ++c) {
                float a = acc[rr][c] * alpha;
                const int d = lane + 32 * c;
#pragma unroll 8
                for (int j = 0; j < BK; ++j) a = fmaf(s_p[warp][j], s_v[j][d], a);
                acc[rr][c] = a;
            }
            __syncwarp();  // s_p is read before the next row writes it
        }
    }
#pragma unroll
    for (int rr = 0; rr < ROWS; ++rr) {
        const int row = row0 + warp * ROWS + rr;
        if (row >= L) continue;
#pragma unroll
        for (int c = 0; c < DL; ++c) {
            out[(static_cast<size_t>(h) * L + row) * D + lane + 32 * c] =
                static_cast<T>(acc[rr][c] / l[rr]);
        }
    }
