"""Durable atomic file writes: a reader sees the old file or the whole new one, never a part, and
after a crash or power loss the new file is either there complete or not there at all.

Every write goes to a hidden temporary file in the destination's own folder (``os.replace`` is
atomic only within one file system), named ``.NAME.tmp-PID-RANDOM`` so that two writers of the same
file never share a temporary and a dead writer's leftover can be told apart (by its pid); the
temporary is flushed and fsynced, replaced onto the final name, and then the folder is fsynced so
that the rename itself is durable. On any error the temporary is removed and the destination is
left as it was.
"""
import contextlib
import json
import os
import secrets


def temp_name(path):
    """The hidden temporary a write of ``path`` uses: ``DIR/.NAME.tmp-PID-RANDOM``."""
    d, name = os.path.split(os.fspath(path))
    return os.path.join(d, f".{name}.tmp-{os.getpid()}-{secrets.token_hex(4)}")


def fsync_dir(path):
    """Make a rename in folder ``path`` durable (a no-op where folders cannot be opened)."""
    try:
        fd = os.open(path or ".", os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_open(path, mode="w"):
    """``with atomic_open(path, "w") as f: f.write(...)``: ``path`` gets the whole content durably
    when the block ends without an exception, and is left untouched otherwise. ``mode`` is
    ``"w"`` (text) or ``"wb"``; the temporary is always created exclusively."""
    if mode not in ("w", "wb"):
        raise ValueError(f"atomic_open mode must be 'w' or 'wb', got {mode!r}")
    path = os.fspath(path)
    tmp = temp_name(path)
    try:
        with open(tmp, mode.replace("w", "x"), **({} if "b" in mode else {"encoding": "utf-8"})) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise
    fsync_dir(os.path.dirname(path))


def write_text(path, text):
    with atomic_open(path, "w") as f:
        f.write(text)
    return path


def write_json(path, obj, indent=1):
    """``obj`` as JSON (one trailing newline) in ``path``; refuses non-serializable values before
    anything is written."""
    text = json.dumps(obj, indent=indent) + "\n"
    return write_text(path, text)
