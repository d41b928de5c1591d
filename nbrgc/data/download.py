"""Downloads into the data directory.

A file is fetched into ``NAME.part`` (resumed with an HTTP ``Range`` request when a ``.part`` is already
there or the connection is cut midway), with a tqdm progress bar on stderr. Its size is checked against
the server's ``Content-Length``/``Content-Range`` and the expected size where one is known, and its
sha256 where one is known. Only a complete, verified file gets its final name; a corrupt one is removed
and raises :class:`~nbrgc.errors.DataError`. Every error is one line that names the URL and says where to
put the file when it is downloaded by hand.
"""
from __future__ import annotations

import contextlib
import hashlib
import http.client
import os
import re
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from ..errors import DataError

DEFAULT_DATA_DIR = "~/.cache/nbrgc"
CHUNK = 1 << 20
USER_AGENT = "nbrgc/0.1 (+https://pypi.org/project/nbrgc)"


def data_dir(path=None) -> Path:
    """The data directory: ``path`` if given, else ``$NBRGC_DATA``, else ``~/.cache/nbrgc`` (not created)."""
    if path is None or str(path) == "":
        path = os.environ.get("NBRGC_DATA") or DEFAULT_DATA_DIR
    return Path(os.path.expanduser(os.fspath(path)))


def ensure_dir(d) -> Path:
    d = Path(d)
    try:
        d.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise DataError(f"cannot create data directory {d}: {_why(e)}") from None
    return d


def one_line(s) -> str:
    return " ".join(str(s).split())


def _why(e) -> str:
    if isinstance(e, urllib.error.URLError) and not isinstance(e, urllib.error.HTTPError):
        e = e.reason
    if isinstance(e, OSError) and e.strerror:
        return one_line(e.strerror)
    return one_line(e) or type(e).__name__


def manual_hint(url, dest) -> str:
    return f"download {url} by hand and put it at {dest}"


def read_chunks(f, chunk=CHUNK):
    """The bytes of an open binary file, ``chunk`` at a time (never the whole file in memory)."""
    while True:
        b = f.read(chunk)
        if not b:
            return
        yield b


def sha256_file(path, chunk=CHUNK) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for b in read_chunks(f, chunk):
            h.update(b)
    return h.hexdigest()


def remove(path):
    with contextlib.suppress(FileNotFoundError):
        os.remove(path)


