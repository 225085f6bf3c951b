"""Device buffers that GPU launches share: split-K workspaces and per-call scratch.

Both are kept per (device, stream), so calls on different streams never share one; while a
CUDA graph is being captured each call gets fresh buffers (the graph then owns them).
"""
from __future__ import annotations

import torch

__all__ = ["workspace", "scratch"]

_WS: dict = {}
_SCRATCH: dict = {}


def workspace(device: torch.device, floats: int, tiles: int) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 partials (``floats``) and zeroed int32 tile counters (``tiles``) of a split-K
    launch. The kernels leave the counters zero, so one pair per (device, stream) is
    reused; a fresh pair while a CUDA graph is being captured (the graph then owns it)."""
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        return (torch.empty(max(floats, 1), dtype=torch.float32, device=device),
                torch.zeros(max(tiles, 1), dtype=torch.int32, device=device))
    stream = torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0
    key = (device, stream)
    ws, cnt = _WS.get(key, (None, None))
    if ws is None or ws.numel() < floats or cnt.numel() < tiles:
        ws = torch.zeros(max(floats, 1 << 16), dtype=torch.float32, device=device)
        cnt = torch.zeros(max(tiles, 4096), dtype=torch.int32, device=device)
        _WS[key] = (ws, cnt)
    return ws, cnt


def scratch(shape: tuple, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """An intermediate buffer that only kernels of one call write and read (prepared
    activations): one per (device, stream, shape, dtype), reused by later calls on the stream
    (in stream order: each writer starts after the previous call's readers have finished,
    see the prep kernels' programmatic-launch waits); a fresh one while a CUDA graph is being
    captured."""
    if device.type != "cuda" or torch.cuda.is_current_stream_capturing():
        return torch.empty(shape, dtype=dtype, device=device)
    key = (device, torch.cuda.current_stream(device).cuda_stream, shape, dtype)
    t = _SCRATCH.get(key)
    if t is None:
        t = _SCRATCH[key] = torch.empty(shape, dtype=dtype, device=device)
    return t
