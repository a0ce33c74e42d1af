"""Writing a file whole or not at all, for every file this package writes (plans, hardware
profiles, the degree search's block and table).

`write_atomic(path, data)` writes into a temporary file beside `path`, syncs it, and renames it
over `path`: a kill or a full disk mid-write leaves the old file as it was, and no temporary file
behind. Errors are the OSError of the step that failed; callers say what was being written.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_atomic(path: str | os.PathLike, data: bytes | str) -> Path:
    p = Path(path)
    if isinstance(data, str):
        data = data.encode()
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=f".{p.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, p)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return p
