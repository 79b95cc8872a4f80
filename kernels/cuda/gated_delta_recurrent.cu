// Body of the gated delta recurrence (kernels/gated_delta_cuda.py wraps it with
// mx.fast.cuda_kernel; DK, L, H, Dv and T come from its template arguments).

    const int j = threadIdx.x + blockIdx.x * blockDim.x;  // value column
    const int h = blockIdx.y;                              // head
    if (j >= Dv) return;
    float s[DK];
    for (int i = 0; i < DK; ++i) s[i] = state[(h * DK + i) * Dv + j];
    for (int t = 0; t < L; ++t) {
        const int row = t * H + h;
        const float decay = expf(static_cast<float>(g[row]));
        const float b = static_cast<float>(beta[row]);
        float kv = 0.f;
        for (int i = 0; i < DK; ++i) {
            s[i] *= decay;
            kv += s[i] * static_cast<float>(k[row * DK + i]);
        }
        const float delta = (static_cast<float>(v[row * Dv + j]) - kv) * b;
        float o = 0.f;
        for (int i = 0; i < DK; ++i) {
            s[i] += static_cast<float>(k[row * DK + i]) * delta;
            o += s[i] * static_cast<float>(q[row * DK + i]);
        }
        out[row * Dv + j] = static_cast<T>(o);
    }
    for (int i = 0; i < DK; ++i) state_out[(h * DK + i) * Dv + j] = s[i];
