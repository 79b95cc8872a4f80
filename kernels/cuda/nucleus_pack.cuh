// Device helpers of the nucleus pack (kernels/cuda/nucleus_pack.cu). Every function here
// is called by every thread of the block, which it synchronizes.

// A float's bits as an unsigned key in the floats' order (larger float, larger key).
__device__ __forceinline__ unsigned int np_key(float f) {
    const unsigned int b = __float_as_uint(f);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

__device__ __forceinline__ float np_unkey(unsigned int k) {
    return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

// The block's sum (MAX: its largest value) of each thread's `v`, in every thread.
template <bool MAX>
__device__ float np_block_reduce(float v, float* scratch) {
    for (int o = 16; o > 0; o >>= 1) {
        const float w = __shfl_xor_sync(0xffffffffu, v, o);
        v = MAX ? fmaxf(v, w) : v + w;
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    __syncthreads();  // `scratch`'s last readers are done
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    const int warps = (blockDim.x + 31) >> 5;
    v = lane < warps ? scratch[lane] : (MAX ? __int_as_float(0xff800000) : 0.f);
    for (int o = 16; o > 0; o >>= 1) {
        const float w = __shfl_xor_sync(0xffffffffu, v, o);
        v = MAX ? fmaxf(v, w) : v + w;
    }
    return v;
}

__device__ int np_block_count(int v, int* scratch) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < ((blockDim.x + 31) >> 5) ? scratch[lane] : 0;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// Inclusive prefix sums of a[0..n) in place (n <= blockDim.x), after the block's writes.
__device__ void np_scan(float* a, int n) {
    const int t = threadIdx.x;
    __syncthreads();
    for (int off = 1; off < n; off <<= 1) {
        const float add = (t < n && t >= off) ? a[t - off] : 0.f;
        __syncthreads();
        if (t < n) a[t] += add;
        __syncthreads();
    }
}

// Logits a thread takes a batch: NP_U float4 loads in flight (or 4 * NP_U floats where the
// row is not float4-aligned), so a pass over the row waits on its loads a few times, not once
// a logit (one block reads the whole row, five passes).
#define NP_U 4
#define NP_E (4 * NP_U)

// Logit e of thread t's batch at `base`: float4 j = e / 4 of the batch lies at
// base / 4 + j * NT + t (vec), logit e at base + e * NT + t (not vec); either way the
// block's batch is [base, base + NT * NP_E).
__device__ __forceinline__ int np_index(int base, bool vec, int e) {
    const int t = threadIdx.x, NT = blockDim.x;
    return vec ? 4 * (base / 4 + (e / 4) * NT + t) + (e & 3) : base + e * NT + t;
}

// The batch at `base` of row x [V] in thread t's hands (0 past the row's end).
__device__ __forceinline__ void np_batch(const float* x, int V, int base, bool vec, float (&v)[NP_E]) {
    if (vec) {
#pragma unroll
        for (int j = 0; j < NP_U; ++j) {
            const int i = np_index(base, true, 4 * j);
            float4 f = make_float4(0.f, 0.f, 0.f, 0.f);
            if (i < V) f = __ldg(reinterpret_cast<const float4*>(x + i));
            v[4 * j] = f.x; v[4 * j + 1] = f.y; v[4 * j + 2] = f.z; v[4 * j + 3] = f.w;
        }
    } else {
#pragma unroll
        for (int e = 0; e < NP_E; ++e) {
            const int i = np_index(base, false, e);
            v[e] = i < V ? __ldg(x + i) : 0.f;
        }
    }
}

// Warp 0's part of a radix pass: the highest bin b whose count with every bin above it
// reaches `remaining` (else 0), as a walk from bin 255 down finds it, here in eight bins a
// lane and a scan across the lanes. Writes the prefix grown by b and what remains of it.
__device__ __forceinline__ void np_pick(
    const unsigned int* hist, unsigned int prefix, unsigned int remaining, int shift,
    unsigned int* s_prefix, unsigned int* s_remaining) {
    const int lane = threadIdx.x & 31;
    unsigned int c[8], own = 0u;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
        c[j] = hist[255 - 8 * lane - j];
        own += c[j];
    }
    unsigned int incl = own;  // bins 255 .. 255 - 8 * lane - 7
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const unsigned int n = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += n;
    }
    const unsigned int reach = __ballot_sync(0xffffffffu, incl >= remaining);
    const int first = reach ? __ffs(reach) - 1 : 31;
    if (lane == first) {
        unsigned int above = incl - own;
        int b = 255 - 8 * lane - 7;
        bool found = false;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            if (!found) {
                if (j == 7 || above + c[j] >= remaining) {
                    b = 255 - 8 * lane - j;
                    found = true;
                } else {
                    above += c[j];
                }
            }
        }
        *s_prefix = prefix | ((unsigned int)b << shift);
        *s_remaining = remaining - above;
    }
}
