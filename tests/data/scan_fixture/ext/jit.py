import torch
from torch.utils import cpp_extension
from torch.utils.cpp_extension import load


fused = load(name="fused_jit", sources=["fused.cpp", "fused_kernel.cu"])
cpu_only = load(name="cpu_only", sources=["cpu.cpp"])
inline = cpp_extension.load_inline(
    name="inline_ops", cpp_sources="", cuda_sources="__global__ void k() {}"
)
weights = torch.load("model.pt", map_location="cuda:1")
