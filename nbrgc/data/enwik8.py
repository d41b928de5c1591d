"""enwik8: the first 10^8 bytes of an English Wikipedia XML dump (Hutter Prize / Large Text Compression
Benchmark). Downloaded once as ``enwik8.zip`` into the data directory, checked, unzipped to ``enwik8``,
memory-mapped, split 90M/5M/5M. A shorter prefix (e.g. enwik6) is accepted with a warning and split
90/5/5 proportionally; a longer file (e.g. enwik9) is cut to its first 10^8 bytes, which are enwik8.
"""
from __future__ import annotations

import hashlib
import os
import zipfile
import zlib
from pathlib import Path

from ..errors import DataError
from .download import data_dir as _data_dir, download as _download, ensure_dir, file_lock, remove, manual_hint, _why
from .text import memmap_file, proportional

ENWIK8_URL = "http://mattmahoney.net/dc/enwik8.zip"
ENWIK8_ZIP_SIZE = 36_445_475
#: sha256 of the canonical enwik8.zip; may be set to None if the mirror ever re-packs the archive (the
#: unzipped size and the zip's CRCs are checked regardless).
ENWIK8_ZIP_SHA256 = "547994d9980ebed1288380d652999f38a14fe291a6247c157c3d33d4932534bc"
ENWIK8_SIZE = 100_000_000
#: sha256 of the unzipped enwik8 (checked while unzipping; a mismatch only warns).
ENWIK8_SHA256 = "2b49720ec4d78c3c9fabaee6e4179a5e997302b3a70029f30f2d582218c024a8"
SPLIT = (90_000_000, 5_000_000, 5_000_000)
ZIP_NAME = "enwik8.zip"
RAW_NAME = "enwik8"

_AUTO = object()


def enwik8_url(url=None) -> str:
    """The URL to fetch: ``url``, else ``$NBRGC_ENWIK8_URL``, else the canonical one."""
    return url or os.environ.get("NBRGC_ENWIK8_URL") or ENWIK8_URL


def expectations(url):
    """(zip size, zip sha256, unzipped size) to check for ``url``: the known values for the canonical URL,
    none for an override (a mirror or a test server may package it differently)."""
    if url == ENWIK8_URL:
        return ENWIK8_ZIP_SIZE, ENWIK8_ZIP_SHA256, ENWIK8_SIZE
    return None, None, None


def unzip(zpath, out, *, member=RAW_NAME, expected_size=None, remove_bad=False, log=print) -> Path:
    """Check ``zpath`` (zipfile.testzip, member size) and extract its ``member`` to ``out`` via ``out.part``.

    On a corrupt zip: remove it if ``remove_bad`` (a cached download) and raise a one-line DataError.
    """
    zpath, out = Path(zpath), Path(out)

    def bad(msg):
        if remove_bad:
            remove(zpath)
            msg += f"; it was removed, run again to download it again or {manual_hint(enwik8_url(), zpath)}"
        else:
            msg += f"; delete it or replace it with a good copy ({enwik8_url()})"
        raise DataError(msg)

    tmp = out.with_name(out.name + ".part")
    try:
        with zipfile.ZipFile(zpath) as z:
            infos = [i for i in z.infolist() if not i.is_dir()]
            named = [i for i in infos if Path(i.filename).name == member]
            if named:
                info = named[0]
            elif len(infos) == 1:
                info = infos[0]
            else:
                bad(f"{zpath} holds no file named {member}")
            if expected_size is not None and info.file_size != expected_size:
                bad(f"{zpath} is not a good enwik8.zip: its {info.filename} is {info.file_size:,} bytes, "
                    f"expected {expected_size:,}")
            broken = z.testzip()
            if broken is not None:
                bad(f"{zpath} is corrupt (CRC error in {broken})")
            log(f"unzipping {zpath} -> {out}")
            ensure_dir(out.parent)
            h = hashlib.sha256()
            with z.open(info) as src, open(tmp, "wb") as dst:
                while True:
                    b = src.read(1 << 20)
                    if not b:
                        break
                    h.update(b)
                    dst.write(b)
            if tmp.stat().st_size != info.file_size:
                bad(f"{zpath} is corrupt ({info.filename} unpacked to {tmp.stat().st_size:,} bytes, "
                    f"expected {info.file_size:,})")
            if info.file_size == ENWIK8_SIZE and h.hexdigest() != ENWIK8_SHA256:
                log(f"warning: {zpath} unpacks to 10^8 bytes that are not the standard enwik8 (sha256 differs)")
            os.replace(tmp, out)
    except (zipfile.BadZipFile, zlib.error, EOFError, NotImplementedError) as e:
        bad(f"{zpath} is not a valid zip file ({_why(e)})")
    except FileNotFoundError:
        raise DataError(f"no such file: {zpath}") from None
    except OSError as e:
        raise DataError(f"cannot unzip {zpath} to {out}: {_why(e)}") from None
    finally:
        remove(tmp)
    return out


