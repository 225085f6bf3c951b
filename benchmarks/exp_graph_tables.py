"""Two CUDA graphs captured on a weight never used eagerly, the second replayed alone (H200):
prints its error against float64 and whether decode_tma's tables were kept on the weight.
Run it on a tree (``cd trees/X && PYTHONPATH=$PWD python /path/to/exp_graph_tables.py``) to see
what that tree's ``ms.linear`` does."""
import torch

import microscale as ms
from microscale import qlinear as L

L._DECODE_TMA = "graph"
g = torch.Generator(device="cuda").manual_seed(11)
for fmt in ("nvfp4", "mxfp4"):
    q = ms.quantize(torch.randn(512, 1024, device="cuda", generator=g), fmt)
    if fmt == "mxfp4":
        L._e8m0_window(q)  # scanned outside the captures (it needs a host sync)
    x12 = torch.randn(12, 1024, device="cuda", generator=g).to(torch.bfloat16)
    x10 = torch.randn(10, 1024, device="cuda", generator=g).to(torch.bfloat16)
    g1, g2 = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
    with torch.cuda.graph(g1):
        ms.linear(x12, q)
    kept = "_ms_dt_descs" in q.__dict__
    with torch.cuda.graph(g2):
        y = ms.linear(x10, q)
    g2.replay()
    torch.cuda.synchronize()
    want = x10.double() @ ms.dequantize(q).double().T
    err = ((y.double() - want).norm() / want.norm()).item()
    print(f"{fmt}: tables kept after the first capture: {kept}; second graph alone: rel err {err:.3e}")
