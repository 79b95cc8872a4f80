// Body of a one-thread kernel that reads the number of SMs (%nsmid).

  if (threadIdx.x == 0) {
    unsigned int n;
    asm volatile("mov.u32 %0, %%nsmid;" : "=r"(n));
    out[0] = static_cast<int>(n);
  }
