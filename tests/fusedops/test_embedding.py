"""embedding: the gathered rows equal ``dequantize`` of the table's rows bit for bit (every
registry format, reference and the Triton kernel under the interpreter); range errors."""
import pytest
import torch

import microscale as ms
from microscale.embedding import embedding_triton
from microscale.reference import dequantize as ref_dequantize

FORMATS = sorted(ms.registry.keys())
#: where the kernel runs: CUDA tensors on a GPU machine, CPU tensors under the interpreter elsewhere
KDEV = "cuda" if torch.cuda.is_available() else "cpu"


def _table(name: str, gen: torch.Generator, V: int = 7, D: int = 40) -> ms.QTensor:
    fmt = ms.get_format(name)
    w = torch.randn(V, D, generator=gen) * 3
    return ms.quantize(w, fmt, pad=True)


def _bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.view(torch.int16 if a.element_size() == 2 else torch.int32),
                                                                  b.view(torch.int16 if b.element_size() == 2 else torch.int32))


@pytest.mark.parametrize("name", FORMATS)
def test_reference_gather_is_dequantize_of_rows(name, gen):
    q = _table(name, gen)
    ids = torch.tensor([[3, 0, 6], [3, 1, 5]])
    full = ref_dequantize(q, torch.float32)
    got = ms.embedding(ids, q, dtype=torch.float32)
    assert _bits_equal(got, full[ids])


@pytest.mark.parametrize("name", FORMATS)
def test_kernel_gather_is_dequantize_of_rows(name, gen):
    q = _table(name, gen)
    ids = torch.tensor([6, 2, 2, 0, 5], dtype=torch.int32)
    for dtype in (torch.float32, torch.bfloat16):
        full = ref_dequantize(q, dtype)
        got = embedding_triton(ids.to(KDEV), q.to(KDEV), dtype).cpu()
        assert _bits_equal(got, full[ids.long()]), (name, dtype)


def test_out_of_range_ids_are_errors(gen):
    q = _table("nvfp4", gen)
    with pytest.raises(ValueError, match=r"ids must lie in \[0, 7\).*e\.g\. 7"):
        ms.embedding(torch.tensor([1, 7]), q)
    with pytest.raises(ValueError, match=r"e\.g\. -1"):
        ms.embedding(torch.tensor([-1]), q)
    qk = q.to(KDEV)
    with pytest.raises(ValueError, match=r"ids must lie in \[0, 7\)"):
        embedding_triton(torch.tensor([0, 9], device=KDEV), qk)
    out = embedding_triton(torch.tensor([0, 9], device=KDEV), qk, torch.float32, check=False).cpu()  # a NaN row
    assert torch.isnan(out[1]).all() and torch.equal(out[0], ref_dequantize(q)[0])
    # no launch zeroes the flag before a call: an earlier call's bad id (unchecked or raised) must not
    # fail a later good call, and a later bad call must still be caught
    got = embedding_triton(torch.tensor([2], device=KDEV), qk, torch.float32).cpu()
    assert torch.equal(got, ref_dequantize(q)[[2]])
    with pytest.raises(ValueError, match=r"e\.g\. -3"):
        embedding_triton(torch.tensor([-3, 1], device=KDEV), qk)
    got = embedding_triton(torch.tensor([4], device=KDEV), qk, torch.float32).cpu()
    assert torch.equal(got, ref_dequantize(q)[[4]])


def test_argument_errors(gen):
    q = _table("mxfp4", gen)
    with pytest.raises(TypeError, match="ids must be an int32 or int64"):
        ms.embedding(torch.tensor([0.0]), q)
    with pytest.raises(ValueError, match="padding_idx=7"):
        ms.embedding(torch.tensor([0]), q, padding_idx=7)
    with pytest.raises(TypeError, match="table must be a QTensor"):
        ms.embedding(torch.tensor([0]), torch.zeros(3, 4))
    # padding_idx changes gradients only: the forward row is the table's
    assert torch.equal(ms.embedding(torch.tensor([2]), q, padding_idx=2), ref_dequantize(q, q.dtype)[[2]])


def test_2d_blocks_and_empty(gen):
    fmt = ms.get_format("fp8_e4m3_block128x128")
    q = ms.quantize(torch.randn(130, 128, generator=gen), fmt, pad=True)
    ids = torch.tensor([129, 0, 127, 128])
    full = ref_dequantize(q)
    assert _bits_equal(ms.embedding(ids, q, dtype=torch.float32), full[ids])
    assert _bits_equal(embedding_triton(ids.to(KDEV), q.to(KDEV), torch.float32).cpu(), full[ids])
    assert ms.embedding(torch.zeros(0, dtype=torch.long), q).shape == (0, 128)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (call plans are eager CUDA calls)")
def test_gpu_eager_replays_equal_unplanned_calls(gen):
    """From the third eager call with the same ids shape the gather replays a call plan kept with the table:
    each call's ids reach it, the rows equal the reference's, a checked replay still raises on a bad id and
    the next checked call does not."""
    from microscale.embedding.op import _plan_key
    from microscale.linear.plans import Plan
    from microscale.linear.weight_state import state

    q = _table("nvfp4", gen, V=50, D=64).to("cuda")
    full = ref_dequantize(q.to("cpu"), torch.bfloat16)
    for _ in range(5):
        ids = torch.randint(0, 50, (3, 4), generator=gen)
        got = ms.embedding(ids.cuda(), q, dtype=torch.bfloat16).cpu()
        assert _bits_equal(got, full[ids])
    flat = torch.zeros(12, dtype=torch.int64, device="cuda")
    assert type(state(q).plans.get(_plan_key(flat, torch.bfloat16, True))) is Plan
    bad = torch.randint(0, 50, (3, 4), generator=gen)
    bad[1, 2] = 50
    with pytest.raises(ValueError, match=r"e\.g\. 50"):
        ms.embedding(bad.cuda(), q, dtype=torch.bfloat16)
    ids = torch.randint(0, 50, (3, 4), generator=gen)
    assert _bits_equal(ms.embedding(ids.cuda(), q, dtype=torch.bfloat16).cpu(), full[ids])


@pytest.mark.parametrize("name", ["nvfp4", "mxfp8_e4m3", "int4_affine_g128"])
def test_kernel_reads_bytes_where_rows_are_not_word_aligned(name, gen):
    """Codes at an address that is not a multiple of 4 take the byte-wise read (aligned ones are read
    as int32 words): both equal the reference bit for bit."""
    q = _table(name, gen, V=9, D=64)
    qk = q.to(KDEV)
    raw = torch.zeros(q.data.numel() + 1, dtype=torch.uint8, device=KDEV)
    raw[1:] = qk.data.reshape(-1)
    odd = ms.QTensor(raw[1:].view(q.data.shape), qk.scales, q.fmt, q.shape, q.dtype, qk.global_scale,
                     qk.zero_points, dict(q.meta))
    assert odd.data.data_ptr() % 4 != 0
    ids = torch.tensor([8, 0, 3, 3, 5])
    full = ref_dequantize(q, torch.float32)
    for t in (qk, odd):
        got = embedding_triton(ids.to(KDEV), t, torch.float32).cpu()
        assert _bits_equal(got, full[ids]), name
