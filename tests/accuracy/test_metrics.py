import math

import pytest
import torch

import microscale as ms
from microscale.accuracy import ErrorStats, cosine, error_stats, max_abs_error, relative_error, sqnr_db, tensor_error


def test_hand_computed():
    x = torch.tensor([3.0, 4.0])
    y = torch.tensor([3.0, 3.0])
    # ||x|| = 5, ||x - y|| = 1, ||y|| = sqrt(18), <x, y> = 21
    assert relative_error(x, y) == pytest.approx(0.2, rel=1e-15)
    assert sqnr_db(x, y) == pytest.approx(10 * math.log10(25.0), rel=1e-15)
    assert max_abs_error(x, y) == 1.0
    assert cosine(x, y) == pytest.approx(21 / (5 * math.sqrt(18)), rel=1e-15)
    d = tensor_error(x, y)
    assert d["count"] == 2 and d["sqnr_db"] == pytest.approx(13.979400086720377, rel=1e-12)


def test_exact_zero_and_edge_cases():
    x = torch.tensor([[1.0, -2.0]])
    assert sqnr_db(x, x) == math.inf and relative_error(x, x) == 0.0 and cosine(x, x) == pytest.approx(1.0)
    z = torch.zeros(3)
    assert cosine(z, z) == 1.0 and relative_error(z, z) == 0.0
    assert cosine(z, torch.ones(3)) == 0.0 and relative_error(z, torch.ones(3)) == math.inf


def test_sums_over_tensors_equal_concatenation(gen):
    a, b = torch.randn(5, 7, generator=gen), torch.randn(11, generator=gen)
    ya, yb = a + 0.1 * torch.randn(a.shape, generator=gen), b * 0.9
    total = sum([error_stats(a, ya), error_stats(b, yb)])
    cat = error_stats(torch.cat([a.flatten(), b]), torch.cat([ya.flatten(), yb]))
    for k in ("rel_fro", "sqnr_db", "max_abs", "cosine"):
        assert getattr(total, k) == pytest.approx(getattr(cat, k), rel=1e-12)
    assert total.count == 46 and isinstance(ErrorStats() + total, ErrorStats)


def test_qtensor_is_dequantized(gen):
    x = torch.randn(4, 32, generator=gen)
    q = ms.quantize(x, "mxfp4")
    assert sqnr_db(x, q) == sqnr_db(x, q.dequantize())


def test_errors():
    with pytest.raises(ValueError, match="shape"):
        sqnr_db(torch.zeros(2), torch.zeros(3))
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        sqnr_db([1.0], torch.zeros(1))
