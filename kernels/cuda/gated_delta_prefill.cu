// Body of a prefill chunk's gated delta recurrence (kernels/gated_delta_cuda.py's
// gated_delta_prefill wraps it with mx.fast.cuda_kernel, after gated_delta_row.cuh; DK, H,
// Dv, P and T from its template arguments, the row count L from q's shape). The same rows
// as gated_delta_recurrent.cu at the same P, bit for bit (one gdn_row a row, in the same
// order), with the next row's inputs fetched while this row computes: a row's q and k
// into registers, then into the other of two shared buffers after the row's arithmetic,
// and its decay, beta and value beside them, so a row waits on no global load. One
// barrier a row: it ends the reads of one buffer before the next row writes it and makes
// the other's writes visible. The block is at least DK threads (a thread a feature).

    constexpr int DKP = DK / P;
    const int L = q_shape[0];
    const int tid = threadIdx.x + blockIdx.x * blockDim.x;
    const int j = tid / P, part = tid % P;  // value column, its rows
    const int h = blockIdx.y;                // head
    const bool column = j < Dv;              // a column past Dv computes on zeros
    const bool feature = threadIdx.x < DK;   // the thread that fetches feature threadIdx.x
    __shared__ float s_q[2][DK], s_k[2][DK];
    float s[DKP];
#pragma unroll
    for (int i = 0; i < DKP; ++i) s[i] = column ? state[(h * DK + part * DKP + i) * Dv + j] : 0.f;
    float next_q = 0.f, next_k = 0.f, next_g = 0.f, next_beta = 0.f, next_v = 0.f;
    if (L > 0) {
        if (feature) {
            s_q[0][threadIdx.x] = static_cast<float>(q[h * DK + threadIdx.x]);
            s_k[0][threadIdx.x] = static_cast<float>(k[h * DK + threadIdx.x]);
        }
        next_g = static_cast<float>(g[h]);
        next_beta = static_cast<float>(beta[h]);
        next_v = column ? static_cast<float>(v[h * Dv + j]) : 0.f;
    }
    __syncthreads();
    for (int t = 0; t < L; ++t) {
        const int b = t & 1;
        const float decay = expf(next_g), row_beta = next_beta, v_j = next_v;
        const bool more = t + 1 < L;
        if (more) {  // row t + 1's inputs, in flight while row t computes
            const int next = (t + 1) * H + h;
            if (feature) {
                next_q = static_cast<float>(q[next * DK + threadIdx.x]);
                next_k = static_cast<float>(k[next * DK + threadIdx.x]);
            }
            next_g = static_cast<float>(g[next]);
            next_beta = static_cast<float>(beta[next]);
            next_v = column ? static_cast<float>(v[next * Dv + j]) : 0.f;
        }
        const float o = gdn_row<DKP, P>(s, s_q[b] + part * DKP, s_k[b] + part * DKP, v_j, decay,
                                     row_beta);
        if (column && part == 0) out[(t * H + h) * Dv + j] = static_cast<T>(o);
        if (more && feature) {  // the other buffer: its last reads ended at the last barrier
            s_q[b ^ 1][threadIdx.x] = next_q;
            s_k[b ^ 1][threadIdx.x] = next_k;
        }
        __syncthreads();
    }
    if (column) {
#pragma unroll
        for (int i = 0; i < DKP; ++i) state_out[(h * DK + part * DKP + i) * Dv + j] = s[i];
    }