def fetch_enwik8(data_dir=None, *, url=None, download=True, log=print, progress=True,
                 zip_size=_AUTO, sha256=_AUTO, size=_AUTO) -> Path:
    """Path of the unzipped ``enwik8`` in the data directory, downloading and unzipping it if needed.

    ``zip_size``/``sha256``/``size`` (zip bytes, zip sha256, unzipped bytes) default to the known values
    for the canonical URL and to None (unchecked) for an overriding URL.
    """
    d = _data_dir(data_dir)
    raw, zp = d / RAW_NAME, d / ZIP_NAME
    if raw.is_file():
        return raw
    u = enwik8_url(url)
    e_zip, e_sha, e_size = expectations(u)
    zip_size = e_zip if zip_size is _AUTO else zip_size
    sha256 = e_sha if sha256 is _AUTO else sha256
    size = e_size if size is _AUTO else size
    if not zp.is_file() and not download:
        raise DataError(f"enwik8 is not in {d} and downloading is off; {manual_hint(u, zp)}")
    ensure_dir(d)
    with file_lock(d / f".{ZIP_NAME}.lock"):
        if raw.is_file():  # another process finished meanwhile
            return raw
        fresh = not zp.is_file()
        if fresh:
            _download(u, zp, expected_size=zip_size, sha256=sha256, log=log, progress=progress)
        # A bad zip we just downloaded is removed, and must unpack to the expected size. One that was
        # already there (perhaps put there by hand) is left for the user to look at if it is corrupt, and
        # a short member is read as a prefix of enwik8 (with a warning), like a hand-placed enwik8 file.
        unzip(zp, raw, expected_size=size if fresh else None, remove_bad=fresh, log=log)
    return raw


def enwik8_dataset(path, log=print, name=None):
    """Memory-map an enwik8 file (or a prefix of it, with a warning) and split it."""
    path = Path(path)
    data = memmap_file(path)
    n = len(data)
    name = name or ("enwik8" if n >= ENWIK8_SIZE else path.name)
    if n > ENWIK8_SIZE:
        log(f"warning: {path} has {n:,} bytes, more than enwik8's {ENWIK8_SIZE:,}; using its first "
            f"{ENWIK8_SIZE:,} bytes (which are enwik8 if it is an enwik9-style file)")
        data = data[:ENWIK8_SIZE]
        n = ENWIK8_SIZE
    if n == ENWIK8_SIZE:
        a, b, _ = SPLIT
        from .text import Dataset
        return Dataset(name, data[:a], data[a:a + b], data[a + b:], path)
    ds = proportional(name, data, path)
    log(f"warning: {path} has {n:,} bytes, not enwik8's {ENWIK8_SIZE:,}: treating it as a prefix of enwik8, "
        f"split 90/5/5 proportionally ({len(ds.train):,}/{len(ds.val):,}/{len(ds.test):,} bytes); "
        f"results are not comparable with full-enwik8 numbers")
    return ds


def load_enwik8(path=None, data_dir=None, *, url=None, download=True, log=print, progress=True):
    """``enwik8`` (``path`` None: from the data directory, downloaded if missing) or a user's enwik8-like
    file or zip at ``path`` (nothing downloaded)."""
    if path is None:
        return enwik8_dataset(fetch_enwik8(data_dir, url=url, download=download, log=log, progress=progress), log)
    p = Path(os.path.expanduser(os.fspath(path)))
    if not p.exists():
        raise DataError(f"no such file: {p}")
    if p.suffix.lower() == ".zip":
        try:
            with zipfile.ZipFile(p) as z:
                infos = [i for i in z.infolist() if not i.is_dir()]
        except (zipfile.BadZipFile, OSError, EOFError) as e:
            raise DataError(f"{p} is not a valid zip file ({_why(e)})") from None
        if not infos:
            raise DataError(f"{p} is an empty zip file")
        stem = p.name[:-4]
        named = [i for i in infos if Path(i.filename).name in (RAW_NAME, stem)]
        info = named[0] if named else infos[0]
        member = Path(info.filename).name
        d = _data_dir(data_dir)
        out = d / member
        if not (out.is_file() and out.stat().st_size == info.file_size):
            ensure_dir(d)
            with file_lock(d / f".{member}.lock"):
                if not (out.is_file() and out.stat().st_size == info.file_size):
                    unzip(p, out, member=member, log=log)
        return enwik8_dataset(out, log, name=None)
    return enwik8_dataset(p, log)
