from torch import nn


try:
    from flash_attn import flash_attn_func
except ImportError:
    flash_attn_func = None

import xformers.ops as xops


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 4)

    def forward(self, x):
        if flash_attn_func is None:
            return self.fc(xops.memory_efficient_attention(x, x, x)).to(0)
        return self.fc(flash_attn_func(x, x, x))
