"""Atomic, verified, rotated checkpoints: one self-describing file per step.

File ``out_dir/ckpt-{step:09d}.nbrgc``, little-endian throughout::

    offset 0   magic         8 bytes  b"NBRGCKPT"
    offset 8   version       uint32   FORMAT_VERSION
    offset 12  header_len    uint64   length of the JSON header
    offset 20  header        JSON     {"step", "meta", "arrays": [{name, dtype, shape, offset, nbytes}],
                                       "payload_len", "payload_sha256"}
               header_sha256 32 bytes sha256 of bytes [0, 20 + header_len)
               zero padding  up to the next multiple of ALIGN
    payload    the raw C-order array bytes, each array starting at a multiple of ALIGN (offsets are
               relative to the payload start); padding is zero and covered by payload_sha256

Every byte of the file is verified on load (header checksum, zero padding, payload checksum, exact
length), so truncation and bit flips anywhere are detected.

Writes go to a hidden temporary file in the same directory (``.ckpt-{step:09d}.nbrgc.tmp-{pid}-{rand}``),
which is flushed, fsynced, ``os.replace``d onto the final name, after which the directory is fsynced. A
crash at any moment leaves either the previous set of checkpoints or the new file complete under its
final name, never a partial file. Temporary files are never listed as checkpoints, and leftovers from a
dead writer are removed by the next :func:`save`. There is no "latest" pointer file: :func:`latest`
scans the directory and verifies what it returns.

Rotation runs only after the new file is durable. It keeps the file just written and the newest
``keep - 1`` checkpoints with a smaller step; checkpoints with a *larger* step than the one written
(possible after resuming from an older checkpoint) are never deleted by rotation.
"""
import hashlib
import json
import math
import os
import re
import struct

import numpy as np

from .atomic import atomic_open
from .errors import CheckpointError

FORMAT_VERSION = 1
MAGIC = b"NBRGCKPT"
ALIGN = 64
SUFFIX = ".nbrgc"

_PREFIX = struct.Struct("<8sIQ")  # magic, version, header_len
_HASH_LEN = 32
_MAX_HEADER = 256 << 20
_CKPT_RE = re.compile(r"^ckpt-(\d+)\.nbrgc$")
_TMP_RE = re.compile(r"^\.ckpt-\d+\.nbrgc\.tmp-(\d+)-[0-9a-f]+$")
_DTYPE_KINDS = "biufc"  # bool, int, uint, float, complex
_SHOW = 60  # characters of a value shown in an error message


class CheckpointMismatchError(CheckpointError):
    """An intact checkpoint whose meta does not match what the caller expected (another run's)."""


def checkpoint_path(out_dir, step):
    """The final path of the checkpoint for ``step`` in ``out_dir``."""
    return os.path.join(os.fspath(out_dir), f"ckpt-{int(step):09d}{SUFFIX}")


