"""Ascend entry point, in the layout of DrivingSDK's mx_driving.patcher: apply ascend-patch, run train.py.

    torchrun --nproc-per-node N migrate_to_ascend/train.py [train.py's arguments]

On an Ascend machine each rank runs on its NPU over HCCL; ``ascend-patch run
--emulate-npu -m torch.distributed.run --nproc-per-node 2 migrate_to_ascend/train.py``
runs the same code paths on the CPU (gloo).
"""

import pathlib
import runpy
import sys

import ascend_patch_core


ascend_patch_core.apply()

project = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(project))
sys.argv[0] = str(project / "train.py")
runpy.run_path(str(project / "train.py"), run_name="__main__")
