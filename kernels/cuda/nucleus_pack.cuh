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
