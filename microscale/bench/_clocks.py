"""The GPU's SM clock and power state while cases are timed, sampled by ``nvidia-smi``.

Why: a board at its power limit lowers its SM clock within a fraction of a second of
sustained load, and kernels differ in how much power they draw at the same memory
bandwidth (on the H200 the fp4 decode kernels reach the power cap while cuBLAS bf16 at one
token stays below it), so a ratio measured over 300 ms is not the same as one measured in a
burst. The suite records, per timing, what the clock did, so its tables say when a number
was taken power-capped.

:class:`Monitor` runs one ``nvidia-smi --loop-ms`` process for a whole suite (queries only;
nothing is set) and keeps the samples with their timestamps; :meth:`Monitor.window`
summarizes those inside a time window as a :class:`ClockState`. Where there is no CUDA
device or no ``nvidia-smi``, the monitor is inert and windows are None.

The board averages its power over about a second, so the cap outlasts the load that
reached it by up to ~0.5 s: a timing right after a capped one (a peer after the op) would
start under it. The suite therefore waits before each timing until a fresh sample shows no
slowdown (:meth:`Monitor.settle`, at most 2 s). ``power.draw`` is that average too, so
short timings read low.
"""
from __future__ import annotations

import shutil
import statistics
import subprocess
import threading
import time
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Optional

import torch

__all__ = ["ClockState", "Monitor", "parse_sample", "summarize", "SLOWDOWN_REASONS"]

#: ``clocks_throttle_reasons.active`` bits that lower the clock under load (idle and
#: application-clock bits are left out): NVML's ``nvmlClocksThrottleReason*`` values
SLOWDOWN_REASONS = {0x4: "power cap", 0x8: "HW slowdown", 0x20: "SW thermal", 0x40: "HW thermal",
                    0x80: "power brake"}
_SLOWDOWN_MASK = sum(SLOWDOWN_REASONS)
_FIELDS = "timestamp,clocks.sm,clocks.max.sm,power.draw,power.limit,clocks_throttle_reasons.active"
#: default sampling interval of :class:`Monitor` (ms) and longest wait of :meth:`Monitor.settle` (s)
SAMPLE_MS = 50
SETTLE_MAX_S = 2.0


def parse_sample(line: str) -> Optional[tuple[float, tuple[float, float, float, float, int]]]:
    """``(time, (sm MHz, max sm MHz, power W, power limit W, reason bits))`` from one line of
    ``nvidia-smi --query-gpu=<_FIELDS> --format=csv,noheader,nounits``, the time in seconds
    since the epoch as :func:`time.time` counts them (nvidia-smi prints local time); None
    for a line that is not such a sample (a warning, a header, ``[N/A]`` fields)."""
    parts = [p.strip() for p in line.split(",")]
    if len(parts) != 6:
        return None
    try:
        t = datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
        return t, (float(parts[1]), float(parts[2]), float(parts[3]), float(parts[4]), int(parts[5], 16))
    except ValueError:
        return None


