// Body of the nucleus pack and the device's draw from it, one block a logits row
// (kernels/nucleus_pack_cuda.py wraps it with mx.fast.cuda_kernel, after
// nucleus_pack.cuh; K, the pack's size, is a template argument, the row's length V is
// read from rows' shape). It computes what engine/device_sampling.py's `pack` and
// `_token_among` compute from MLX operations, in one launch where those take a dozen:
//
//   packed[r] = [the K largest logits, their ids, the float32 weight exp(x / T - max / T)
//                of the row's other logits, how many logits are >= the least of the K, V]
//   token[r]  = the nucleus draw at uniform u from that pack
//
// The K largest are found by a radix select on the floats' ordered bits, eight bits a
// pass from the top: each pass counts the candidates still matching the chosen prefix by
// their next byte, and one thread walks the counts from the top. Ties at the K-th value
// fill the last places in no set order; the count then says more than K, and the host's
// draw (engine/sampling_candidates.py) reads the whole row instead. A NaN anywhere makes
// the other tokens' weight NaN, which the host's draw refuses alike.
//
// settings: [temperature, top_p], u: [u], float32 (as MLX meets the Python floats).
//
// One block reads the row five times (four radix passes, then the pack's), NP_E logits a
// thread a batch (nucleus_pack.cuh), so its loads overlap one another, and warp 0 picks each
// pass's bin by a scan (the first form read a logit a thread at a time and walked the bins
// in one thread: 341 against 212 us a pack of 151,936 logits on an H100).

    const int V = rows_shape[1];
    const int r = blockIdx.y;
    const int t = threadIdx.x, NT = blockDim.x;
    const float* x = rows + (size_t)r * V;
    __shared__ float f_scratch[32];
    __shared__ int i_scratch[32];
    __shared__ unsigned int hist[256];
    __shared__ unsigned int s_prefix, s_remaining, s_gt, s_eq;
    __shared__ int s_at;
    __shared__ float s_val[K], s_p[K], s_ord[K], s_cdf[K];
    __shared__ int s_id[K], s_by_id[K];
    __shared__ float s_params[3];
    // host-written (u each step): read once, not by every thread
    if (t < 2) s_params[t] = settings[t];
    if (t == 2) s_params[2] = u[0];
    if (t == 0) {
        s_gt = 0u;
        s_eq = 0u;
    }
    const bool vec = (V & 3) == 0 && (reinterpret_cast<unsigned long long>(x) & 15ull) == 0ull;

    // the K-th largest key: a prefix a byte longer each pass; `remaining`, how many of the
    // keys matching it belong in the pack. The first pass also finds the largest logit and
    // whether any is NaN.
    float m = __int_as_float(0xff800000);  // -inf
    int nan_seen = 0;
    unsigned int prefix = 0u, mask = 0u, remaining = K;
    const int lane = t & 31;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int b = t; b < 256; b += NT) hist[b] = 0u;
        __syncthreads();
        for (int base = 0; base < V; base += NT * NP_E) {  // whole warps, for the lanes' match
            float v[NP_E];
            np_batch(x, V, base, vec, v);
#pragma unroll
            for (int e = 0; e < NP_E; ++e) {
                const bool in = np_index(base, vec, e) < V;
                const unsigned int key = in ? np_key(v[e]) : 0u;
                if (shift == 24 && in) {
                    m = fmaxf(m, v[e]);
                    nan_seen |= v[e] != v[e];
                }
                const unsigned int bin = (in && (key & mask) == prefix) ? (key >> shift) & 255u : 256u;
                const unsigned int peers = __match_any_sync(0xffffffffu, bin);
                if (bin < 256u && lane == __ffs(peers) - 1) atomicAdd(&hist[bin], (unsigned int)__popc(peers));
            }
        }
        __syncthreads();
        if (t < 32) np_pick(hist, prefix, remaining, shift, &s_prefix, &s_remaining);
        __syncthreads();
        prefix = s_prefix;
        remaining = s_remaining;
        mask |= 255u << shift;
    }
    m = np_block_reduce<true>(m, f_scratch);
    nan_seen = np_block_count(nan_seen, i_scratch);
    const float temperature = s_params[0], top_p = s_params[1], at = s_params[2];
    const float least = np_unkey(prefix);

    // the pack's places, the other tokens' weight, and the count at or above the least
    const float top = __fdiv_rn(m, temperature);  // MLX's max of x / T: T > 0, monotone
    const unsigned int above = K - remaining;
    float rest = 0.f;
    int count = 0;
    for (int base = 0; base < V; base += NT * NP_E) {
        float v[NP_E];
        np_batch(x, V, base, vec, v);
#pragma unroll
        for (int e = 0; e < NP_E; ++e) {
            const int id = np_index(base, vec, e);
            if (id >= V) continue;
            const unsigned int key = np_key(v[e]);
            if (key > prefix) {
                const unsigned int at = atomicAdd(&s_gt, 1u);
                s_val[at] = v[e];
                s_id[at] = id;
            } else if (key == prefix) {
                const unsigned int eq = atomicAdd(&s_eq, 1u);
                if (eq < remaining) {
                    s_val[above + eq] = v[e];
                    s_id[above + eq] = id;
                }
            }
            if (v[e] < least) rest += expf(__fdiv_rn(v[e], temperature) - top);
            count += v[e] >= least;
        }
    }
    rest = np_block_reduce<false>(rest, f_scratch);
    count = np_block_count(count, i_scratch);
    if (nan_seen) rest = __int_as_float(0x7fc00000);  // NaN
    float* out = packed + (size_t)r * (2 * K + 3);
    for (int j = t; j < K; j += NT) {
        out[j] = s_val[j];
        out[K + j] = (float)s_id[j];
    }
    if (t == 0) {
        out[2 * K] = rest;
        out[2 * K + 1] = (float)count;
        out[2 * K + 2] = (float)V;
    }

    // the draw: the weights in descending order, the nucleus's cut, and the first token
    // in ascending ids whose running weight passes u of the nucleus's
    if (t < K) s_p[t] = expf(__fdiv_rn(s_val[t], temperature) - top);
    __syncthreads();
    if (t < K) {
        const float p = s_p[t];
        const int id = s_id[t];
        int rank = 0, by_id = 0;
        for (int i = 0; i < K; ++i) {
            const float q = s_p[i];
            rank += (q > p) || (q == p && i < t);
            by_id += s_id[i] < id;
        }
        s_ord[rank] = p;
        s_by_id[by_id] = t;
    }
    const float total = np_block_reduce<false>(t < K ? s_p[t] : 0.f, f_scratch) + rest;
    for (int j = t; j < K; j += NT) s_cdf[j] = s_ord[j];
    np_scan(s_cdf, K);
    const int short_of = np_block_count(t < K && s_cdf[t] / total < top_p, i_scratch);
    const float cut = s_ord[min(short_of, K - 1)];
    if (t < K) {
        const float p = s_p[s_by_id[t]];
        s_cdf[t] = p < cut ? 0.f : p;
    }
    if (t == 0) s_at = K;
    np_scan(s_cdf, K);
    if (t < K && s_cdf[t] > at * s_cdf[K - 1]) atomicMin(&s_at, t);
    __syncthreads();
    if (t == 0) token[r] = (unsigned int)s_id[s_by_id[s_at == K ? 0 : s_at]];
