__global__ void fused_kernel(float* x) { x[threadIdx.x] *= 2.0f; }
