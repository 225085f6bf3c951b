"""Packing and scale layouts: defining formulas and round trips."""
import pytest
import torch

from microscale.formats import SCALE_LAYOUTS, pack_codes, unpack_codes


@pytest.mark.parametrize("bits", range(1, 9))
def test_pack_roundtrip_and_bit_order(bits, gen):
    k = 32
    codes = torch.randint(0, 1 << bits, (3, 5, k), generator=gen, dtype=torch.int64).to(torch.uint8)
    packed = pack_codes(codes, bits)
    assert packed.shape == (3, 5, k * bits // 8) and packed.dtype == torch.uint8
    assert torch.equal(unpack_codes(packed, bits, k), codes)
    # the defining rule: element i occupies stream bits [i*bits, (i+1)*bits), LSB first
    row = packed[1, 2].tolist()
    stream = sum(b << (8 * j) for j, b in enumerate(row))
    assert [(stream >> (i * bits)) & ((1 << bits) - 1) for i in range(k)] == codes[1, 2].tolist()


def test_fp4_low_nibble_is_even_element():
    codes = torch.tensor([[0x1, 0x2, 0x3, 0xF]], dtype=torch.uint8)
    assert pack_codes(codes, 4).tolist() == [[0x21, 0xF3]]


def test_pack_rejects_partial_bytes():
    with pytest.raises(ValueError, match="whole number of bytes"):
        pack_codes(torch.zeros(1, 3, dtype=torch.uint8), 6)


@pytest.mark.parametrize("name", list(SCALE_LAYOUTS))
@pytest.mark.parametrize("rows,cols", [(1, 1), (7, 3), (128, 4), (130, 9), (300, 17)])
def test_scale_layout_formula_and_roundtrip(name, rows, cols, gen):
    lay = SCALE_LAYOUTS[name]
    s = torch.randint(1, 255, (rows, cols), generator=gen, dtype=torch.int64).to(torch.uint8)
    flat = lay.swizzle(s)
    rp, cp = lay.padded_shape(rows, cols)
    assert flat.numel() == rp * cp
    for r in range(rows):
        for c in range(cols):
            assert flat[lay.offset(r, c, cols)] == s[r, c]
    # padding is zeros: exactly rp*cp - rows*cols zero entries (inputs are nonzero)
    assert int((flat == 0).sum()) == rp * cp - rows * cols
    assert torch.equal(lay.unswizzle(flat, rows, cols), s)


def test_128x4_offsets_match_cublas_formula():
    lay = SCALE_LAYOUTS["swizzled_128x4"]
    # FORMATS.md: ((r//128)*ceil(C/4) + c//4)*512 + (r%32)*16 + ((r%128)//32)*4 + c%4
    assert lay.offset(0, 0, 8) == 0
    assert lay.offset(1, 0, 8) == 16
    assert lay.offset(32, 0, 8) == 4
    assert lay.offset(0, 4, 8) == 512
    assert lay.offset(128, 0, 8) == 1024
    assert SCALE_LAYOUTS["swizzled_8x4"].offset(9, 5, 8) == 1 * 2 * 32 + 1 * 32 + 1 * 4 + 1
