"""The one guard on every file this package writes, clears or reads as its own.

Before a command does any work it checks where it will write: `check_out_file` for a file
(plans, hardware profiles, the degree search's block and table, pictures), `check_out_folder`
for a folder it empties and fills (`ab --out`). A path is refused, with one line that names it
and says what to give instead, when
- its name cannot be written: too long for the file system, a NUL byte, a file where a folder
  must be, a folder that cannot be written to;
- it is not a regular file: a folder, a device, a named pipe, a socket -- even with --force;
- it holds something this package did not write, as the caller's recogniser judges by the
  whole content (a plan that loads and checks, a profile that loads, a folder of an earlier
  A/B and nothing else), unless the user forces it.

`write_atomic(path, data)` writes into a temporary file beside `path` (a short name, whatever
the length of `path`'s), syncs it, gives it the mode a plain `open()` would (the replaced file's,
else 0666 less the umask) and renames it over `path`: a kill or a full disk mid-write leaves the
old file as it was, and no temporary file behind. A symbolic link is written through, to the
file it points to. Errors are the OSError of the step that failed; callers say what was being
written.

`read_capped(path, ...)` is the one way a plan or a profile is read: a folder, a device or a
named pipe is refused without being opened (a pipe would block the reader), and nothing larger
than `MAX_READ_BYTES` is read.
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from pathlib import Path

# the most any plan or profile file may hold: a plan of an 8B model is a few MB
MAX_READ_BYTES = 256 << 20
_NAME_MAX, _PATH_MAX = 255, 4096  # where the file system does not say
_TMP_STEM_BYTES = 32  # the part of the target's name kept in its temporary file's name


class FileRefused(ValueError):
    """A path a command will not write, clear or read, with what to give instead."""


def kind_of(mode: int) -> str:
    """What a file of this st_mode is, in words ("a file", "a named pipe (FIFO)")."""
    for test, words in ((stat.S_ISREG, "a file"), (stat.S_ISDIR, "a folder"),
                        (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                        (stat.S_ISFIFO, "a named pipe (FIFO)"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return words
    return "not a regular file"


def _stat(p: Path, label: str) -> os.stat_result | None:
    """os.stat of `p` (through symbolic links), None where nothing is there."""
    try:
        return os.stat(p)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise FileRefused(f"{label} cannot be checked: {e.strerror}") from None


def _limit(folder: Path, name: str, default: int) -> int:
    try:
        return os.pathconf(folder, name)
    except (OSError, ValueError):
        return default


def check_path(path, label: str) -> Path:
    """Refuse a path nothing can be written to: a NUL byte, a name or path too long for the
    file system, a file where a folder must be, a folder that cannot be written to. The
    folders that do not exist yet are created at write time."""
    p = Path(path)
    raw = os.fsencode(p)
    if b"\0" in raw:
        raise FileRefused(f"{label}: the path holds a NUL byte, which no file name can hold: "
                          "give another name")
    full = Path(os.path.abspath(p))
    existing = Path(full.anchor)  # the root; then the deepest folder of the path that exists
    for a in reversed(full.parents):
        st = _stat(a, label)
        if st is None:
            break
        if not stat.S_ISDIR(st.st_mode):
            raise FileRefused(f"{label}: {a} is {kind_of(st.st_mode)}, so nothing can be written "
                              "under it; give a path in a folder")
        existing = a
    path_max = _limit(existing, "PC_PATH_MAX", _PATH_MAX)
    if len(os.fsencode(full)) >= path_max:
        raise FileRefused(f"{label}: the path is {len(os.fsencode(full))} bytes, longer than the "
                          f"{path_max - 1} this file system allows: give a shorter path")
    name_max = _limit(existing, "PC_NAME_MAX", _NAME_MAX)
    for part in full.relative_to(existing).parts:
        if len(os.fsencode(part)) > name_max:
            raise FileRefused(f"{label}: the name {part[:40]}... is {len(os.fsencode(part))} "
                              f"bytes, longer than the {name_max} this file system allows: "
                              "give a shorter name")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise FileRefused(f"{label}: cannot write in {existing} (permission denied): give a "
                          "path in a folder you can write to")
    return p


def check_out_file(path, *, label: str, what: str, ours, force: bool = False,
                   force_how: str = "add --force", example: str = "plan.json") -> Path:
    """The guard before a command that will write a file at `path` does any work. `label` is
    how the user named it ("--out plan.json"), `what` what the command writes ("a plan"),
    `ours(path) -> bool` recognises a file the command wrote (by its whole content); `force`
    lets it replace any other regular file, never a folder, device or pipe."""
    p = check_path(path, label)
    st = _stat(p, label)
    if st is not None and stat.S_ISDIR(st.st_mode) or p.name in ("", ".", ".."):
        raise FileRefused(f"{label} is a folder: give a file name, such as {p / example}")
    if st is None:
        return p
    if not stat.S_ISREG(st.st_mode):
        raise FileRefused(f"{label} is {kind_of(st.st_mode)}, not a file: give the name of a "
                          f"file for {what}, such as {example} (a device, pipe or folder is "
                          "never replaced, even when forced)")
    if not force and not ours(p):
        raise FileRefused(f"{label} exists and is not {what}: refusing to overwrite it. Choose "
                          f"another name, or {force_how} to replace it")
    return p


def check_out_folder(path, *, label: str, what: str, foreign, force: bool = False,
                     force_how: str = "add --force") -> Path:
    """The guard before a command empties the folder at `path` and fills it. `foreign(path)`
    lists (as relative paths) what in it the command did not write, judged by the folder's
    whole layout; `force` clears a folder that holds such things too."""
    p = check_path(path, label)
    st = _stat(p, label)
    if st is None:
        return p
    if not stat.S_ISDIR(st.st_mode):
        raise FileRefused(f"{label} is {kind_of(st.st_mode)}, not a folder: give a folder for "
                          f"the results of {what}")
    if not os.access(p, os.W_OK | os.X_OK):
        raise FileRefused(f"{label}: cannot write in {p} (permission denied): give a folder you "
                          "can write to")
    others = [] if force else foreign(p)
    if others:
        shown = ", ".join(others[:3]) + (f" and {len(others) - 3} more" if len(others) > 3 else "")
        raise FileRefused(f"{label} holds {shown}, which {what} did not write: refusing to clear "
                          f"it. Give another folder, empty it, or {force_how} to clear it anyway")
    return p


def clear_folder(path) -> bool:
    """Remove everything in the folder at `path` (checked by `check_out_folder`); True if
    there was anything. Symbolic links are removed, never followed."""
    p = Path(path)
    if not p.is_dir():
        return False
    entries = list(p.iterdir())
    for e in entries:
        if e.is_dir() and not e.is_symlink():
            shutil.rmtree(e)
        else:
            e.unlink()
    return bool(entries)


def _umask() -> int:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    old = os.umask(0o022)
    os.umask(old)
    return old


def write_atomic(path: str | os.PathLike, data: bytes | str) -> Path:
    p = Path(path)
    target = Path(os.path.realpath(p))
    if isinstance(data, str):
        data = data.encode()
    st = _stat(target, str(p))
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise FileRefused(f"{p} is {kind_of(st.st_mode)}, not a file: nothing was written there")
    target.parent.mkdir(parents=True, exist_ok=True)
    stem = os.fsdecode(os.fsencode(target.name)[:_TMP_STEM_BYTES])
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{stem}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), stat.S_IMODE(st.st_mode) if st else 0o666 & ~_umask())
            if st is not None and os.geteuid() == 0:
                try:
                    os.fchown(f.fileno(), st.st_uid, st.st_gid)
                except OSError:
                    pass
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    finally:
        if os.path.lexists(tmp):
            os.unlink(tmp)
    return p


def read_capped(path, *, name: str, what: str, fix: str, error=FileRefused,
                limit: int = MAX_READ_BYTES) -> bytes:
    """The bytes of the regular file at `path`, at most `limit` of them. `name` is how messages
    call the file ("plan.json", "hardware profile p.json"), `what` what it should hold ("a
    plan"), `fix` what to give instead; failures are `error`, one line each. A folder, device,
    pipe or socket is refused without being opened."""
    p = Path(path)
    try:
        st = os.stat(p)
    except FileNotFoundError:
        raise error(f"{name}: no such file: {fix}") from None
    except (OSError, ValueError) as e:
        raise error(f"{name} cannot be read ({getattr(e, 'strerror', None) or e}): {fix}") \
            from None
    if stat.S_ISDIR(st.st_mode):
        raise error(f"{name} is a folder, not {what}: {fix}")
    if not stat.S_ISREG(st.st_mode):
        raise error(f"{name} is {kind_of(st.st_mode)}, not {what}: {fix}")
    too_big = f"{name} holds more than {limit >> 20} MiB, more than {what} could hold: {fix}"
    if st.st_size > limit:
        raise error(too_big)
    try:  # O_NONBLOCK: should a pipe have taken the file's place since, opening it cannot hang
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise error(f"{name} cannot be read ({e.strerror}): {fix}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise error(f"{name} is not a regular file, not {what}: {fix}")
        os.set_blocking(fd, True)
        chunks, got = [], 0
        while got <= limit:
            chunk = os.read(fd, min(1 << 20, limit + 1 - got))
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
    except OSError as e:
        raise error(f"{name} cannot be read ({e.strerror}): {fix}") from None
    finally:
        os.close(fd)
    if got > limit:
        raise error(too_big)
    return b"".join(chunks)
