"""Server state and the files a run writes: atomic, pickle-free, hash-checked checkpoints.

Every file goes to a temp file in the same folder, is fsynced and renamed over its name, so
a kill leaves either the old or the new file, never half of one (a kill mid-write leaves a
``<name>.<random>.tmp`` that the next start in that run directory removes). A checkpoint
is a ``torch.save`` archive followed by a one-line trailer holding the sha256 of the archive
(streamed to the temp file and hashed on the way, never whole in memory): any changed byte
is detected on loading, and ``torch.load(weights_only=True)`` still reads
the file directly (zip readers ignore bytes after the archive). The previous checkpoint is
kept beside the latest (``checkpoint.prev.pt``), and a corrupt latest one falls back to it
with a warning. A write that fails (a full disk, a read-only folder) raises
:class:`StorageError` naming the file.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import logging
import os
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from fedshift.core.bounded import open_regular
from fedshift.core.errors import CheckpointError, StorageError
from fedshift.core.torchload import load_failure, load_weights_only

log = logging.getLogger(__name__)


@dataclass
class ServerState:
    """Everything the server program carries from round to round.

    ``model`` is the global model's state dict (may be empty for methods without a global
    model); ``extra`` holds any other tensors or scalars (prototype tables, aggregation
    weights, the best round by IDD, ...). Both must contain only tensors, numbers, strings,
    bools, None and nested dicts/lists of those so they load with ``weights_only=True``.
    """

    model: dict[str, torch.Tensor] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"model": self.model, "extra": self.extra}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ServerState:
        return cls(model=dict(data["model"]), extra=dict(data["extra"]))


#: format tag of every file :func:`load_checkpoint` accepts
CHECKPOINT_FORMAT = "fedshift-checkpoint-v1"
#: last bytes of a hash-checked checkpoint: ``MAGIC + <64 hex digits of sha256> + b"\n"``
MAGIC = b"\nFEDSHIFT-CKPT sha256="
TRAILER_SIZE = len(MAGIC) + 64 + 1
#: the largest checkpoint file read (a bound far above any run's state, against a wrong path)
MAX_CHECKPOINT_BYTES = 32 << 30
#: a plain ``torch.save`` file (an older, unhashed checkpoint) is a zip archive: it starts
#: with a local file header and ends with the end-of-central-directory record (22 bytes)
ZIP_START, ZIP_END, ZIP_END_SIZE = b"PK\x03\x04", b"PK\x05\x06", 22

#: permissions of a new run file: what ``open()`` would give (mkstemp's are owner-only)
_UMASK = os.umask(0)
os.umask(_UMASK)
FILE_MODE = 0o666 & ~_UMASK

#: files this process wrote or verified: path -> (size, mtime_ns) when it was known good
_known_good: dict[Path, tuple[int, int]] = {}


def previous_path(path: str | os.PathLike) -> Path:
    """Where the checkpoint before ``path`` is kept: ``checkpoint.pt`` -> ``checkpoint.prev.pt``."""
    path = Path(path)
    return path.with_name(f"{path.stem}.prev{path.suffix}")


def _fsync_folder(folder: Path) -> None:
    """Make a rename in ``folder`` durable (a no-op where folders cannot be opened)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


#: bytes gathered before a write to the file (a tensor at least this large goes directly)
WRITE_BUFFER = 1 << 20


class _AtomicFile:
    """The write end of :func:`atomic_file`: bytes pass to the file descriptor ``fd``
    (small writes gathered up to :data:`WRITE_BUFFER`) and to ``hasher`` (a ``hashlib``
    object, or None) as they come, so nothing is gathered whole in memory."""

    def __init__(self, fd: int, hasher=None):
        self.fd = fd
        self.hasher = hasher
        self.size = 0
        #: the OSError of a failed write (torch.save reports it as a RuntimeError of its own)
        self.error: OSError | None = None
        self._pending = bytearray()

    def write(self, data) -> int:
        view = memoryview(data).cast("B")
        if self.hasher is not None:
            self.hasher.update(view)
        self.size += len(view)
        if len(self._pending) + len(view) <= WRITE_BUFFER:
            self._pending += view
        else:
            self.flush()
            if len(view) < WRITE_BUFFER:
                self._pending += view
            else:
                self._write_all(view)
        return len(view)

    def flush(self) -> None:
        """Pass the gathered bytes to the file (torch.save calls it; the file is fsynced
        when the ``with`` block of :func:`atomic_file` ends)."""
        if self._pending:
            self._write_all(memoryview(self._pending))
            self._pending = bytearray()

    def _write_all(self, view: memoryview) -> None:
        try:
            while view:
                view = view[os.write(self.fd, view) :]
        except OSError as exc:
            self.error = exc
            raise


