"""The output folder held by one launch: an operating-system lock (flock) on
`<output_dir>/.run.lock`, taken before anything is written there and given back when the run ends
or its process exits; a killed launch leaves only the file, which the next launch reports. Also a
resume's records, kept until its checkpoint has loaded (`defer_writes`)."""

from __future__ import annotations

import atexit
import fcntl
import json
import os
import socket
import threading
import time
from pathlib import Path

LOCK = ".run.lock"  # held by the launch writing in the folder; it records that launch
# this process's held folders: resolved path -> (lock descriptor, thread, lock path)
_HOLDS: dict[str, tuple] = {}
# resolved path -> {file: text}: a resume's records, written once its checkpoint loaded
_DEFERRED: dict[str, dict] = {}


def hold(folder: Path, token: str, script: str, log=print) -> None:
    """Hold `folder` for this launch: an exclusive lock on `<folder>/.run.lock` (which records this
    launch: process, host, script, token) until the run ends or its process exits. A folder another
    live launch holds stops this one with one line naming it; a lock file left by a dead launch is
    reported, then taken over. A second claim from the same thread (its earlier main() has returned
    or raised) releases the earlier hold first."""
    folder.mkdir(parents=True, exist_ok=True)
    path, key = folder / LOCK, str(folder.resolve())
    if key in _HOLDS:
        if _HOLDS[key][1] != threading.get_ident():
            raise SystemExit(f"--output_dir {folder}: another run in this process writes there")
        release(folder)
    while True:
        descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            from common.run.folder_errors import held_elsewhere

            record = os.read(descriptor, 1 << 16)
            os.close(descriptor)
            raise SystemExit(held_elsewhere(folder, record)) from None
        # the lock file may have been removed between the open and the lock: lock the new one
        try:
            if os.stat(path).st_ino == os.fstat(descriptor).st_ino:
                break
        except FileNotFoundError:
            pass
        os.close(descriptor)
    left = os.read(descriptor, 1 << 16)
    if left.strip():  # the record of a launch that died holding the folder
        from common.run.folder_errors import taken_over

        log(taken_over(folder, left))
    record = {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "script": script,
        "launch": token,
        "since": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    os.ftruncate(descriptor, 0)
    os.pwrite(descriptor, json.dumps(record).encode(), 0)
    # the other machines read the token from a shared filesystem while this file stays open
    os.fsync(descriptor)
    _HOLDS[key] = (descriptor, threading.get_ident(), path)


def lost_hold(folder: Path) -> str | None:
    """Before a write that removes or replaces files in `folder`: None while its `.run.lock` is the
    file this launch locked, else one line saying so (a folder cleared by hand, then taken by
    another launch). Unheld folders pass."""
    descriptor, _, path = _HOLDS.get(str(folder.resolve()), (None, None, None))
    if descriptor is None:
        return None
    try:
        inode, now = os.stat(path).st_ino, path.read_bytes()
    except OSError:  # removed, or its folder gone
        inode, now = None, b""
    if inode == os.fstat(descriptor).st_ino:
        return None
    from common.run.folder_errors import no_longer_held

    return no_longer_held(folder, path, now)


def release(folder: Path) -> None:
    """Give up this process's hold on `folder` (its lock file goes, then the lock)."""
    _release(str(folder.resolve()))


def defer_writes(folder: Path, files: dict[Path, str]) -> None:
    """Write `files` (path: text) at `write_deferred(folder)`, not now: a resume records its flags
    only once its checkpoint has loaded, so that a resume that fails leaves every file as it was."""
    _DEFERRED[str(folder.resolve())] = files


def write_deferred(folder: Path) -> None:
    """The run has started writing in `folder` (common/run/logs.py `MetricsLogger`): the deferred
    records go now."""
    for path, text in _DEFERRED.pop(str(Path(folder).resolve()), {}).items():
        path.write_text(text)


def _release(key: str) -> None:
    _DEFERRED.pop(key, None)
    descriptor, _, path = _HOLDS.pop(key, (None, None, None))
    if descriptor is not None:
        try:  # never another launch's lock file, made after this one's was removed
            if os.stat(path).st_ino == os.fstat(descriptor).st_ino:
                path.unlink()
        except OSError:
            pass
        os.close(descriptor)


def release_all(every_thread: bool = False) -> None:
    """The holds this thread took (a run's end), or at exit every hold this process still has."""
    for key, (_, thread, _) in list(_HOLDS.items()):
        if every_thread or thread == threading.get_ident():
            _release(key)


# a run that stopped with one line: its process exits
atexit.register(release_all, every_thread=True)
