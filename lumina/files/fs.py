"""Where data files live: local paths or fsspec URLs (`s3://bucket/prefix/...`), read with a bounded retry.

An object store's endpoint and credentials come from the standard environment only (for S3:
`AWS_ENDPOINT_URL`, `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_DEFAULT_REGION`, or a profile), never
from a config file. The clients' own retries are off, so the budget is this module's: a transient failure
(connection refused or reset, timeout, a 5xx) is retried `Retry.attempts` times in all, waiting
`backoff_s`, 2 `backoff_s`, ... between tries, then `StoreError` names the URL. A missing object or a
refused permission is not transient and raises at once. Shards are read in byte ranges (`open_binary`);
media files (token files, images) whole (`read_bytes`); manifests as streamed lines (`read_lines`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TypeVar

log = logging.getLogger(__name__)
T = TypeVar("T")

# the clients' own retries off (botocore: `max_attempts`; s3fs: its `retries` attribute); timeouts bound a try
_OPTIONS = {"s3": {"config_kwargs": {"retries": {"max_attempts": 1}, "connect_timeout": 5, "read_timeout": 30}}}


@dataclass(frozen=True)
class Retry:
    """attempts: tries in all (>= 1); backoff_s: the wait after the first failure, doubled after each."""

    attempts: int = 4
    backoff_s: float = 0.5

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError(f"retry attempts={self.attempts}: must be >= 1")
        if self.backoff_s < 0:
            raise ValueError(f"retry backoff_s={self.backoff_s}: must be >= 0")


DEFAULT_RETRY = Retry()


class StoreError(OSError):
    """A read from the data store that still failed after the retry budget; the message names the URL."""


def is_url(path: object) -> bool:
    """A fsspec URL with a scheme (s3://, gs://, memory://, ...) rather than a local path."""
    return isinstance(path, str) and "://" in path and not path.startswith("file://")


def filesystem(url: str):
    """(fsspec filesystem, path within it) for a URL, with this module's client options."""
    protocol = url.split("://", 1)[0]
    try:
        import fsspec

        fs, path = fsspec.core.url_to_fs(url, **_OPTIONS.get(protocol, {}))
    except ImportError as exc:
        raise ImportError(f"{url}: reading {protocol}:// needs its fsspec client; pip install 'lumina[s3]' "
                          f"({exc})") from exc
    if hasattr(fs, "retries"):
        fs.retries = 1
    return fs, path


def open_binary(path: str, size: int | None = None) -> IO[bytes]:
    """A seekable binary file of a local path or URL; a URL's reads fetch exactly the byte ranges asked for
    (`size`, when known, saves the request that looks it up)."""
    if not is_url(path):
        return open(path, "rb")  # noqa: SIM115 - the caller closes it
    fs, inner = filesystem(path)
    return fs.open(inner, "rb", cache_type="none", size=size)


def is_file(path: str | Path, retry: Retry = DEFAULT_RETRY) -> bool:
    """Whether a local file or an object exists. Only "not found" is False: an object's lookup is retried
    within `retry` on transient errors, then raises StoreError naming the URL (as a refused permission does)."""
    if not is_url(path):
        return Path(path).is_file()
    fs, inner = filesystem(str(path))

    def look_up() -> bool:  # fsspec's isfile() answers False on any error, an outage included
        try:
            return fs.info(inner)["type"] == "file"
        except FileNotFoundError:
            return False

    try:
        return with_retries(str(path), "looking it up", look_up, retry)
    except PermissionError as exc:
        raise StoreError(f"{path}: looking it up was refused: {exc}") from exc


def read_bytes(path: str | Path, retry: Retry = DEFAULT_RETRY) -> bytes:
    """A whole file or object, read into memory (retried within `retry`; a missing one: FileNotFoundError)."""

    def read() -> bytes:
        with open_binary(str(path)) as f:
            return f.read()

    return with_retries(str(path), "reading it", read, retry)


def read_lines(path: str | Path, retry: Retry = DEFAULT_RETRY, chunk_bytes: int = 1 << 23) -> Iterator[bytes]:
    """The lines of a file or object (without b"\\n"), streamed `chunk_bytes` at a time, each range retried."""
    offset, rest = 0, b""
    while True:
        def read(start: int = offset) -> bytes:
            with open_binary(str(path)) as f:
                f.seek(start)
                return f.read(chunk_bytes)

        chunk = with_retries(str(path), f"reading bytes {offset}-{offset + chunk_bytes}", read, retry)
        if not chunk:
            break
        offset += len(chunk)
        *lines, rest = (rest + chunk).split(b"\n")
        yield from lines
    if rest:
        yield rest


def parent(path: str | Path) -> str | Path:
    """The directory of a local path, or the prefix of a URL (`s3://b/p/m.jsonl` -> `s3://b/p`)."""
    return str(path).rsplit("/", 1)[0] if is_url(path) else Path(path).parent


def join(base: str | Path, name: str) -> str | Path:
    """`name` relative to a directory or URL prefix; an absolute path or a URL stays itself."""
    if is_url(name) or Path(name).is_absolute():
        return name if is_url(name) else Path(name)
    return f"{str(base).rstrip('/')}/{name}" if is_url(base) else Path(base) / name


def with_retries(url: str, what: str, fn: Callable[[], T], retry: Retry) -> T:
    """fn() retried within `retry`'s budget on transient errors; then StoreError naming `url` and `what`."""
    start, wait = time.monotonic(), retry.backoff_s
    for attempt in range(1, retry.attempts + 1):
        try:
            return fn()
        except (FileNotFoundError, PermissionError, IsADirectoryError):
            raise
        except Exception as exc:
            if not _transient(exc):
                raise
            if attempt == retry.attempts:
                raise StoreError(f"{url}: {what} failed {attempt} times in {time.monotonic() - start:.1f} s; "
                                 f"last error: {type(exc).__name__}: {exc}") from exc
            log.warning("%s: %s failed (try %d of %d, retrying in %.2f s): %s", url, what, attempt, retry.attempts,
                        wait, exc)
            time.sleep(wait)
            wait *= 2
    raise AssertionError("unreachable")


def _transient(exc: BaseException) -> bool:
    """Connection, timeout and server-side errors (OSError and the HTTP clients' own), not bad data."""
    if isinstance(exc, OSError):
        return True
    names = {cls.__name__ for cls in type(exc).__mro__}
    return bool(names & {"BotoCoreError", "ClientError", "HTTPClientError", "ClientPayloadError", "TimeoutError"})
