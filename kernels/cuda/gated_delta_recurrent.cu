// Body of the gated delta recurrence (kernels/gated_delta_cuda.py wraps it with
// mx.fast.cuda_kernel, after gated_delta_row.cuh; DK, H, Dv, P and T come from its
// template arguments, the row count L from q's shape: one build takes any number of rows,
// a verify's, a replay's or a prefill chunk's). A block takes value columns of one head,
// P adjacent threads one column S[:, j] (DK / P rows each, in registers); each row's q and
// k are read once a block into shared memory, as float32. Every lane of a warp takes part
// in the lanes' sums (a column past Dv computes on zeros and writes nothing).

    constexpr int DKP = DK / P;
    const int L = q_shape[0];
    const int tid = threadIdx.x + blockIdx.x * blockDim.x;
    const int j = tid / P, part = tid % P;  // value column, its rows
    const int h = blockIdx.y;                              // head
    __shared__ float s_q[DK], s_k[DK];
    float s[DKP];
#pragma unroll
    for (int i = 0; i < DKP; ++i) s[i] = j < Dv ? state[(h * DK + part * DKP + i) * Dv + j] : 0.f;
    for (int t = 0; t < L; ++t) {
        const int row = t * H + h;
        for (int i = threadIdx.x; i < DK; i += blockDim.x) {
            s_q[i] = static_cast<float>(q[row * DK + i]);
            s_k[i] = static_cast<float>(k[row * DK + i]);
        }
        __syncthreads();
        const float decay = expf(static_cast<float>(g[row]));
        const float v_j = j < Dv ? static_cast<float>(v[row * Dv + j]) : 0.f;
        const float o = gdn_row<DKP, P>(s, s_q + part * DKP, s_k + part * DKP, v_j, decay,
                                     static_cast<float>(beta[row]));
        if (j < Dv && part == 0) out[row * Dv + j] = static_cast<T>(o);
        __syncthreads();
    }
    if (j < Dv) {
#pragma unroll
        for (int i = 0; i < DKP; ++i) state_out[(h * DK + part * DKP + i) * Dv + j] = s[i];
    }
