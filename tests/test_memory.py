"""Memory stays flat over consecutive traced cells with a backward pass (bench/ runs 1,000)."""
import gc
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import memory  # noqa: E402


def test_resident_memory_stays_flat_without_gc():
    gc.disable()
    try:
        start, end, growth = memory.measure(cells=200, warmup=40)
    finally:
        gc.enable()
    assert growth < 15, f"RSS grew {growth:.1f} MB over 200 cells ({start:.1f} -> {end:.1f} MB)"
