// The agent's probe kernels (agent/src/cuda/probe.rs). The PTX beside this
// file is what the agent loads; regenerate it after a change here with
//   hack/gpu-tests.sh ptx   (nvcc on the GPU machine)
__device__ __forceinline__ unsigned int pattern(unsigned long long i, unsigned int seed) {
    unsigned int x = (unsigned int)i * 2654435761u ^ (unsigned int)(i >> 32) ^ seed;
    x ^= x >> 16; x *= 0x7feb352du; x ^= x >> 15; x *= 0x846ca68bu; x ^= x >> 16;
    return x;
}

extern "C" __global__ void fill_pattern(unsigned int* p, unsigned long long n, unsigned int seed) {
    unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        p[i] = pattern(i, seed);
    }
}

extern "C" __global__ void check_pattern(const unsigned int* p, unsigned long long n, unsigned int seed,
                                         unsigned long long* errors) {
    unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    unsigned long long bad = 0;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        bad += p[i] != pattern(i, seed);
    }
    for (int offset = 16; offset > 0; offset >>= 1) {
        bad += __shfl_down_sync(0xffffffffu, bad, offset);
    }
    if ((threadIdx.x & 31) == 0 && bad != 0) {
        atomicAdd(errors, bad);
    }
}
