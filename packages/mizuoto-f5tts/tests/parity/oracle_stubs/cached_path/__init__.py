"""Stand-in for `cached_path` (imported at module level by f5_tts.api and the CLIs).

Local paths pass through; anything remote fails, since parity runs are offline.
"""

from __future__ import annotations

import os


def cached_path(url_or_filename, *args, **kwargs):
    path = os.fspath(url_or_filename)
    if "://" in path:
        raise RuntimeError(f"cached_path stand-in: no downloads in the parity env ({path})")
    return path
