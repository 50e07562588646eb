"""One server per store file: an exclusive ``flock`` on a lock file beside the store (``store.db.lock``) that names
the process holding it. The kernel drops the lock when that process ends, however it ends (``kill -9`` included), so
a lock file left behind never blocks a restart."""

from __future__ import annotations

import fcntl
import os
import socket

from agentlightning.errors import StoreInUse


class StoreLock:
    """Holds ``{store_path}.lock`` exclusively until :meth:`release` (or the process ends); raises
    :class:`StoreInUse`, naming the holder's pid, when another holds it."""

    def __init__(self, store_path: str) -> None:
        self.path = f"{store_path}.lock"
        self._fd: int | None = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(self._fd, 200, 0).decode(errors="replace").strip() or "unknown"
            self.release()
            raise StoreInUse(
                f"the store {store_path} is in use by another Lightning Server ({holder}); two servers on one "
                "store would lease and expire each other's rollouts. Stop that server, or give this one another "
                "store (agl server --store)"
            ) from None
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode(), 0)

    def release(self) -> None:
        """Let another server open the store (idempotent). The lock file stays: an unlocked one means nothing."""
        if self._fd is not None:
            os.close(self._fd)  # closing the last descriptor drops the flock
            self._fd = None
