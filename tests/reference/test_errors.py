"""Bad input gets a clear error that names the problem."""
import pytest
import torch

import microscale as ms
from microscale.formats import registry


def test_k_not_multiple_of_block():
    with pytest.raises(ValueError, match=r"K=100 is not a multiple of the nvfp4 block size 16; pass pad=True"):
        ms.quantize(torch.randn(2, 100), "nvfp4")


def test_rows_not_multiple_for_2d_blocks():
    with pytest.raises(ValueError, match="rows=100 is not a multiple"):
        ms.quantize(torch.randn(100, 128), "fp8_e4m3_block128x128")
    q = ms.quantize(torch.randn(100, 128), "fp8_e4m3_block128x128", pad=True)
    assert q.dequantize().shape == (100, 128)


@pytest.mark.parametrize("dtype", [torch.int32, torch.uint8, torch.bool, torch.complex64])
def test_unsupported_dtype(dtype):
    with pytest.raises(TypeError, match="dtype"):
        ms.quantize(torch.zeros(2, 32, dtype=dtype), "mxfp4")


@pytest.mark.parametrize("g", [float("nan"), float("inf"), 0.0, -1.0])
def test_non_finite_global_scale(g):
    with pytest.raises(ValueError, match="global_scale=.* must be finite and > 0"):
        ms.quantize(torch.randn(2, 32), "nvfp4", global_scale=g)


def test_unknown_names_and_bad_options():
    with pytest.raises(KeyError, match="unknown format 'nvfp5'"):
        ms.quantize(torch.randn(2, 32), "nvfp5")
    with pytest.raises(ValueError, match="scale_rule='round' is not valid"):
        ms.quantize(torch.randn(2, 32), "mxfp4", scale_rule="round")
    with pytest.raises(ValueError, match="does not apply to format 'nvfp4'"):
        ms.quantize(torch.randn(2, 32), "nvfp4", scale_rule="floor")
    with pytest.raises(ValueError, match="applies only to two-level formats"):
        ms.quantize(torch.randn(2, 32), "mxfp4", convention="torchao")
    with pytest.raises(ValueError, match="global_scale applies only"):
        ms.quantize(torch.randn(2, 32), "mxfp4", global_scale=1.0)
    with pytest.raises(ValueError, match="overflow='wrap' is not valid"):
        ms.quantize(torch.randn(2, 32), "mxfp4", overflow="wrap")
    with pytest.raises(TypeError, match="must be a torch.Tensor"):
        ms.quantize([1.0, 2.0], "mxfp4")
    with pytest.raises(TypeError, match="expected a QTensor"):
        ms.dequantize(torch.zeros(3))


@pytest.mark.parametrize("name", ["mxfp4", "nvfp4", "int4_affine_g32", "mxfp6_e3m2", "fp8_e4m3_block128x128"])
@pytest.mark.parametrize("shape", [(0, 64), (4, 0), (2, 0, 32), (0, 0)])
def test_empty_tensors(name, shape):
    q = ms.quantize(torch.randn(shape), name, pad=True)
    assert q.shape == shape and q.dequantize().shape == shape and q.dequantize().numel() == 0
    if len(shape) == 1 or registry[name].block_rows == 1:
        assert ms.quantize(torch.randn(shape[-1:]), name, pad=True).dequantize().shape == shape[-1:]


@pytest.mark.parametrize("name", ["mxfp4", "nvfp4", "int4_affine_g32"])
@pytest.mark.parametrize("nonfinite", ["propagate", "zero", "error"])
def test_empty_tensor_policies(name, nonfinite):
    q = ms.quantize(torch.empty(3, 0, dtype=torch.float64), name, nonfinite=nonfinite, overflow="native")
    assert q.dequantize(torch.float64).shape == (3, 0)


@pytest.mark.parametrize("pad", ["no", 1, None])
def test_pad_must_be_a_bool(pad):
    with pytest.raises(TypeError, match="pad must be a bool"):
        ms.quantize(torch.randn(2, 30), "mxfp4", pad=pad)


@pytest.mark.parametrize("g", [True, "0.5", torch.ones(2), torch.ones(1, dtype=torch.int32), [0.5]])
def test_global_scale_must_be_one_float(g):
    with pytest.raises(TypeError, match="global_scale must be a float"):
        ms.quantize(torch.randn(2, 32), "nvfp4", global_scale=g)
    assert ms.quantize(torch.randn(2, 32), "nvfp4", global_scale=torch.tensor([0.5])).global_scale == 0.5
