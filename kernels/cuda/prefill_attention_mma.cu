// Body of a prefill chunk's causal attention on tensor cores (kernels/prefill_attention_cuda.py
// wraps it with mx.fast.cuda_kernel after prefill_attention_mma.cuh; T (bfloat16 or
// float16), D (64 or 128) and G from its template arguments, the rows L and keys S from
// q's and k's shapes, so one build takes every length). Row i sits at position S - L + i
// and reads keys 0 .. S - L + i: the same contract as prefill_attention.cu, whose scalar
// float32 loops this replaces for half-precision K/V.
//
// A block takes 64 rows of one query head, a warp 16 of them, and walks the keys its last
// row reads in tiles of 64: K's rows as they are and V transposed, in shared memory with
// 8 halves of padding a row, so a fragment's 32 lanes read 32 banks. A warp's scores are
// 8 tensor-core products of 16 x 8 a k-step (D / 16 k-steps, q's fragments held in
// registers throughout); the online softmax (Milakov & Gimelshein 2018; FlashAttention-2,
// Dao 2023) takes them in float32, base 2 with log2(e) folded into the scale, and its
// weights, rounded to T, are the A fragments of the product with V: the sums' layout of
// two adjacent 16 x 8 tiles is the layout of one 16 x 16 A tile. Sums and softmax in
// float32; the weights and the output in T.

    constexpr int WARPS = 4, BQ = 16 * WARPS, BKEYS = 64;
    constexpr int KSTEPS = D / 16;  // k-steps of a score product
    constexpr int NT = BKEYS / 8;   // 16 x 8 score tiles a warp a key tile
    constexpr int OT = D / 8;       // 16 x 8 output tiles a warp
    constexpr int KP = D + 8, VP = BKEYS + 8;  // padded rows, in halves
    static_assert(D % 16 == 0 && D <= 128, "head sizes of 16 to 128 features");
    const int L = q_shape[2], S = k_shape[2];
    const int offset = S - L;
    const int h = blockIdx.y, kvh = h / G;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int g = lane / 4, t = lane % 4;
    const int row0 = blockIdx.x * BQ, r0 = row0 + warp * 16;  // the warp's first row
    const int ra = r0 + g, rb = r0 + g + 8;                   // this thread's two rows
    __shared__ __align__(16) T s_k[BKEYS * KP];
    __shared__ __align__(16) T s_vt[D * VP];
    const float scale_log2 = scale[0] * 1.4426950408889634f;
    const float neg_inf = __int_as_float(0xff800000u);  // nvrtc's headers name no INFINITY
    const uint32_t* q32 = reinterpret_cast<const uint32_t*>(q);
    const uint32_t* k32 = reinterpret_cast<const uint32_t*>(k);
    const uint32_t* v32 = reinterpret_cast<const uint32_t*>(v);

    uint32_t qa[KSTEPS][4];  // q's A fragments, zeros past the last row
#pragma unroll
    for (int ks = 0; ks < KSTEPS; ++ks) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int row = i % 2 ? rb : ra, col = ks * 16 + (i / 2) * 8 + 2 * t;
            qa[ks][i] = row < L ? q32[((static_cast<size_t>(h) * L + row) * D + col) / 2] : 0u;
        }
    }
    float o[OT][4], m[2] = {neg_inf, neg_inf}, l[2] = {0.f, 0.f};
