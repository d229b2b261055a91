"""RMSNorm as the Llama family computes it: in float32, then back to the input dtype, then the weight.

``y = weight * (x / sqrt(mean(x^2) + eps))``; the statistics are float32 whatever the model's
dtype (bfloat16 on a GPU), which is what the reference implementations do, so a bfloat16 engine
rounds where they round.
"""

from __future__ import annotations

import torch


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMS-normalize ``x`` over its last axis and scale by ``weight``."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)
