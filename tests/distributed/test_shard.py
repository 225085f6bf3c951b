"""shard + gather is the identity on bytes, for every registry format, both dims, world sizes 2 and 4."""
from __future__ import annotations

import pytest
import torch

import microscale as ms
from microscale.distributed import gather, gather_swizzled_scales, shard, shard_swizzled_scales
from microscale.formats import SCALE_LAYOUTS

FORMATS = sorted(ms.registry)


def _bytes(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else t.contiguous().view(torch.uint8)


def _same(a: ms.QTensor, b: ms.QTensor) -> None:
    assert a.fmt == b.fmt and a.shape == b.shape and a.dtype == b.dtype and a.meta == b.meta
    for part in ("data", "scales", "global_scale", "zero_points"):
        x, y = getattr(a, part), getattr(b, part)
        assert (x is None) == (y is None), part
        if x is not None:
            assert x.dtype == y.dtype and x.shape == y.shape, part
            assert torch.equal(_bytes(x.reshape(-1)), _bytes(y.reshape(-1))), part


def _q(name: str, shape, seed: int) -> ms.QTensor:
    g = torch.Generator().manual_seed(seed)
    return ms.quantize(torch.randn(shape, generator=g) * 3, name, pad=True)


@pytest.mark.parametrize("name", FORMATS)
def test_round_trip_every_format(name):
    f = ms.get_format(name)
    br = f.block_rows
    # aligned: N and K split into whole blocks on 2 and 4 ranks
    aligned = _q(name, (4 * br * 2 if br > 1 else 16, 4 * f.block_size), 1)
    # ragged: neither N nor K (stored) splits into 4 whole units, so padding applies
    ragged = _q(name, (br + 3 if br > 1 else 6, 3 * f.block_size - 5), 2)
    for q in (aligned, ragged):
        for dim in ("n", "k"):
            for world in (2, 4):
                pad = q is ragged
                parts = [shard(q, dim, world, r, pad=pad) for r in range(world)]
                for p in parts:  # each shard is a valid QTensor, equal in size, global scale replicated
                    p.validate(values=True)
                    assert p.data.shape == parts[0].data.shape
                    if q.global_scale is not None:
                        assert torch.equal(p.global_scale, q.global_scale)
                _same(gather(parts), q)
                if not pad:  # the shards' bytes are the exact slices: dequantized shards tile the original
                    deq = torch.cat([p.dequantize() for p in parts], -1 if dim == "k" else -2)
                    assert torch.equal(deq, q.dequantize())


@pytest.mark.parametrize("name", ["nvfp4", "mxfp4", "mxfp6_e3m2", "int4_affine_g32", "fp8_e4m3_block128x128"])
def test_split_block_is_an_error(name):
    f = ms.get_format(name)
    br = f.block_rows
    q = _q(name, (3 * br if br > 1 else 6, 3 * f.block_size), 3)
    with pytest.raises(ValueError, match=r"shard\(w\).*4 equal shards.*pad=True"):
        shard(q, "k", 4, 0, name="w")
    if br > 1:
        with pytest.raises(ValueError, match=r"dim -2.*4 equal shards.*rows along N"):
            shard(q, "n", 4, 0, name="w")
    else:
        with pytest.raises(ValueError, match=r"dim -2.*4 equal shards"):
            shard(q, "n", 4, 0, name="w")


def test_padding_decodes_to_zero_and_is_recorded():
    q = _q("nvfp4", (6, 48), 4)
    parts = [shard(q, "k", 4, r, pad=True) for r in range(4)]
    assert parts[-1].meta["shard"]["padded"] == 64 and parts[-1].meta["shard"]["full"] == 48
    assert torch.equal(parts[-1].dequantize(), torch.zeros(6, 16))
    full = torch.cat([p.dequantize() for p in parts], -1)[:, :48]
    assert torch.equal(full, q.dequantize())


def test_expert_dim_and_3d():
    q = _q("mxfp4", (4, 8, 64), 5)  # [experts, N, K]
    parts = [shard(q, 0, 2, r) for r in range(2)]
    assert parts[0].shape == (2, 8, 64)
    _same(gather(parts), q)
    parts = [shard(q, "k", 2, r) for r in range(2)]
    _same(gather(parts), q)


def test_bad_arguments():
    q = _q("nvfp4", (8, 32), 6)
    with pytest.raises(ValueError, match="rank=2 must be < world_size=2"):
        shard(q, "n", 2, 2)
    with pytest.raises(ValueError, match="dim='x'"):
        shard(q, "x", 2, 0)
    with pytest.raises(TypeError, match="expected a QTensor"):
        shard(torch.zeros(2), "n", 2, 0)
    with pytest.raises(ValueError, match="got 1 shards for world_size=2"):
        gather([shard(q, "n", 2, 0)])
    with pytest.raises(ValueError, match="rank order"):
        gather([shard(q, "n", 2, 1), shard(q, "n", 2, 0)])


@pytest.mark.parametrize("layout", ["swizzled_128x4", "swizzled_8x4", "row_major"])
@pytest.mark.parametrize("dim", ["n", "k"])
@pytest.mark.parametrize("world", [2, 4])
def test_swizzled_scales(layout, dim, world):
    lay = SCALE_LAYOUTS[layout]
    tr = max(lay.tile_rows, 1)
    rows, cols = (world * tr * 2, world * 4) if dim == "n" else (tr + 3, world * 4 * 2)
    g = torch.Generator().manual_seed(7)
    m = torch.randint(1, 255, (rows, cols), generator=g, dtype=torch.uint8)
    flat = lay.swizzle(m)
    parts = []
    for r in range(world):
        p, pr, pc = shard_swizzled_scales(flat, rows, cols, layout, dim, world, r)
        local = m.chunk(world, 0 if dim == "n" else 1)[r]
        assert (pr, pc) == tuple(local.shape)
        assert torch.equal(p, lay.swizzle(local))  # the shard is the layout of the rank's rows / columns
        parts.append(p)
    assert torch.equal(gather_swizzled_scales(parts, rows, cols, layout, dim), flat)


@pytest.mark.parametrize("layout", ["swizzled_128x4", "swizzled_8x4"])
def test_swizzled_tile_cut_is_an_error_unless_pad(layout):
    lay = SCALE_LAYOUTS[layout]
    rows, cols = lay.tile_rows + lay.tile_rows // 2, 6  # rows/2 is not whole tiles; cols/2 = 3 < 4
    m = torch.randint(1, 255, (rows, cols), dtype=torch.uint8)
    flat = lay.swizzle(m)
    for dim in ("n", "k"):
        with pytest.raises(ValueError, match=f"splits a {layout} tile.*pad=True"):
            shard_swizzled_scales(flat, rows, cols, layout, dim, 2, 0)
        parts = [shard_swizzled_scales(flat, rows, cols, layout, dim, 2, r, pad=True)[0] for r in range(2)]
        assert torch.equal(gather_swizzled_scales(parts, rows, cols, layout, dim), flat)