@dataclass(frozen=True)
class ClockState:
    """What the GPU did during one timing: ``samples`` taken, SM clock (MHz) lowest and
    median against the board's top (``sm_mhz_top``), highest power draw and the limit
    (W), the share of samples with a slowdown reason active (``slowed``, 0..1) and those
    reasons by name."""

    samples: int
    sm_mhz_min: float
    sm_mhz_median: float
    sm_mhz_top: float
    power_w_max: float
    power_limit_w: float
    slowed: float
    reasons: tuple[str, ...]

    def to_dict(self) -> dict:
        """JSON-able form."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "ClockState":
        """Back from :meth:`to_dict` (also after a JSON round trip)."""
        return cls(**{**d, "reasons": tuple(d.get("reasons") or ())})

    def summary(self) -> str:
        """A few words for tables: ``'power cap 80%, SM >= 1.45 GHz'``, or ``'SM 1.98 GHz'``."""
        if self.slowed <= 0:
            return f"SM {self.sm_mhz_median / 1e3:.2f} GHz"
        why = "/".join(self.reasons) or "slowed"
        return f"{why} {100 * self.slowed:.0f}%, SM >= {self.sm_mhz_min / 1e3:.2f} GHz"


def summarize(samples: list[tuple[float, float, float, float, int]]) -> Optional[ClockState]:
    """The :class:`ClockState` of samples (:func:`parse_sample`'s second items; None for none)."""
    if not samples:
        return None
    slow = [s for s in samples if s[4] & _SLOWDOWN_MASK]
    bits = 0
    for s in slow:
        bits |= s[4]
    return ClockState(samples=len(samples), sm_mhz_min=min(s[0] for s in samples),
                      sm_mhz_median=statistics.median(s[0] for s in samples),
                      sm_mhz_top=max(s[1] for s in samples), power_w_max=max(s[2] for s in samples),
                      power_limit_w=max(s[3] for s in samples), slowed=len(slow) / len(samples),
                      reasons=tuple(n for b, n in SLOWDOWN_REASONS.items() if bits & b))


def _smi_id(device: torch.device) -> Optional[str]:
    """``device`` as ``nvidia-smi -i`` takes it (its UUID), or None."""
    try:
        uuid = str(torch.cuda.get_device_properties(device).uuid)
    except Exception:  # noqa: BLE001 - older torch or no driver: no monitor
        return None
    return uuid if uuid.startswith("GPU-") else f"GPU-{uuid}"


class Monitor:
    """Samples ``device``'s clocks every ``interval_ms`` from ``nvidia-smi`` in the
    background while in a ``with`` block (inert without CUDA or ``nvidia-smi``). Samples
    carry nvidia-smi's own timestamps, so output buffering does not shift them."""

    def __init__(self, device: torch.device | str, interval_ms: int = SAMPLE_MS):
        self.device = torch.device(device)
        self.interval_ms = interval_ms
        self._samples: list[tuple[float, tuple]] = []  # (time.time() of the sample, parsed sample)
        self._proc: Optional[subprocess.Popen] = None
        self._thread: Optional[threading.Thread] = None
        self._lock = threading.Lock()

    @property
    def active(self) -> bool:
        """Whether samples are being taken (nvidia-smi started and still running)."""
        return self._proc is not None and self._proc.poll() is None

    def __enter__(self) -> "Monitor":
        exe = shutil.which("nvidia-smi")
        ident = _smi_id(self.device) if self.device.type == "cuda" and exe else None
        if ident is None:
            return self
        cmd = [exe, f"--query-gpu={_FIELDS}", "--format=csv,noheader,nounits", f"--loop-ms={self.interval_ms}",
               f"--id={ident}"]
        line_buffered = shutil.which("stdbuf")  # so that samples arrive as they are taken
        try:
            self._proc = subprocess.Popen(([line_buffered, "-oL"] if line_buffered else []) + cmd,
                                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        except OSError:
            self._proc = None
            return self
        self._thread = threading.Thread(target=self._read, name="microscale-clocks", daemon=True)
        self._thread.start()
        return self

    def _read(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        for line in self._proc.stdout:
            s = parse_sample(line)
            if s is not None:
                with self._lock:
                    self._samples.append(s)

    def __exit__(self, *exc) -> None:
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
            if self._thread is not None:
                self._thread.join(timeout=5)
            self._proc = self._thread = None

    def settle(self, max_s: float = SETTLE_MAX_S) -> float:
        """Wait until a sample taken from now on shows no slowdown reason (so a timing does
        not start under a cap that an earlier one brought on), at most ``max_s`` seconds;
        returns the seconds waited (0 when inert; nothing more once nvidia-smi has exited)."""
        if not self.active:
            return 0.0
        t0 = time.time()
        while time.time() - t0 < max_s and self.active:
            with self._lock:
                last = self._samples[-1] if self._samples else None
            if last is not None and last[0] >= t0 and not last[1][4] & _SLOWDOWN_MASK:
                break
            time.sleep(0.01)
        return time.time() - t0

    def window(self, t0: float, t1: float, wait_s: float = 0.5) -> Optional[ClockState]:
        """The state over the samples taken between :func:`time.time` readings ``t0`` and
        ``t1``, waiting up to ``wait_s`` for one taken after ``t1`` to arrive (None when
        inert or no sample fell inside)."""
        if self._proc is None:
            return None
        deadline = time.time() + wait_s
        while time.time() < deadline and self.active:
            with self._lock:
                if self._samples and self._samples[-1][0] >= t1:
                    break
            time.sleep(0.01)
        with self._lock:
            got = [s for t, s in self._samples if t0 <= t <= t1]
        return summarize(got)
