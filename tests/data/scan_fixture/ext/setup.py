from setuptools import setup
from torch.utils.cpp_extension import BuildExtension
from torch.utils.cpp_extension import CUDAExtension


setup(
    name="fused_ops",
    ext_modules=[CUDAExtension("fused_ops", ["fused.cpp", "fused_kernel.cu"])],
    cmdclass={"build_ext": BuildExtension},
)
