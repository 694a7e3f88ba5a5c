"""Where a local Ray instance keeps its files (``mizuoto batch --ray``, ``mizuoto serve --ray``)."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path


def local_ray_temp_dir() -> dict[str, str]:
    """``ray.init`` keyword arguments for a local instance's temp dir.

    Ray's workers refuse a temp dir inside the virtualenv ("temp_dir must not be child
    directory of virtualenv root") and die at start, and the job then waits forever. nox sets
    ``TMPDIR`` inside its virtualenv: a local instance then keeps its files in the system's
    /tmp instead (short: Ray puts Unix sockets there)."""
    temp = Path(tempfile.gettempdir()).resolve()
    prefix = Path(sys.prefix).resolve()
    if temp != prefix and prefix not in temp.parents:
        return {}
    return {"_temp_dir": os.path.join("/tmp", f"mizuoto-ray-{os.getuid()}")}
