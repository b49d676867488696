"""Building blocks shared by the target and the DFlash drafter: RMSNorm, RoPE, SwiGLU MLP
and masked grouped-query attention, in plain PyTorch: the DFlash training path and the
modules whose weights checkpoints name. Inference runs through ddtree/models/ops.py."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ddtree.models import ops


class RMSNorm(nn.Module):
    """RMSNorm computed in float32, cast back to the input dtype (as Llama/Qwen3 do)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight: nn.Parameter = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        dtype = x.dtype
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(dtype)


class SwiGLU(nn.Module):
    """The Llama/Qwen3 MLP: down(silu(gate(x)) * up(x)). `forward` is the training path;
    inference runs `infer` on one fused [gate | up] weight (`fuse`)."""

    def __init__(self, hidden_size: int, intermediate_size: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)
        self.gate_up_weight: Tensor | None = None

    def fuse(self, share: bool) -> None:
        """Builds [gate | up] (one GEMM). share: the two projections become views of it (a
        frozen model keeps one copy); else they stay as they are (still trainable)."""
        fused = torch.cat([self.gate_proj.weight.detach(), self.up_proj.weight.detach()])
        self.gate_up_weight = fused.contiguous()
        if share:
            gate, up = self.gate_up_weight.split(self.gate_proj.weight.shape[0])
            self.gate_proj.weight = nn.Parameter(gate, requires_grad=False)
            self.up_proj.weight = nn.Parameter(up, requires_grad=False)

    def infer(self, backend: ops.Backend, x: Tensor) -> Tensor:
        """x: (T, H) -> (T, H) through the backend's kernels."""
        assert self.gate_up_weight is not None, "fuse the model's weights after loading"
        return self.down(backend, ops.linear(backend, x, self.gate_up_weight))  # via (T, 2I)

    def down(self, backend: ops.Backend, gate_up: Tensor) -> Tensor:
        """gate_up: (T, 2I) = [gate | up] -> down(silu(gate) * up): (T, H), the SwiGLU
        inside the down GEMM when the backend fuses (the decoders compute gate_up with
        the norm before it fused in: `ops.norm_linear`)."""
        return ops.swiglu_down(backend, gate_up, self.down_proj.weight)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Rotary(nn.Module):
    """Rotary position embedding (the half-split convention of HF Llama/Qwen3).

    `inv_freq` is a float32 buffer; cos/sin are computed per call from integer positions,
    so any position (tree nodes share positions) costs the same and nothing is cached.
    """

    def __init__(self, head_dim: int, theta: float) -> None:
        super().__init__()
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
        self.inv_freq: Tensor
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def _apply(self, fn, recurse: bool = True):  # type: ignore[no-untyped-def]
        # `module.to(torch.bfloat16)` would round the frequencies too, putting angles at
        # position ~1000 off by radians: keep the float32 values, follow only the device.
        original = self.inv_freq
        super()._apply(fn, recurse)
        if self.inv_freq.dtype != torch.float32 and not self.inv_freq.is_meta:
            self.inv_freq = original.to(self.inv_freq.device)
        return self

    def cos_sin(self, positions: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """positions: (B, M) int -> cos, sin: (B, 1, M, D) in `dtype`."""
        freqs = positions.float()[..., None] * self.inv_freq  # (B, M, D/2)
        emb = torch.cat((freqs, freqs), dim=-1)  # (B, M, D)
        return emb.cos().to(dtype)[:, None], emb.sin().to(dtype)[:, None]


def rotate_half(x: Tensor) -> Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x: (B, H, M, D); cos, sin: (B, 1, M, D)."""
    return x * cos + rotate_half(x) * sin


def attend(q: Tensor, k: Tensor, v: Tensor, visible: Tensor, scale: float) -> Tensor:
    """Masked grouped-query attention.

    q: (B, Hq, M, D); k, v: (B, Hkv, S, D); visible: (B, M, S) bool, True where query m
    may attend to key s. Returns (B, Hq, M, D). Every query row must see at least one key.
    """
    num_groups = q.shape[1] // k.shape[1]
    if num_groups > 1:
        k = k.repeat_interleave(num_groups, dim=1)  # (B, Hq, S, D)
        v = v.repeat_interleave(num_groups, dim=1)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=visible[:, None], scale=scale)
