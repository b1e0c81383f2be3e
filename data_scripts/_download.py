"""Shared downloader of the ``data_scripts/*.py`` scripts (standard library only).

Every file is fetched the same way:

* **resumable**: bytes go to ``<name>.part``; a later run asks the server for the rest (HTTP ``Range``) and
  appends; a server that ignores ``Range`` makes it start over;
* **verified**: the complete ``.part`` is hashed (sha256 and md5 in one pass) and compared with the
  published checksum. On a mismatch the script stops with a message naming the file and both hashes, removes
  only that ``.part`` and deletes nothing else. A file without a published checksum is accepted and its
  sha256 printed ("could not verify");
* **atomic**: only a verified file is renamed to its final name (``os.replace``); archives are extracted into
  a temporary folder that is renamed into place when complete;
* **idempotent**: a file that is already present and verified is not fetched again, an archive already
  extracted is not extracted again: a second run touches nothing and opens no connection;
* **offline**: when the host cannot be reached the script prints one line (host unreachable, the URL, what
  to do instead) and exits with status 2.

``--list`` prints what is present and whether it is verified, without any network access.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import socket
import sys
import tarfile
import urllib.error
import urllib.parse
import urllib.request
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

__all__ = [
    "Resource",
    "Dataset",
    "DownloadError",
    "OfflineError",
    "ChecksumError",
    "fetch",
    "verify",
    "file_hashes",
    "extract_archive",
    "main",
    "default_root",
]

CHUNK = 1 << 20


@dataclass(frozen=True)
class Resource:
    """One file: its URL(s) (mirrors, tried in order), the file name, and the published checksum(s)."""

    urls: tuple[str, ...]
    filename: str
    sha256: str | None = None
    md5: str | None = None
    size: int | None = None
    checksum_source: str = ""  # where the checksum was published

    @property
    def url(self) -> str:
        return self.urls[0]


@dataclass
class Dataset:
    """What a script fetches: ``folder`` under the data root, its ``resources`` (relative to ``subdir``),
    and optional ``extractions`` (archive file name -> (member prefix to take, final path relative to the
    folder))."""

    name: str
    folder: str
    resources: list[Resource]
    subdir: str = ""
    extractions: dict[str, tuple[str, str]] = field(default_factory=dict)
    notes: str = ""


class DownloadError(RuntimeError):
    """A download failed (HTTP error, interrupted transfer, ...)."""


class OfflineError(DownloadError):
    """The host could not be reached; the message is one line."""


class ChecksumError(DownloadError):
    """A file's checksum differs from the published one; the message names the file and both hashes."""


def default_root() -> Path:
    """The data root as the chapters resolve it (``$CAPSULE_DATA``, else the repository's ``data/``, else
    ``./data``): :func:`capsule_lib.notebook.environment` reads the variable, ``data_root`` does the rest."""
    from capsule_lib.data.datasets import data_root
    from capsule_lib.notebook import environment

    return data_root(environment().data_root)


def file_hashes(path: Path) -> tuple[str, str]:
    """``(sha256, md5)`` hex digests of a file, in one pass."""
    sha, md5 = hashlib.sha256(), hashlib.md5()
    with open(path, "rb") as f:
        for buf in iter(lambda: f.read(CHUNK), b""):
            sha.update(buf)
            md5.update(buf)
    return sha.hexdigest(), md5.hexdigest()


def verify(path: Path, res: Resource) -> tuple[str, str, str]:
    """``(state, sha256, md5)`` of ``path`` against ``res``; state is ``"verified"``, ``"unverified"`` (no
    published checksum) or ``"mismatch"``."""
    sha, md5 = file_hashes(path)
    if res.sha256 is None and res.md5 is None:
        return "unverified", sha, md5
    ok = (res.sha256 is None or sha == res.sha256.lower()) and (res.md5 is None or md5 == res.md5.lower())
    return ("verified" if ok else "mismatch"), sha, md5


def _expected_and_got(res: Resource, sha: str, md5: str) -> str:
    if res.sha256 is not None:
        return f"expected sha256 {res.sha256}, got {sha}"
    return f"expected md5 {res.md5}, got {md5}"


def _offline_message(res: Resource, url: str, final: Path, err: BaseException) -> str:
    host = urllib.parse.urlsplit(url).hostname or url
    reason = getattr(err, "reason", err)
    text = f"{type(reason).__name__}: {reason}" if str(reason) else type(reason).__name__
    text = " ".join(text.split())
    return (
        f"offline: host {host} is unreachable ({text}); could not download {url}. Instead: run this script "
        f"on a machine with internet and copy {res.filename} to {final.parent}, or set CAPSULE_OFFLINE=1 to "
        f"use the generated stand-in datasets."
    )


