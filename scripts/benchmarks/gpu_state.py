"""The GPU's clock, temperature and power, read with nvidia-smi: a ViT-L step holds an H100 at its
700 W cap, where the driver lowers the SM clock as the chip warms (1,980 -> ~1,680 MHz), so rows
timed later in a cold run are slower for that alone (results/bench/NOTES.md, "Does one CUDA graph of
the whole step help?"). Rows record the state they ended in; `--heat-s` in the step benchmark brings
the GPU to its steady state before the first row."""

from __future__ import annotations

import shutil
import subprocess

FIELDS = ("clocks.sm", "temperature.gpu", "power.draw", "clocks_throttle_reasons.active")
KEYS = ("sm_mhz", "temperature_c", "power_w", "throttle_reasons")


def parse(line: str) -> dict | None:
    """One nvidia-smi CSV line (noheader, nounits) of FIELDS -> {KEYS: value}; None if it does not
    parse."""
    parts = [p.strip() for p in line.split(",")]
    if len(parts) != len(FIELDS):
        return None
    try:
        return dict(zip(KEYS, [float(p) for p in parts[:3]] + [parts[3]]))
    except ValueError:
        return None


def gpu_state(index: int = 0) -> dict | None:
    """The state of GPU `index` now, or None where nvidia-smi is missing or fails (never raises)."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        out = subprocess.run(
            [
                exe,
                f"--id={index}",
                f"--query-gpu={','.join(FIELDS)}",
                "--format=csv,noheader,nounits",
            ],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return (
        parse(out.stdout.strip().splitlines()[0])
        if out.returncode == 0 and out.stdout.strip()
        else None
    )
