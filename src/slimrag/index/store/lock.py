"""The writer lock: one writer at a time per index folder, by an OS file lock.

Why: every write reads the manifest, appends a delta part or a generation, and replaces the
manifest. Two writers working from the same manifest overwrite each other's delta part or drop
each other's parts from the manifest, and the catalog is left with chunks that have no vector.
One lock around each write operation removes the race; the writer re-reads the manifest after
taking it (see `IndexWriter`), so it never writes from a stale one.

How: ``fcntl.flock(LOCK_EX)`` on ``writer.lock`` inside the index folder. The kernel releases the
lock when the holder's file is closed or its process dies (SIGKILL included), so a crashed writer
never leaves a stale lock behind, and there is no lock file to delete or break by hand. flock
locks belong to an open file description: two `Index` handles in one process exclude each other
just as two processes do. While holding the lock, the writer writes its pid, command line, host
and start time into the file, so a waiting writer can say who holds it; the file is emptied
before release. The file itself is never deleted (deleting a lock file races with its next user).

Knob: the wait. A second writer polls for the lock (every ``POLL_S`` seconds, 0.05 s) up to its
wait, then raises `IndexBusyError` naming the holder. ``DEFAULT_WAIT_S`` (300 s) lets an add
started while another add of a few thousand files runs finish after it instead of failing; 0
fails at once. The environment variable ``SLIMRAG_WAIT`` (seconds) overrides the default for a
whole process, e.g. for the CLI verbs; `Index(wait=...)`, ``Index.lock_wait`` and ``slimrag check
--wait`` set it per index.

Readers (search) never take the lock: the files a manifest names are immutable and the catalog is
in WAL mode, so a search sees the state before or after a write, never half of it.

Cost: uncontended, one ``open`` + ``flock`` + a 100-byte write + ``close``, plus the writer's
manifest re-read: 0.56 ms per write on a 2-core machine at load 11, 0.9 % of an add of one small
document (``python -m bench.crash --lock-cost``; docs/reliability.md).

Limits: flock is advisory and local. It does not exclude writers on other hosts of a network file
system (NFS emulates it with POSIX locks on some kernels, not all); keep one writing host.
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import socket
import sys
import time
from pathlib import Path
from types import TracebackType

from slimrag.errors import SlimragError

log = logging.getLogger("slimrag.index")



class IndexBusyError(SlimragError):
    """Another writer held the index's writer lock for longer than this writer would wait. The
    message names the holder (pid, command, since when) and how to wait longer. Nothing was
    written; retrying later is safe."""


#: file name of the lock inside an index folder
LOCK_FILE = "writer.lock"
#: default seconds a writer waits for another writer to finish before `IndexBusyError`
DEFAULT_WAIT_S = 300.0
#: seconds between two attempts while waiting
POLL_S = 0.05
#: environment variable that overrides `DEFAULT_WAIT_S` for a process
WAIT_ENV = "SLIMRAG_WAIT"


def default_wait() -> float:
    """The wait of a writer when none is given: ``$SLIMRAG_WAIT`` if set, else `DEFAULT_WAIT_S`."""
    raw = os.environ.get(WAIT_ENV)
    if raw is None or raw.strip() == "":
        return DEFAULT_WAIT_S
    try:
        value = float(raw)
    except ValueError:
        raise SlimragError(f"{WAIT_ENV}={raw!r} is not a number of seconds; set it to e.g. 0 or 60") from None
    if value < 0:
        raise SlimragError(f"{WAIT_ENV}={raw!r} is negative; set it to 0 (fail at once) or more seconds")
    return value


def holder(root: Path) -> dict[str, object] | None:
    """Who holds (or last held, if it died) the lock of the index at ``root``: the JSON the
    holder wrote (pid, cmd, host, since), or None when the file is empty or unreadable."""
    try:
        text = (Path(root) / LOCK_FILE).read_text()
    except OSError:
        return None
    try:
        data = json.loads(text)
    except json.JSONDecodeError:  # empty (released) or being written this very moment
        return None
    return data if isinstance(data, dict) else None


def describe(info: dict[str, object] | None) -> str:
    """One phrase naming a holder for messages: ``pid 4242 (`slimrag add idx docs`) since 16:02:11``."""
    if not info:
        return "another writer"
    since = info.get("since")
    when = time.strftime(" since %H:%M:%S", time.localtime(float(since))) if isinstance(since, (int, float)) else ""
    host = f" on {info['host']}" if info.get("host") and info.get("host") != socket.gethostname() else ""
    return f"pid {info.get('pid')}{host} (`{info.get('cmd', '?')}`){when}"


class WriterLock:
    """The exclusive writer lock of one index folder, held from `acquire` to `release` (or over a
    ``with`` block). Not re-entrant: a second acquire of the same object is an error; nesting of
    write operations is handled by the `Index` that owns it."""

    def __init__(self, root: Path, wait: float | None = None) -> None:
        self.root = Path(root)
        self.path = self.root / LOCK_FILE
        self.wait = default_wait() if wait is None else float(wait)
        if self.wait < 0:
            raise ValueError(f"wait must be >= 0 seconds, got {wait}")
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        """True between a successful `acquire` and `release`."""
        return self._fd is not None

    def acquire(self) -> None:
        """Take the lock, waiting up to ``self.wait`` seconds (one warning names the holder while
        waiting). Raises `IndexBusyError` when the wait runs out; `OSError` when the folder is
        missing or not writable."""
        if self._fd is not None:
            raise RuntimeError(f"{self.path} is already held by this WriterLock")
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            self._take(fd)
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps({"pid": os.getpid(), "cmd": _command(), "host": socket.gethostname(),
                                      "since": time.time()}).encode(), 0)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd

    def _take(self, fd: int) -> None:
        deadline = time.monotonic() + self.wait
        warned = False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                if warned:
                    log.warning("%s: took the writer lock", self.root)
                return
            except OSError as e:
                if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    raise
            who = describe(holder(self.root))
            if time.monotonic() >= deadline:
                raise IndexBusyError(
                    f"{self.root} is being written by {who}; gave up after waiting {self.wait:g} s. "
                    f"Retry when it is done, or wait longer (--wait SECONDS, {WAIT_ENV}=SECONDS, "
                    "Index(..., wait=SECONDS))")
            if not warned:
                log.warning("%s is being written by %s; waiting up to %g s for it to finish",
                            self.root, who, self.wait)
                warned = True
            time.sleep(min(POLL_S, max(0.0, deadline - time.monotonic())))

    def release(self) -> None:
        """Empty the holder record and release the lock (closing the file releases it)."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            os.ftruncate(fd, 0)
        finally:
            os.close(fd)

    def __enter__(self) -> WriterLock:
        self.acquire()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.release()


def _command() -> str:
    """This process's command line, shortened for a message (``slimrag add idx docs``)."""
    argv = [os.path.basename(sys.argv[0]) if sys.argv else "python", *sys.argv[1:]]
    cmd = " ".join(argv)
    return cmd if len(cmd) <= 200 else cmd[:197] + "..."