def _align(n):
    return -(-n // ALIGN) * ALIGN


def _raw(a):
    """The bytes of a C-contiguous array as a flat uint8 view (works for 0-d and empty arrays)."""
    return a.reshape(-1).view(np.uint8)


def _json_default(obj):
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    raise TypeError(f"object of type {type(obj).__name__} is not JSON serializable")


def _to_json(obj):
    """What ``obj`` becomes after a JSON round trip (tuples -> lists, numpy scalars -> Python)."""
    return json.loads(json.dumps(obj, default=_json_default))


def _short(value):
    text = json.dumps(value, default=_json_default, sort_keys=True) if not isinstance(value, str) \
        else repr(value)
    return text if len(text) <= _SHOW else text[:_SHOW - 3] + "..."


def _first_difference(key, got, want):
    """(dotted key, got, want) of the first differing leaf between two JSON values."""
    if isinstance(got, dict) and isinstance(want, dict):
        for k in sorted(set(got) | set(want), key=str):
            if k not in got:
                return f"{key}.{k}", "<missing>", want[k]
            if k not in want:
                return f"{key}.{k}", got[k], "<absent>"
            if got[k] != want[k]:
                return _first_difference(f"{key}.{k}", got[k], want[k])
    if isinstance(got, list) and isinstance(want, list) and len(got) == len(want):
        for i, (g, w) in enumerate(zip(got, want)):
            if g != w:
                return _first_difference(f"{key}[{i}]", g, w)
    return key, got, want


def _pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True
    return True


def _clean_temp_files(out_dir):
    """Remove temporary files left by crashed writes (this process's, or a process that is gone)."""
    me = os.getpid()
    try:
        names = os.listdir(out_dir)
    except OSError:
        return
    for name in names:
        m = _TMP_RE.match(name)
        if m is None:
            continue
        pid = int(m.group(1))
        if pid == me or not _pid_alive(pid):
            try:
                os.remove(os.path.join(out_dir, name))
            except OSError:
                pass


def _check_arrays(arrays, path, require_finite):
    out = []
    for name, arr in arrays.items():
        if not isinstance(name, str):
            raise CheckpointError(f"{path}: array name {name!r} is not a string")
        a = np.asarray(arr)
        if a.dtype.kind not in _DTYPE_KINDS or a.dtype.hasobject:
            raise CheckpointError(f"{path}: array {name!r} has unsupported dtype {a.dtype} "
                                  "(bool, integer, float and complex only)")
        if require_finite and a.dtype.kind in "fc" and a.size and not np.isfinite(a).all():
            bad = int(a.size - np.count_nonzero(np.isfinite(a)))
            raise CheckpointError(f"{path}: refusing to save: array {name!r} has {bad} non-finite "
                                  f"value(s) of {a.size}")
        if not a.flags.c_contiguous:
            a = a.copy(order="C")  # (np.ascontiguousarray would turn 0-d arrays into 1-d)
        if a.dtype.byteorder == ">":
            a = a.astype(a.dtype.newbyteorder("<"))
        out.append((name, a))
    return out


def save(out_dir, step, arrays, meta, keep=3, require_finite=True):
    """Write ``arrays`` and JSON-serializable ``meta`` as the checkpoint for ``step``; return its path.

    The returned meta on load is ``meta`` plus ``"step"``. With ``require_finite`` (default), a float
    array holding NaN/inf raises :class:`CheckpointError` and nothing is written, so diverged
    parameters never replace a good checkpoint. After the new file is durable, older checkpoints are
    rotated so that the new one and the ``keep - 1`` newest older ones remain.
    """
    out_dir = os.fspath(out_dir)
    step = int(step)
    if step < 0:
        raise CheckpointError(f"{out_dir}: checkpoint step must be >= 0, got {step}")
    keep = int(keep)
    if keep < 1:
        raise CheckpointError(f"{out_dir}: keep must be >= 1, got {keep}")
    path = checkpoint_path(out_dir, step)
    items = _check_arrays(arrays, path, require_finite)

    meta = dict(meta or {})
    if meta.setdefault("step", step) != step:
        raise CheckpointError(f"{path}: meta['step'] = {meta['step']!r} disagrees with step {step}")

    table, offset = [], 0
    payload_hash = hashlib.sha256()
    for name, a in items:
        start = _align(offset)
        if start > offset:
            payload_hash.update(bytes(start - offset))
        table.append({"name": name, "dtype": a.dtype.str, "shape": list(a.shape),
                      "offset": start, "nbytes": a.nbytes})
        payload_hash.update(_raw(a))
        offset = start + a.nbytes
    header = {"step": step, "meta": meta, "arrays": table, "payload_len": offset,
              "payload_sha256": payload_hash.hexdigest()}
    try:
        header_bytes = json.dumps(header, default=_json_default, sort_keys=True).encode("utf-8")
    except (TypeError, ValueError) as exc:
        raise CheckpointError(f"{path}: meta is not JSON-serializable: {exc}") from None
    head = _PREFIX.pack(MAGIC, FORMAT_VERSION, len(header_bytes)) + header_bytes
    head += hashlib.sha256(head).digest()
    head += bytes(_align(len(head)) - len(head))

    try:
        os.makedirs(out_dir, exist_ok=True)
    except OSError as exc:
        raise CheckpointError(f"{out_dir}: cannot create checkpoint directory: {exc.strerror or exc}") \
            from None
    _clean_temp_files(out_dir)
    try:
        with atomic_open(path, "wb") as f:  # temporary .ckpt-...nbrgc.tmp-PID-RANDOM: see _TMP_RE
            f.write(head)
            written = 0
            for (name, a), entry in zip(items, table):
                if entry["offset"] > written:
                    f.write(bytes(entry["offset"] - written))
                f.write(_raw(a))
                written = entry["offset"] + a.nbytes
    except OSError as exc:
        raise CheckpointError(f"{path}: cannot write checkpoint: {exc.strerror or exc}") from None
    _rotate(out_dir, step, keep)
    return path


def _rotate(out_dir, step, keep):
    older = [(s, p) for s, p in _scan(out_dir) if s < step]
    for _, p in older[:max(0, len(older) - (keep - 1))]:
        try:
            os.remove(p)
        except OSError:
            pass


def _scan(out_dir):
    try:
        names = os.listdir(out_dir)
    except OSError:
        return []
    found = []
    for name in names:
        m = _CKPT_RE.match(name)
        if m is not None:
            found.append((int(m.group(1)), os.path.join(out_dir, name)))
    found.sort()
    return found


def list_checkpoints(out_dir):
    """Paths of the checkpoints in ``out_dir`` (temporary files excluded), by step ascending."""
    return [p for _, p in _scan(os.fspath(out_dir))]


def _check_expect(path, meta, expect):
    for key, want in expect.items():
        want = _to_json(want)
        if key not in meta:
            raise CheckpointMismatchError(f"{path}: meta has no {key!r} (expected {_short(want)})")
        got = meta[key]
        if got != want:
            where, g, w = _first_difference(key, got, want)
            raise CheckpointMismatchError(f"{path}: {where} mismatch: checkpoint has {_short(g)}, "
                                          f"expected {_short(w)}")


def load(path, expect=None):
    """Read and fully verify a checkpoint; return ``(arrays, meta)``.

    ``expect`` maps meta keys to the values they must have (compared after a JSON round trip, so
    tuples equal lists). Any problem raises :class:`CheckpointError` (a meta mismatch raises its
    subclass :class:`CheckpointMismatchError`) with a one-line message naming the file.
    """
    path = os.fspath(path)
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            buf = np.empty(size, dtype=np.uint8)
            got = f.readinto(memoryview(buf))
    except OSError as exc:
        raise CheckpointError(f"{path}: cannot read checkpoint: {exc.strerror or exc}") from None
    if got != size:
        raise CheckpointError(f"{path}: truncated while reading ({got} of {size} bytes)")
    mv = memoryview(buf)

    if size < _PREFIX.size:
        raise CheckpointError(f"{path}: truncated ({size} bytes, shorter than the file prefix)")
    magic, version, header_len = _PREFIX.unpack_from(mv, 0)
    if magic != MAGIC:
        raise CheckpointError(f"{path}: not an nbrgc checkpoint (bad magic bytes)")
    if version != FORMAT_VERSION:
        raise CheckpointError(f"{path}: checkpoint format version {version}, expected {FORMAT_VERSION}")
    head_end = _PREFIX.size + header_len
    if header_len > _MAX_HEADER or head_end + _HASH_LEN > size:
        raise CheckpointError(f"{path}: truncated or corrupt header ({size} bytes, header claims "
                              f"{header_len})")
    if hashlib.sha256(mv[:head_end]).digest() != bytes(mv[head_end:head_end + _HASH_LEN]):
        raise CheckpointError(f"{path}: header checksum mismatch (corrupt header)")
    try:
        header = json.loads(bytes(mv[_PREFIX.size:head_end]).decode("utf-8"))
        meta = header["meta"]
        table = header["arrays"]
        payload_len = int(header["payload_len"])
        payload_sha = header["payload_sha256"]
    except (ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"{path}: malformed header: {exc}") from None
    payload_start = _align(head_end + _HASH_LEN)
    if size != payload_start + payload_len:
        what = "truncated" if size < payload_start + payload_len else "trailing bytes"
        raise CheckpointError(f"{path}: {what} ({size} bytes, expected {payload_start + payload_len})")
    if buf[head_end + _HASH_LEN:payload_start].any():
        raise CheckpointError(f"{path}: corrupt header padding")
    if hashlib.sha256(mv[payload_start:]).hexdigest() != payload_sha:
        raise CheckpointError(f"{path}: payload checksum mismatch (corrupt data)")

    arrays = {}
    try:
        for entry in table:
            dtype = np.dtype(entry["dtype"])
            shape = tuple(int(d) for d in entry["shape"])
            off, nbytes = int(entry["offset"]), int(entry["nbytes"])
            if nbytes != math.prod(shape) * dtype.itemsize or off < 0 or off + nbytes > payload_len:
                raise ValueError(f"bad layout for array {entry['name']!r}")
            start = payload_start + off
            arrays[entry["name"]] = buf[start:start + nbytes].view(dtype).reshape(shape)
    except (ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"{path}: malformed array table: {exc}") from None
    if expect:
        _check_expect(path, meta, expect)
    return arrays, meta


def latest(out_dir, expect=None, log=None):
    """The newest checkpoint in ``out_dir`` that loads: ``(path, arrays, meta)``, or None if none does.

    Walks newest to oldest; each unreadable or corrupt checkpoint skipped is reported through
    ``log(msg)`` with the reason. A checkpoint that is intact but does not match ``expect`` is not
    skipped: :class:`CheckpointMismatchError` is raised, since the directory holds another run's
    checkpoints and silently starting over there would overwrite them.
    """
    for path in reversed(list_checkpoints(out_dir)):
        try:
            arrays, meta = load(path, expect=expect)
        except CheckpointMismatchError:
            raise
        except CheckpointError as exc:
            if log is not None:
                log(f"skipping checkpoint: {exc}")
            continue
        return path, arrays, meta
    return None