@contextlib.contextmanager
def file_lock(path):
    """An advisory exclusive lock (fcntl) so that two processes do not fill the same ``.part`` at once."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        yield
        return
    path = Path(path)
    ensure_dir(path.parent)
    try:
        f = open(path, "a+b")
    except OSError:  # read-only data dir: nothing will be written anyway
        yield
        return
    with f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


_CONTENT_RANGE = re.compile(r"bytes\s+(\d+)-(\d+)/(\d+|\*)")


def _parse_content_range(value):
    m = _CONTENT_RANGE.match(value or "")
    if not m:
        return None, None
    return int(m.group(1)), (None if m.group(3) == "*" else int(m.group(3)))


def _int_header(value):
    value = (value or "").strip()
    return int(value) if value.isdigit() else None


def download(url, dest, *, expected_size=None, sha256=None, log=print, progress=True, timeout=60.0,
             max_failures=5) -> Path:
    """Fetch ``url`` into ``dest`` (via ``dest.part``, resumed if present); verify; return ``dest``.

    ``expected_size``/``sha256`` may be None (unknown). Without a known size the server's Content-Length is
    the reference. A cut connection is resumed with a Range request (up to ``max_failures`` attempts in a
    row that bring no new bytes); if it still fails, the ``.part`` is kept so that the next run resumes it.
    """
    log = log or (lambda *a, **k: None)
    dest = Path(dest)
    ensure_dir(dest.parent)
    part = dest.with_name(dest.name + ".part")
    hint = manual_hint(url, dest)
    total = expected_size
    failures = 0
    responded = False  # has the server answered at least once in this call?
    restarted = False
    bar = None
    last_err = None

    def corrupt(msg):
        remove(part)
        raise DataError(f"{msg}; the partial download {part} was removed; run again to retry or {hint}")

    try:
        while True:
            have = part.stat().st_size if part.exists() else 0
            if total is not None and have == total:
                break
            if total is not None and have > total:
                corrupt(f"download of {url} has {have:,} bytes, more than the expected {total:,}")
            headers = {"User-Agent": USER_AGENT, "Accept-Encoding": "identity"}
            if have:
                headers["Range"] = f"bytes={have}-"
            if responded or have:
                log(f"resuming {url} at byte {have:,}")
            else:
                log(f"downloading {url} -> {dest}")
            req = urllib.request.Request(url, headers=headers)
            try:
                resp = urllib.request.urlopen(req, timeout=timeout)
            except urllib.error.HTTPError as e:
                if e.code == 416 and have and not restarted:
                    # Range past the end: our .part is stale or bogus. Start over once.
                    m = re.search(r"/(\d+)\s*$", e.headers.get("Content-Range", "") or "")
                    rtotal = int(m.group(1)) if m else None
                    if rtotal is not None and rtotal == have and expected_size in (None, have):
                        total = have
                        break
                    log(f"server refused to resume {url} at byte {have:,}; starting over")
                    remove(part)
                    restarted = True
                    continue
                raise DataError(f"cannot download {url}: HTTP {e.code} {one_line(e.reason)}; {hint}") from None
            except (OSError, http.client.HTTPException) as e:
                if not responded:
                    raise DataError(f"cannot download {url} ({_why(e)}): no network? {hint}") from None
                last_err = e
                failures += 1
                if failures >= max_failures:
                    break
                time.sleep(min(0.1 * failures, 2.0))
                continue
            responded = True
            got = 0
            with resp:
                status = getattr(resp, "status", 200)
                length = _int_header(resp.headers.get("Content-Length"))
                mode = "wb"
                server_total = length
                if status == 206 and have:
                    start, rtotal = _parse_content_range(resp.headers.get("Content-Range"))
                    if start != have:
                        log(f"server sent an unexpected range for {url}; starting over")
                        remove(part)
                        continue
                    mode = "ab"
                    server_total = rtotal if rtotal is not None else (None if length is None else have + length)
                elif have:
                    log(f"server does not resume {url}; starting over")
                    have = 0
                if server_total is not None:
                    if expected_size is not None and server_total != expected_size:
                        corrupt(f"{url} is {server_total:,} bytes, expected {expected_size:,}")
                    total = server_total
                if bar is None:
                    from tqdm import tqdm
                    bar = tqdm(total=total, initial=have, unit="B", unit_scale=True, unit_divisor=1024,
                               desc=dest.name, file=sys.stderr, disable=not progress, dynamic_ncols=True,
                               mininterval=0.5)
                else:
                    bar.total = total
                    bar.n = have
                    bar.refresh()
                try:
                    with open(part, mode) as f:
                        try:
                            while True:
                                chunk = resp.read(CHUNK)
                                if not chunk:
                                    break
                                f.write(chunk)
                                got += len(chunk)
                                bar.update(len(chunk))
                                if total is not None and have + got > total:
                                    break
                        except (OSError, http.client.HTTPException) as e:  # cut connection, timeout
                            last_err = e
                except OSError as e:
                    raise DataError(f"cannot write {part}: {_why(e)}") from None
            size = have + got
            if total is None:
                if last_err is None:
                    log(f"warning: the server gave no size for {url}; it could not be checked")
                    break
            elif size == total:
                break
            elif size > total:
                corrupt(f"{url} sent {size:,} bytes, more than the announced {total:,}")
            if got:
                failures = 0
            else:
                failures += 1
            if failures >= max_failures:
                break
            last_err = last_err or ConnectionError("connection closed early")
            log(f"connection to {url} cut at byte {size:,}" + (f" of {total:,}" if total else "")
                + f" ({_why(last_err)})")
            last_err = None
            if not got:
                time.sleep(min(0.1 * failures, 2.0))
    finally:
        if bar is not None:
            bar.close()

    have = part.stat().st_size if part.exists() else 0
    if failures >= max_failures or (total is not None and have != total):
        of = f" of {total:,}" if total else ""
        raise DataError(f"download of {url} keeps failing at byte {have:,}{of} ({_why(last_err or 'no data')}); "
                        f"the partial file {part} is kept and resumed next time; or {hint}")
    if sha256:
        got_sha = sha256_file(part)
        if got_sha.lower() != sha256.lower():
            corrupt(f"sha256 mismatch for {url}: got {got_sha}, expected {sha256}")
    os.replace(part, dest)
    return dest
