"""The suite's clock sampler (microscale.bench._clocks), without a GPU: nvidia-smi's lines,
the summary, and the background reader against a stand-in nvidia-smi."""
import json
import os
import stat
import sys
import time

import pytest
import torch

from microscale.bench import _clocks


def test_parse_sample():
    t, s = _clocks.parse_sample("2026/12/02 15:02:18.006, 1710, 1980, 236.85, 700.00, 0x0000000000000004\n")
    assert s == (1710.0, 1980.0, 236.85, 700.0, 4)
    assert abs(t - time.mktime(time.strptime("2026/12/02 15:02:18", "%Y/%m/%d %H:%M:%S")) - 0.006) < 1e-6
    for line in ("timestamp, clocks.current.sm [MHz], ...", "", "2026/12/02 15:02:18.006, [N/A], 1980, 1, 2, 0x0",
                 "Warning: something", "1, 2, 3, 4, 5"):
        assert _clocks.parse_sample(line) is None, line


def test_summary_names_the_slowdown():
    st = _clocks.summarize([(1980.0, 1980.0, 300.0, 700.0, 0), (1455.0, 1980.0, 700.0, 700.0, 0x4),
                            (1500.0, 1980.0, 690.0, 700.0, 0x4 | 0x1), (1320.0, 1980.0, 712.0, 700.0, 0x4 | 0x20)])
    assert st.samples == 4 and st.slowed == 0.75 and st.reasons == ("power cap", "SW thermal")
    assert st.sm_mhz_min == 1320.0 and st.sm_mhz_median == 1477.5 and st.power_w_max == 712.0
    assert st.summary() == "power cap/SW thermal 75%, SM >= 1.32 GHz"
    calm = _clocks.summarize([(1980.0, 1980.0, 600.0, 700.0, 0x1)])  # 0x1: GPU idle, not a slowdown
    assert calm.slowed == 0 and calm.reasons == () and calm.summary() == "SM 1.98 GHz"
    assert _clocks.summarize([]) is None
    assert _clocks.ClockState.from_dict(json.loads(json.dumps(st.to_dict()))) == st


def test_monitor_is_inert_without_a_gpu_or_nvidia_smi(monkeypatch):
    with _clocks.Monitor("cpu") as m:
        assert not m.active and m.window(0.0, time.time()) is None
    monkeypatch.setattr(_clocks.shutil, "which", lambda name: None)
    with _clocks.Monitor(torch.device("cuda")) as m:
        assert not m.active and m.window(0.0, time.time()) is None


FAKE_SMI = """#!{python}
import os, sys, time
from datetime import datetime
assert "--id=GPU-fake" in sys.argv and any(a.startswith("--query-gpu=timestamp,clocks.sm") for a in sys.argv)
print("Warning: a line that is not a sample", flush=True)
capped_until = time.time() + float(os.environ.get("FAKE_CAPPED_S", "0"))  # capped throughout, then alternating
i = 0
while True:
    stamp = datetime.now().strftime("%Y/%m/%d %H:%M:%S.%f")[:-3]
    slow = time.time() < capped_until or i % 2
    print(f"{{stamp}}, {{1400 if slow else 1980}}, 1980, 650.5, 700.00, {{'0x4' if slow else '0x0'}}", flush=True)
    i += 1
    time.sleep(0.02)
"""


@pytest.fixture
def stand_in_smi(tmp_path, monkeypatch):
    """A stand-in ``nvidia-smi`` first on PATH, for device ``GPU-fake``."""
    exe = tmp_path / "nvidia-smi"
    exe.write_text(FAKE_SMI.format(python=sys.executable))
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ.get('PATH', '')}")
    monkeypatch.setattr(_clocks, "_smi_id", lambda device: "GPU-fake")
    return monkeypatch


def test_monitor_samples_a_stand_in_nvidia_smi(stand_in_smi):
    with _clocks.Monitor(torch.device("cuda"), interval_ms=20) as m:
        assert m.active
        time.sleep(0.3)  # the stand-in's start-up
        t0 = time.time()
        time.sleep(0.3)
        st = m.window(t0, time.time())
        proc = m._proc
    assert proc.poll() is not None and not m.active  # stopped on leaving the block
    assert st is not None and st.samples >= 5, st
    assert 0.25 <= st.slowed <= 0.75 and st.reasons == ("power cap",) and st.sm_mhz_min == 1400.0
    assert m.window(t0, time.time()) is None  # inert again
    with pytest.raises(TypeError):
        _clocks.ClockState.from_dict({"samples": 1})


def test_settle_waits_for_the_clock_to_be_free(stand_in_smi):
    stand_in_smi.setenv("FAKE_CAPPED_S", "0.8")
    with _clocks.Monitor(torch.device("cuda"), interval_ms=20) as m:
        assert m.settle(max_s=0.1) == pytest.approx(0.1, abs=0.05)  # still capped (or starting): gives up
        t0 = time.time()
        waited = m.settle()
        assert 0.2 < waited < 1.99, waited  # the stand-in's start-up plus what is left of its cap
        seen = [s for t, s in m._samples if t0 <= t <= t0 + waited]
        assert seen and not seen[-1][4] & 0x4 and all(s[4] & 0x4 for s in seen[:-1])  # it stopped at the first free one
    assert _clocks.Monitor("cpu").settle() == 0.0


def test_a_failing_nvidia_smi_costs_no_waiting(tmp_path, monkeypatch):
    exe = tmp_path / "nvidia-smi"
    exe.write_text(f"#!{sys.executable}\nimport sys\nprint('No devices were found')\nsys.exit(6)\n")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ.get('PATH', '')}")
    monkeypatch.setattr(_clocks, "_smi_id", lambda device: "GPU-gone")
    with _clocks.Monitor(torch.device("cuda")) as m:
        m._proc.wait(timeout=10)
        assert not m.active
        t0 = time.time()
        assert m.settle() == pytest.approx(0.0, abs=0.05) and m.window(t0 - 1, time.time()) is None
        assert time.time() - t0 < 0.2
