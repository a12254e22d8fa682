"""Progress bars for work that takes more than a second (interpolation batches, exact patching runs)."""
from __future__ import annotations

import contextlib

DELAY_S = 1.0


@contextlib.contextmanager
def progress(total: int, description: str):
    """A `tqdm.auto` bar that appears only once the work has run for more than a second."""
    from tqdm.auto import tqdm
    bar = tqdm(total=total, desc=description, delay=DELAY_S, leave=False)
    try:
        yield bar
    finally:
        bar.close()