def _is_network_error(err: BaseException) -> bool:
    if isinstance(err, urllib.error.HTTPError):
        return False
    return isinstance(
        err, (urllib.error.URLError, socket.timeout, TimeoutError, ConnectionError, socket.gaierror, OSError)
    )


def fetch(
    res: Resource,
    dest: Path,
    *,
    timeout: float = 30.0,
    opener: Callable | None = None,
    log: Callable[[str], None] = print,
) -> Path:
    """Make ``dest/res.filename`` present and verified (see the module docstring); returns its path.
    ``opener(request, timeout=...)`` defaults to ``urllib.request.urlopen`` (tests pass a fake)."""
    opener = opener or urllib.request.urlopen
    final = dest / res.filename
    if final.exists():
        state, sha, md5 = verify(final, res)
        if state == "verified":
            log(f"{res.filename}: already present, verified")
            return final
        if state == "unverified":
            log(f"{res.filename}: already present; could not verify (no published checksum); sha256 {sha}")
            return final
        raise ChecksumError(
            f"checksum mismatch for {final}: {_expected_and_got(res, sha, md5)}. The file was left "
            f"in place and nothing was deleted; remove or replace it and run again."
        )
    part = final.with_name(final.name + ".part")
    first_err: DownloadError | None = None
    for i, url in enumerate(res.urls):
        try:
            _download_to_part(url, part, timeout, opener, log, res)
            first_err = None
            break
        except ChecksumError:
            raise
        except DownloadError as e:
            first_err = first_err or e
            if i + 1 < len(res.urls):
                log(f"{res.filename}: {url} failed ({type(e).__name__}); trying the next mirror")
    if first_err is not None:
        raise first_err
    if res.size is not None and part.stat().st_size < res.size:
        raise DownloadError(
            f"{res.filename}: incomplete download ({part.stat().st_size} of {res.size} bytes) "
            f"kept as {part}; run again to resume"
        )
    state, sha, md5 = verify(part, res)
    if state == "mismatch":
        part.unlink()
        raise ChecksumError(
            f"checksum mismatch for {res.filename} (from {res.url}): {_expected_and_got(res, sha, md5)}. "
            f"Removed only the downloaded {part.name}; nothing else was deleted."
        )
    os.replace(part, final)
    if state == "verified":
        log(f"{res.filename}: downloaded, verified ({'sha256' if res.sha256 else 'md5'})")
    else:
        log(f"{res.filename}: downloaded; could not verify (no published checksum); sha256 {sha}")
    return final


def _download_to_part(
    url: str, part: Path, timeout: float, opener: Callable, log: Callable[[str], None], res: Resource
) -> None:
    have = part.stat().st_size if part.exists() else 0
    if res.size is not None and have >= res.size:
        return  # already complete: only verification is left
    headers = {"User-Agent": "capsule-book-data-scripts/1.0"}
    if have:
        headers["Range"] = f"bytes={have}-"
    req = urllib.request.Request(url, headers=headers)
    try:
        resp = opener(req, timeout=timeout)
    except urllib.error.HTTPError as e:
        if e.code == 416 and have:
            return  # the part file already holds everything the server has
        raise DownloadError(f"{url}: HTTP {e.code} {e.reason}") from e
    except Exception as e:  # noqa: BLE001  (DNS failures, refused connections, timeouts, no route)
        if _is_network_error(e):
            raise OfflineError(_offline_message(res, url, part.with_name(res.filename), e)) from e
        raise
    with resp:
        status = getattr(resp, "status", None) or resp.getcode()
        resumed = have > 0 and status == 206
        if have and not resumed:
            log(f"{res.filename}: the server ignored the range request; starting over")
        mode = "ab" if resumed else "wb"
        got = have if resumed else 0
        part.parent.mkdir(parents=True, exist_ok=True)
        with open(part, mode) as f:
            while True:
                try:
                    buf = resp.read(CHUNK)
                except Exception as e:  # noqa: BLE001
                    raise DownloadError(
                        f"{res.filename}: transfer interrupted after {got} bytes "
                        f"({type(e).__name__}); the partial file {part} is kept: run again to resume"
                    ) from e
                if not buf:
                    break
                f.write(buf)
                got += len(buf)
        if resumed:
            log(f"{res.filename}: resumed at byte {have}")


