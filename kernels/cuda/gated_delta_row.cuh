// One row of the gated delta rule for the value column P adjacent lanes own (Yang et al.
// 2024):
//
//     S *= exp(g);  delta = (v[j] - k . S[:, j]) * beta;  S[:, j] += k * delta;
//     o[j] = q . S[:, j]
//
// P adjacent lanes share column j, each holding DKP = DK / P of its rows in registers (s;
// with P = 1 a column of 128 floats leaves the one-launch step too few registers and
// spills, P = 2 does not: kernels/gated_delta_cuda.py's PAIR chooses); q and k point at
// the lane's rows of the row's features (shared memory). With P > 1 the partial dot
// products are summed over the lanes by a butterfly, whose additions commute, so every
// lane gets the same bits. decay = expf(g). Each operation is an explicit
// round-to-nearest intrinsic, in one order: the one-launch step's recurrence
// (fused_step_gdn.cuh) and the replay kernel (gated_delta_recurrent.cu), which both call
// this, give a state the same bits, so a verify's tape replayed to its kept rows equals
// those rows' single steps.
template <int DKP, int P>
__device__ __forceinline__ float gdn_row(
    float (&s)[DKP], const float* q, const float* k, float v, float decay, float beta) {
  float kv = 0.f;
#pragma unroll
  for (int i = 0; i < DKP; ++i) {
    s[i] = __fmul_rn(s[i], decay);
    kv = __fmaf_rn(s[i], k[i], kv);
  }
#pragma unroll
  for (int o = 1; o < P; o <<= 1) kv = __fadd_rn(kv, __shfl_xor_sync(0xffffffffu, kv, o));
  const float delta = __fmul_rn(__fsub_rn(v, kv), beta);
  float out = 0.f;
#pragma unroll
  for (int i = 0; i < DKP; ++i) {
    s[i] = __fmaf_rn(k[i], delta, s[i]);
    out = __fmaf_rn(s[i], q[i], out);
  }
#pragma unroll
  for (int o = 1; o < P; o <<= 1) out = __fadd_rn(out, __shfl_xor_sync(0xffffffffu, out, o));
  return out;
}
