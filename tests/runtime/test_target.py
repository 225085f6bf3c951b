"""``runtime.target``: the facts a GPU path asks for, their override for tests, and the
supported Triton range."""
from __future__ import annotations

import pytest
import torch

from microscale.runtime import target


def test_override_stands_in_facts_and_restores_them():
    cpu = torch.device("cpu")
    real = (target.num_sms(cpu), target.capability(cpu), target.pdl_capable(cpu), target.interpreting(),
            target.triton_version())
    with target.override(num_sms=132, capability=(9, 0), pdl=True):
        assert (target.num_sms(cpu), target.capability(cpu), target.pdl_capable(cpu)) == (132, (9, 0), True)
        with target.override(num_sms=7, interpreting=False):
            assert target.num_sms(cpu) == 7 and not target.interpreting()
        assert target.num_sms(cpu) == 132 and target.interpreting() == real[3]
    assert (target.num_sms(cpu), target.capability(cpu), target.pdl_capable(cpu), target.interpreting(),
            target.triton_version()) == real


def test_override_refuses_unknown_facts():
    with pytest.raises(TypeError, match="sm_count"):
        with target.override(sm_count=1):
            pass


@pytest.mark.parametrize("version,ok", [((3, 6, 0), True), ((3, 6, 9), True), ((3, 5, 1), False),
                                        ((3, 7, 0), False), ((4, 0, 0), False)])
def test_supported_triton_range(version, ok):
    with target.override(triton_version=version):
        assert target.has_triton() and target.triton_supported() == ok
        if ok:
            target.require_triton("the test")
        else:
            with pytest.raises(RuntimeError, match=r"triton>=3\.6,<3\.7.*" + ".".join(map(str, version))):
                target.require_triton("the test")


def test_missing_triton_is_a_clear_import_error():
    with target.override(triton_version=None):
        assert not target.has_triton() and not target.triton_supported()
        with pytest.raises(ImportError, match="not installed"):
            target.require_triton("the decode kernel")