@contextlib.contextmanager
def atomic_file(
    path: str | os.PathLike, *, keep_previous: bool = False, hasher=None
) -> Iterator[_AtomicFile]:
    """A file-like object whose bytes replace ``path`` when the ``with`` block ends.

    The bytes go to a temp file in the same folder (``hasher``, a ``hashlib`` object, sees
    each one on the way), which is then fsynced and renamed over
    ``path``. ``keep_previous`` first links the current file (when it is a good checkpoint)
    to :func:`previous_path`, so at every moment ``path`` exists. Any failure removes the
    temp file and raises :class:`StorageError` naming ``path`` and the reason; an exception
    from the block leaves ``path`` as it was.
    """
    path = Path(path)
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
        try:
            os.fchmod(fd, FILE_MODE)
            out = _AtomicFile(fd, hasher)
            try:
                yield out
            except Exception:
                if out.error is not None:  # the disk's reason, not torch.save's wrapper
                    raise out.error from None
                raise
            out.flush()
            os.fsync(fd)
        finally:
            os.close(fd)
        if keep_previous and path.is_file() and _is_good_checkpoint(path):
            _link_over(path, previous_path(path))
        os.replace(tmp, path)
        tmp = None
        _fsync_folder(path.parent)
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise StorageError(f"cannot write {path}: {reason}", path) from exc
    finally:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)


def write_atomically(
    path: str | os.PathLike, chunks: Sequence[bytes | memoryview], *, keep_previous: bool = False
) -> None:
    """Write ``chunks`` to ``path`` through a temp file, fsync and rename (:func:`atomic_file`)."""
    with atomic_file(path, keep_previous=keep_previous) as out:
        for chunk in chunks:
            out.write(chunk)


def _link_over(source: Path, target: Path) -> None:
    """Make ``target`` another name of ``source`` (a copy where hard links are refused)."""
    fd, tmp = tempfile.mkstemp(prefix=target.name + ".", suffix=".tmp", dir=target.parent)
    os.close(fd)
    try:
        os.unlink(tmp)
        try:
            os.link(source, tmp)
        except OSError:  # a file system without hard links
            with open(source, "rb") as src, open(tmp, "wb") as dst:
                while block := src.read(1 << 20):
                    dst.write(block)
                dst.flush()
                os.fsync(dst.fileno())
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def write_text_atomically(path: str | os.PathLike, text: str) -> None:
    """Replace a text file (``config.json``, ``summary.json``) in one step."""
    write_atomically(path, [text.encode()])


def atomic_save(obj: Any, path: str | os.PathLike) -> None:
    """A plain ``torch.save`` file (weights others load with ``torch.load``), written
    atomically and streamed to the file (never whole in memory)."""
    with atomic_file(path) as out:
        torch.save(obj, out)


def save_checkpoint(obj: Any, path: str | os.PathLike) -> None:
    """Save ``obj`` with its sha256 after it, keeping the previous checkpoint beside it.

    The archive is streamed to the temp file and hashed on the way (the same bytes and
    hash as saving it to memory first, without a second copy of the state in memory)."""
    digest = hashlib.sha256()
    with atomic_file(path, keep_previous=True, hasher=digest) as out:
        torch.save(obj, out)
        out.hasher = None  # the trailer is not part of the hashed payload
        out.write(MAGIC + digest.hexdigest().encode() + b"\n")
    _remember_good(Path(path))


def _remember_good(path: Path) -> None:
    stat = path.stat()
    _known_good[path.resolve()] = (stat.st_size, stat.st_mtime_ns)


def _is_good_checkpoint(path: Path) -> bool:
    """Whether ``path`` holds an intact checkpoint (so it may become the previous one)."""
    stat = path.stat()
    if _known_good.get(path.resolve()) == (stat.st_size, stat.st_mtime_ns):
        return True
    try:
        _verified_payload(path)
    except CheckpointError:
        return False
    return True


