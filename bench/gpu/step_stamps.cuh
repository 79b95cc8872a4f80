// Cycle stamps for the one-launch step, in bench/gpu/step_probe.py's build of it only: the
// engine's kernel (kernels/cuda/fused_step.cu) has none. The probe's header renames the
// kernel's grid barrier to fs_grid_sync_unstamped and this file defines fs_grid_sync
// around it, so the kernel body is the engine's, unchanged.
//
// stamps [slots, blocks + 1] then two totals: row e - 1 for the barrier ending phase e
// (embed, then each layer's phases: bench/gpu/step_stamps.py's `phases`), the last row for
// the head. Column 0: block 0's cycles
// between releases (the phase's interval); column 1 + b: block b's cycles from the last
// release to its arrival (its work in the phase). Then the launch's time in ns
// (%globaltimer) and in cycles, to turn cycles into time.

__shared__ unsigned int* fs_stamps;          // the kernel's `stamps` output
__shared__ long long fs_t_release, fs_t_start;  // thread 0's clock: last release, start
__shared__ unsigned long long fs_ns_start;

__device__ __forceinline__ void fs_stamps_begin(unsigned int* stamps) {
  if (threadIdx.x == 0) {
    fs_stamps = stamps;
    fs_t_release = fs_t_start = clock64();
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(fs_ns_start));
  }
}

__device__ __forceinline__ void fs_grid_sync(unsigned int* flags, unsigned int epoch) {
  const unsigned int row = (epoch - 1) * (gridDim.x + 1);
  __syncthreads();  // the block's work is done: stamp it before arriving
  if (threadIdx.x == 0)
    fs_stamps[row + 1 + blockIdx.x] = (unsigned int)(clock64() - fs_t_release);
  fs_grid_sync_unstamped(flags, epoch);
  if (threadIdx.x == 0) {
    const long long now = clock64();
    if (blockIdx.x == 0) fs_stamps[row] = (unsigned int)(now - fs_t_release);
    fs_t_release = now;
  }
}

__device__ __forceinline__ void fs_stamps_end(int slots) {
  __syncthreads();
  if (threadIdx.x == 0) {
    const unsigned int row = gridDim.x + 1;
    fs_stamps[(slots - 1) * row + 1 + blockIdx.x] = (unsigned int)(clock64() - fs_t_release);
    if (blockIdx.x == 0) {
      unsigned long long ns_end;
      asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns_end));
      fs_stamps[slots * row] = (unsigned int)(ns_end - fs_ns_start);
      fs_stamps[slots * row + 1] = (unsigned int)(clock64() - fs_t_start);
    }
  }
}
