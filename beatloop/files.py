"""beatloop's cache directory: what can be recomputed but costs seconds to (``beatloop
list``'s listing, the GAN's quality classifier), kept between processes. Everything in it
may be deleted at any time; a file that cannot be read or written there is passed over."""

from __future__ import annotations

import os
from pathlib import Path

#: Where the cache lives when set (else ``$XDG_CACHE_HOME/beatloop``, else ``~/.cache/beatloop``).
CACHE_DIR = "BEATLOOP_CACHE_DIR"


def cache_dir() -> Path:
    """``$BEATLOOP_CACHE_DIR``, else ``$XDG_CACHE_HOME/beatloop``, else
    ``~/.cache/beatloop``."""
    if os.environ.get(CACHE_DIR):
        return Path(os.environ[CACHE_DIR]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser() / "beatloop"