def _verified_payload(path: Path) -> bytes:
    """The payload of a checkpoint file after checking its hash (or an older unhashed file);
    a file above :data:`MAX_CHECKPOINT_BYTES` is refused before it is read."""
    with open_regular(path, CheckpointError, "checkpoint") as handle:
        size = os.fstat(handle.fileno()).st_size
        if size > MAX_CHECKPOINT_BYTES:
            raise CheckpointError(
                f"checkpoint {path} is {size:,} bytes, "
                f"above the {MAX_CHECKPOINT_BYTES:,}-byte bound"
            )
        data = handle.read()
    payload, trailer = data[:-TRAILER_SIZE], data[-TRAILER_SIZE:]
    if not (trailer.startswith(MAGIC) and trailer.endswith(b"\n")):
        if data.startswith(ZIP_START) and data[-ZIP_END_SIZE:].startswith(ZIP_END):
            return data  # written before checkpoints carried a hash: nothing to check
        raise CheckpointError(f"checkpoint {path} is corrupt or not a fedshift checkpoint")
    stored = trailer[len(MAGIC) : -1].decode("ascii", "replace")
    actual = hashlib.sha256(payload).hexdigest()
    if stored != actual:
        raise CheckpointError(
            f"checkpoint {path} is corrupt or not a fedshift checkpoint "
            f"(sha256 {actual[:12]}... differs from the stored {stored[:12]}...)"
        )
    return payload


def _load_one(path: Path) -> dict[str, Any]:
    if not (path.exists() or path.is_symlink()):  # anything else is refused when opened
        raise CheckpointError(
            f"no checkpoint at {path}; start without --resume or give the run dir"
        )
    try:
        payload = _verified_payload(path)
    except OSError as exc:
        raise CheckpointError(f"cannot read checkpoint {path}: {exc.strerror}") from exc
    try:
        data = load_weights_only(io.BytesIO(payload))
    except Exception as exc:  # torch raises many types for truncated/garbage files
        raise CheckpointError(
            f"checkpoint {path} is corrupt or not a fedshift checkpoint ({load_failure(exc)}); "
            "delete it to start over"
        ) from exc
    if not isinstance(data, dict) or data.get("format") != CHECKPOINT_FORMAT:
        raise CheckpointError(f"{path} is not a fedshift checkpoint (missing format tag)")
    _remember_good(path)
    return data


def load_checkpoint(path: str | os.PathLike, *, fallback: bool = True) -> dict[str, Any]:
    """Load a checkpoint without unpickling arbitrary objects, checking its sha256.

    With ``fallback``, a missing or corrupt ``path`` gives the previous checkpoint kept
    beside it (one warning line saying so) when that one is intact.
    """
    path = Path(path)
    try:
        return _load_one(path)
    except CheckpointError as exc:
        previous = previous_path(path)
        if not fallback or not previous.is_file():
            raise
        try:
            data = _load_one(previous)
        except CheckpointError:
            raise CheckpointError(
                f"{exc}; the previous checkpoint {previous} is unusable too"
            ) from None
        log.warning(
            "%s; using the previous checkpoint %s (round %s) instead",
            exc,
            previous.name,
            data.get("round"),
        )
        return data


def roll_back_checkpoint(path: str | os.PathLike) -> dict[str, Any]:
    """Make the previous checkpoint kept beside ``path`` the latest one again (both names
    then hold it) and return it: the way back from a checkpoint that is intact but holds a
    poisoned model. A missing or corrupt previous checkpoint is a CheckpointError."""
    path = Path(path)
    previous = previous_path(path)
    data = _load_one(previous)
    try:
        _link_over(previous, path)
        _fsync_folder(path.parent)
    except OSError as exc:
        raise StorageError(f"cannot write {path}: {exc.strerror or exc}", path) from exc
    _remember_good(path)
    return data


def has_checkpoint(run_dir: str | os.PathLike, name: str = "checkpoint.pt") -> bool:
    """Whether ``run_dir`` holds a checkpoint, latest or previous."""
    path = Path(run_dir) / name
    return path.is_file() or previous_path(path).is_file()
