"""Block Hadamard rotation: orthogonality, inverse, the Triton kernel (interpreter) against the
matrix product, HadamardLinear outputs, and lower quantization error on outlier weights."""
import pytest
import torch
from torch import nn

import microscale as ms
from microscale.accuracy import HadamardLinear, block_hadamard, hadamard_matrix, quantize_model
from microscale.accuracy.hadamard import block_hadamard_reference

BLOCKS = [2, 16, 32, 64, 128, 256]

KDEV = "cuda" if torch.cuda.is_available() else "cpu"  # (kernels: the GPU, else the interpreter on CPU)


@pytest.mark.parametrize("n", BLOCKS)
def test_hadamard_matrix_is_orthonormal_and_symmetric(n):
    h = hadamard_matrix(n, torch.float64)
    assert torch.equal(h, h.T)
    torch.testing.assert_close(h.abs(), torch.full((n, n), n ** -0.5, dtype=torch.float64), rtol=1e-15, atol=0)
    torch.testing.assert_close(h @ h, torch.eye(n, dtype=torch.float64), rtol=0, atol=1e-14)


def _rotation(k: int, b: int) -> torch.Tensor:
    """R = diag(H_b, ..., H_b) [k, k], float64."""
    return torch.block_diag(*[hadamard_matrix(b, torch.float64)] * (k // b))


@pytest.mark.parametrize("b", [16, 32, 128])
def test_reference_is_the_matrix_product_and_its_own_inverse(b, gen):
    x = torch.randn(3, 4, 256, generator=gen, dtype=torch.float64)
    y = block_hadamard(x, b)
    torch.testing.assert_close(y, x @ _rotation(256, b), rtol=0, atol=1e-13)
    torch.testing.assert_close(block_hadamard(y, b), x, rtol=0, atol=1e-13)  # R R = I
    torch.testing.assert_close(y.norm(dim=-1), x.norm(dim=-1), rtol=1e-14, atol=0)


@pytest.mark.parametrize("b", BLOCKS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_triton_kernel_equals_the_matrix_product(b, dtype, gen):
    """The fast Walsh-Hadamard kernel (run by the interpreter on CPU) against x R in float64:
    float32 within a few ulps, 16-bit outputs within one ulp of the exact result."""
    from microscale.accuracy._hadamard_kernel import block_hadamard_triton

    x = (torch.randn(3, 5, 512, generator=gen) * 3).to(dtype)
    y = block_hadamard_triton(x.to(KDEV), b).cpu()
    assert y.dtype == dtype and y.shape == x.shape
    ref = x.double() @ _rotation(512, b)
    if dtype == torch.float32:
        torch.testing.assert_close(y.double(), ref, rtol=0, atol=1e-6 * float(x.abs().max()))
    else:
        ulp = 2.0 ** -(7 if dtype == torch.bfloat16 else 10)
        assert bool(((y.double() - ref).abs() <= ulp * ref.abs() + 1e-6).all())


def test_kernel_rows_per_program_and_empty(gen):
    from microscale.accuracy._hadamard_kernel import block_hadamard_triton

    x = torch.randn(7, 64, generator=gen)
    ref = block_hadamard_reference(x, 32)
    for rows in (1, 2, 4):  # programs that end past the last block (masked rows)
        torch.testing.assert_close(block_hadamard_triton(x.to(KDEV), 32, rows_per_program=rows).cpu(), ref, rtol=0,
                                   atol=1e-5)
    with pytest.raises(ValueError, match="rows_per_program=3"):
        block_hadamard_triton(x.to(KDEV), 32, rows_per_program=3)
    assert block_hadamard_triton(torch.empty(0, 64, device=KDEV), 16).shape == (0, 64)


def test_hadamard_linear_equals_the_unrotated_layer(gen):
    lin = nn.Linear(128, 48)
    x = torch.randn(6, 128, generator=gen)
    for b in (16, 32, 128):
        rot = HadamardLinear.rotate(lin, b)
        assert rot.block == b and (rot.in_features, rot.out_features) == (128, 48)
        torch.testing.assert_close(rot(x), lin(x), rtol=0, atol=1e-5)
        torch.testing.assert_close(rot.inner.weight.double(), lin.weight.double() @ _rotation(128, b),
                                   rtol=0, atol=1e-6)


def test_rotated_bert_outputs_equal_the_float_model():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.BertConfig(vocab_size=50, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                                  intermediate_size=128, max_position_embeddings=32)
    torch.manual_seed(0)
    model = transformers.BertModel(cfg).eval()
    ids = torch.randint(0, 50, (2, 8))
    ref = model(input_ids=ids).last_hidden_state
    for name, m in list(model.named_modules()):
        if type(m) is nn.Linear:
            parent, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent), child, HadamardLinear.rotate(m, 32))
    assert sum(isinstance(m, HadamardLinear) for m in model.modules()) == 2 * 6 + 1
    torch.testing.assert_close(model(input_ids=ids).last_hidden_state, ref, rtol=0, atol=1e-4)


@pytest.mark.parametrize("fmt", ["mxfp4", "int4_fp16", "mxfp6_e2m3"])
def test_rotation_lowers_error_on_outlier_weights(fmt, gen):
    """Weights with rare large outliers: a block scale set by an outlier crushes the rest of
    the block; rotating first spreads each outlier over its block."""
    w = torch.randn(64, 256, generator=gen)
    w[torch.rand(w.shape, generator=gen) < 0.01] *= 25
    lin = nn.Linear(256, 64)
    with torch.no_grad():
        lin.weight.copy_(w)
    x = torch.randn(256, 256, generator=gen)
    y = x @ w.T

    def err(m):
        with torch.no_grad():
            return float((m(x) - lin.bias - y).norm() / y.norm())

    plain = quantize_model(lin, fmt, inplace=False)
    rotated = quantize_model(lin, fmt, rotate="hadamard", inplace=False)
    assert isinstance(rotated, HadamardLinear) and isinstance(plain, ms.nn.QuantLinear)
    # measured: rotated/plain 0.43-0.66 over seeds
    assert err(rotated) < 0.8 * err(plain), (err(rotated), err(plain))


def test_errors(gen):
    x = torch.randn(2, 48, generator=gen)
    with pytest.raises(ValueError, match="power of two"):
        block_hadamard(x, 24)
    with pytest.raises(ValueError, match="not a multiple of block=32"):
        block_hadamard(x, 32)
    with pytest.raises(TypeError, match="block must be an int"):
        block_hadamard(x, 16.0)
    with pytest.raises(TypeError, match="floating"):
        block_hadamard(torch.ones(2, 16, dtype=torch.int32), 16)
    with pytest.raises(ValueError, match="HadamardLinear"):
        HadamardLinear.rotate(nn.Linear(48, 4), 32)
