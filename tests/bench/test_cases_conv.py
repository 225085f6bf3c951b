"""The conv2d bench case on the CPU: its geometry, its check (passes on the op's output, fails
on a wrong one) and its F.conv2d peer."""
import torch

from microscale.bench import suites
from microscale.bench.cases import BUILDERS, Context
from microscale.bench.cases_conv import conv_geometry
from microscale.bench.suites import CaseSpec


def _ctx() -> Context:
    g = torch.Generator()
    g.manual_seed(0)
    return Context(torch.device("cpu"), g)


def test_conv_geometry_of_the_suite_shapes():
    vit = conv_geometry((32, 3, 224, 224, 768, 16, 16, 1))
    assert (vit["padding"], vit["ho"], vit["wo"]) == (0, 14, 14)
    dw = conv_geometry((1, 96, 56, 56, 96, 7, 1, 96))
    assert (dw["padding"], dw["ho"], dw["wo"]) == (3, 56, 56)
    assert all(s.op != "conv2d" or len(s.shape) == 8 for s in suites.select_cases("ops", universe=("nvfp4",)))


def test_conv_case_checks_its_output_and_its_peer():
    for shape in ((2, 3, 32, 32, 16, 16, 16, 1), (1, 8, 9, 9, 8, 7, 1, 8)):
        case = BUILDERS["conv2d"](CaseSpec("conv2d", "nvfp4", shape), _ctx())
        inputs = case.make_inputs()
        y = case.fn(*inputs)
        g = conv_geometry(shape)
        assert y.shape == (g["n"], g["c_out"], g["ho"], g["wo"]) and y.dtype == torch.bfloat16
        assert case.check(inputs, y).ok
        assert not case.check(inputs, y.flip(-1)).ok
        assert case.flops == 2 * g["n"] * g["c_out"] * g["ho"] * g["wo"] * (shape[1] // shape[7]) * shape[5] ** 2
        peer = dict(case.peers)["F.conv2d bf16"]()
        pin = peer.make_inputs()
        assert peer.check(pin, peer.fn(*pin)).ok