#pragma unroll
    for (int ot = 0; ot < OT; ++ot) o[ot][0] = o[ot][1] = o[ot][2] = o[ot][3] = 0.f;

    const int last_row = min(row0 + BQ, L) - 1;
    const int key_end = offset + last_row + 1;  // keys the block's last row reads (<= S)
    const size_t kv_base = static_cast<size_t>(kvh) * S;
    for (int k0 = 0; k0 < key_end; k0 += BKEYS) {
        __syncthreads();  // the last tile's reads are done
        for (int e = threadIdx.x; e < BKEYS * D / 2; e += blockDim.x) {
            const int j = e / (D / 2), d = 2 * (e % (D / 2)), key = k0 + j;
            const bool in = key < S;
            const uint32_t kw = in ? k32[((kv_base + key) * D + d) / 2] : 0u;
            const uint32_t vw = in ? v32[((kv_base + key) * D + d) / 2] : 0u;
            *reinterpret_cast<uint32_t*>(&s_k[j * KP + d]) = kw;
            const T* pair = reinterpret_cast<const T*>(&vw);
            s_vt[d * VP + j] = pair[0];
            s_vt[(d + 1) * VP + j] = pair[1];
        }
        __syncthreads();
        // a warp past the rows, or whose rows read no key of this tile, waits for the next
        if (r0 >= L || offset + r0 + 15 < k0) continue;
        float sc[NT][4];
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
            sc[nt][0] = sc[nt][1] = sc[nt][2] = sc[nt][3] = 0.f;
            const T* krow = &s_k[(nt * 8 + g) * KP + 2 * t];
#pragma unroll
            for (int ks = 0; ks < KSTEPS; ++ks) {
                const uint32_t b0 = *reinterpret_cast<const uint32_t*>(krow + ks * 16);
                const uint32_t b1 = *reinterpret_cast<const uint32_t*>(krow + ks * 16 + 8);
                pa_mma(sc[nt], qa[ks], b0, b1, T());
            }
        }
        // the online softmax, two rows a thread, each row's 64 keys over a quad of lanes
        float top[2] = {neg_inf, neg_inf};
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const int key = k0 + nt * 8 + 2 * t + i % 2, row = i < 2 ? ra : rb;
                const bool valid = key < S && key <= offset + row;
                sc[nt][i] = valid ? sc[nt][i] * scale_log2 : neg_inf;
                top[i / 2] = fmaxf(top[i / 2], sc[nt][i]);
            }
        }
        float alpha[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            top[r] = fmaxf(top[r], __shfl_xor_sync(0xffffffffu, top[r], 1));
            top[r] = fmaxf(top[r], __shfl_xor_sync(0xffffffffu, top[r], 2));
            const float m_new = fmaxf(m[r], top[r]);  // finite: key 0 is every row's
            alpha[r] = exp2f(m[r] - m_new);            // 0 at the first tile (m = -inf)
            m[r] = m_new;
        }
        float sum[2] = {0.f, 0.f};
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                sc[nt][i] = exp2f(sc[nt][i] - m[i / 2]);  // 0 where masked
                sum[i / 2] += sc[nt][i];
            }
        }
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            sum[r] += __shfl_xor_sync(0xffffffffu, sum[r], 1);
            sum[r] += __shfl_xor_sync(0xffffffffu, sum[r], 2);
            l[r] = l[r] * alpha[r] + sum[r];
        }
#pragma unroll
        for (int ot = 0; ot < OT; ++ot) {
            o[ot][0] *= alpha[0];
            o[ot][1] *= alpha[0];
            o[ot][2] *= alpha[1];
            o[ot][3] *= alpha[1];
        }
        // weights times V: a 16-key step's A fragment is score tiles 2kk and 2kk + 1
#pragma unroll
        for (int kk = 0; kk < BKEYS / 16; ++kk) {
            const uint32_t pa[4] = {
                pa_pack(sc[2 * kk][0], sc[2 * kk][1], T()),
                pa_pack(sc[2 * kk][2], sc[2 * kk][3], T()),
                pa_pack(sc[2 * kk + 1][0], sc[2 * kk + 1][1], T()),
                pa_pack(sc[2 * kk + 1][2], sc[2 * kk + 1][3], T()),
            };
#pragma unroll
            for (int ot = 0; ot < OT; ++ot) {
                const T* vrow = &s_vt[(ot * 8 + g) * VP + kk * 16 + 2 * t];
                const uint32_t b0 = *reinterpret_cast<const uint32_t*>(vrow);
                const uint32_t b1 = *reinterpret_cast<const uint32_t*>(vrow + 8);
                pa_mma(o[ot], pa, b0, b1, T());
            }
        }
    }
    uint32_t* out32 = reinterpret_cast<uint32_t*>(out);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int row = r ? rb : ra;
        if (row >= L) continue;
        const float inv = 1.0f / l[r];
#pragma unroll
        for (int ot = 0; ot < OT; ++ot) {
            const int col = ot * 8 + 2 * t;
            out32[((static_cast<size_t>(h) * L + row) * D + col) / 2] =
                pa_pack(o[ot][2 * r] * inv, o[ot][2 * r + 1] * inv, T());
        }
    }
