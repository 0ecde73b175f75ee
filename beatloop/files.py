"""Files a recipe or a callback writes (public: ``docs/api.md``): lines appended and
files replaced whole, so a run killed at any moment leaves no torn file, with a failed
write as a ``RunDirError`` naming the path and the reason in words (disk full, read-only,
permission denied); and beatloop's cache directory.

The cache holds what can be recomputed but costs seconds to (``beatloop list``'s listing,
the GAN's quality classifier), kept between processes. Everything in it may be deleted at
any time; a file that cannot be read or written there is passed over.
"""

from __future__ import annotations

import os
from pathlib import Path

from beatloop.core.saving.run_dir import append_line, replace_file, writing

__all__ = ["append_line", "cache_dir", "replace_file", "writing"]

#: Where the cache lives when set (else ``$XDG_CACHE_HOME/beatloop``, else ``~/.cache/beatloop``).
CACHE_DIR = "BEATLOOP_CACHE_DIR"


def cache_dir() -> Path:
    """``$BEATLOOP_CACHE_DIR``, else ``$XDG_CACHE_HOME/beatloop``, else
    ``~/.cache/beatloop``."""
    if os.environ.get(CACHE_DIR):
        return Path(os.environ[CACHE_DIR]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser() / "beatloop"