def extract_archive(archive: Path, member_prefix: str, target: Path, log: Callable[[str], None] = print) -> Path:
    """Extract the members of ``archive`` (zip or tar) under ``member_prefix`` (a folder or one file) to
    ``target``, atomically: into a temporary folder next to it, then one rename. Does nothing if ``target``
    exists."""
    if target.exists():
        log(f"{target.name}: already extracted")
        return target
    tmp = target.with_name(f".{target.name}.extracting")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    try:
        if zipfile.is_zipfile(archive):
            with zipfile.ZipFile(archive) as z:
                names = [m for m in z.namelist() if m == member_prefix or m.startswith(member_prefix.rstrip("/") + "/")]
                for m in names:
                    _check_member(m)
                    z.extract(m, tmp)
        else:
            with tarfile.open(archive) as t:
                names = []
                for m in t.getmembers():
                    if m.name == member_prefix or m.name.startswith(member_prefix.rstrip("/") + "/"):
                        _check_member(m.name)
                        if not (m.isfile() or m.isdir()):
                            continue
                        t.extract(m, tmp)
                        names.append(m.name)
        if not names:
            raise DownloadError(f"{archive}: no member {member_prefix!r}")
        os.replace(tmp / member_prefix.rstrip("/"), target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    log(f"{target.name}: extracted from {archive.name}")
    return target


def _check_member(name: str) -> None:
    if name.startswith("/") or ".." in Path(name).parts:
        raise DownloadError(f"unsafe path in archive: {name!r}")


def status_lines(ds: Dataset, root: Path) -> list[str]:
    """One line per resource (and per extraction) describing what is present; no network access."""
    folder = root / ds.folder
    dest = folder / ds.subdir if ds.subdir else folder
    lines = [f"{ds.name} in {folder}:"]
    for res in ds.resources:
        f = dest / res.filename
        part = f.with_name(f.name + ".part")
        if f.exists():
            state, sha, md5 = verify(f, res)
            if state == "verified":
                what = f"present, verified ({'sha256' if res.sha256 else 'md5'} matches {res.checksum_source})"
            elif state == "unverified":
                what = f"present, unverified (no published checksum; sha256 {sha})"
            else:
                what = f"present, CHECKSUM MISMATCH ({_expected_and_got(res, sha, md5)})"
        elif part.exists():
            what = f"partial download ({part.stat().st_size} bytes in {part.name}; run the script to resume)"
        else:
            what = "missing"
        lines.append(f"  {res.filename}: {what}")
    for archive, (_, target) in ds.extractions.items():
        t = folder / target
        lines.append(f"  {target}: {'extracted' if t.exists() else 'not extracted'} (from {archive})")
    return lines


def run(
    ds: Dataset,
    root: Path,
    *,
    timeout: float = 30.0,
    opener: Callable | None = None,
    log: Callable[[str], None] = print,
) -> None:
    """Fetch every resource of ``ds`` under ``root`` and extract its archives."""
    folder = root / ds.folder
    dest = folder / ds.subdir if ds.subdir else folder
    for res in ds.resources:
        ext = ds.extractions.get(res.filename)
        if ext is not None and (folder / ext[1]).exists() and not (dest / res.filename).exists():
            log(f"{res.filename}: not kept, but {ext[1]} is already extracted; nothing to do")
            continue
        fetch(res, dest, timeout=timeout, opener=opener, log=log)
    for archive, (member, target) in ds.extractions.items():
        extract_archive(dest / archive, member, folder / target, log)


def main(ds: Dataset, argv: Sequence[str] | None = None, *, opener: Callable | None = None) -> int:
    """Command line of a dataset script; returns the exit status (0 ok, 1 error/mismatch, 2 offline)."""
    p = argparse.ArgumentParser(
        description=f"Download {ds.name} into ROOT/{ds.folder} (resumable, verified, idempotent). {ds.notes}"
    )
    p.add_argument("--root", type=Path, default=None, help="data root (default: $CAPSULE_DATA, else ./data)")
    p.add_argument("--list", action="store_true", help="show what is present and verified; no download")
    p.add_argument("--timeout", type=float, default=30.0, help="network timeout in seconds")
    a = p.parse_args(argv)
    root = (a.root or default_root()).expanduser()
    if a.list:
        print("\n".join(status_lines(ds, root)))
        return 0
    try:
        run(ds, root, timeout=a.timeout, opener=opener, log=lambda m: m and print(m))
    except OfflineError as e:
        print(str(e), file=sys.stderr)
        return 2
    except DownloadError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0
