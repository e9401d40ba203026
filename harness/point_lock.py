"""One lock per configuration point, so that concurrent sweeps into one directory compute each
point once.

The lock is ``JOB_DIR/.point.lock``, held with ``fcntl.lockf`` (a POSIX record lock, which NFS
honours across hosts) for as long as the point runs. A second process that finds it held does not
wait: it skips the point (a log line says so) and goes on with the next; the holder writes the
result. The kernel releases the lock when its holder exits, however it exits (``kill -9``
included), so a lock file left behind by a crash never blocks a later sweep. Within one process
locks do not exclude each other (POSIX semantics); one process runs its points in sequence.
"""
from __future__ import annotations

import fcntl
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

LOCK_FILE = ".point.lock"


@contextmanager
def point_lock(job_dir: str | os.PathLike) -> Iterator[bool]:
    """Tries to take the lock of the point in ``job_dir`` without waiting; yields whether this
    process holds it (False: another process is running the point) and releases it on exit."""
    path = Path(job_dir) / LOCK_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # EAGAIN / EACCES: held by another process
            yield False
            return
        try:
            yield True
        finally:
            fcntl.lockf(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def is_locked(job_dir: str | os.PathLike) -> bool:
    """Whether another process holds the lock of the point in ``job_dir`` now (a sweep's summary
    counts such points as running elsewhere)."""
    if not (Path(job_dir) / LOCK_FILE).exists():
        return False
    with point_lock(job_dir) as held:
        return not held
