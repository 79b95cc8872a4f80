// Header of prefill_attention_mma.cu: one warp-wide tensor-core product of a 16 x 16 tile
// of A (row-major) by a 16 x 8 tile of B (column-major) into 16 x 8 float32 sums
// (PTX `mma.sync.aligned.m16n8k16`), for bfloat16 and float16 operands, and two floats
// packed as the operands' pair of halves (the lower-indexed element in the low 16 bits).
//
// With g = lane / 4 and t = lane % 4, a thread holds (PTX ISA, "Matrix fragments for
// mma.m16n8k16"): A's a[0] = (row g, cols 2t, 2t+1), a[1] = (row g + 8, the same cols),
// a[2] = (row g, cols 2t + 8, 2t + 9), a[3] = (row g + 8, those); B's b0 = (rows 2t, 2t + 1,
// col g), b1 = (rows 2t + 8, 2t + 9, col g); the sums' c[0], c[1] = (row g, cols 2t, 2t + 1)
// and c[2], c[3] = (row g + 8, those).

__device__ __forceinline__ void pa_mma(float* c, const uint32_t* a, uint32_t b0, uint32_t b1,
                                       __nv_bfloat16) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void pa_mma(float* c, const uint32_t* a, uint32_t b0, uint32_t b1,
                                       __half) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t pa_pack(float lo, float hi, __nv_bfloat16) {
  const __nv_bfloat162 pair = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&pair);
}

__device__ __forceinline__ uint32_t pa_pack(float lo, float hi, __half) {
  const __half2 pair = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&pair);
}
