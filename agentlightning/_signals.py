"""SIGTERM and SIGHUP stop a long-running command the way Ctrl-C does.

A process manager (systemd, Kubernetes, a CI runner, ``kill PID``) stops a job with SIGTERM; a closed terminal sends
SIGHUP; and a job a script or CI backgrounds starts with SIGINT ignored. Inside :func:`stop_like_ctrl_c`, SIGTERM
and SIGHUP raise :class:`Stopped` (a ``KeyboardInterrupt``) in the main thread, so every ``finally``, ``with`` and
``except KeyboardInterrupt`` that cleans up after Ctrl-C runs for them too. While that clean-up runs, the same
signals again are logged and ignored: cut short, it would leave behind what it is stopping.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

logger = logging.getLogger(__name__)

STOP_SIGNALS: tuple[signal.Signals, ...] = tuple(
    getattr(signal, name) for name in ("SIGTERM", "SIGHUP") if hasattr(signal, name)
)
"""The signals :func:`stop_like_ctrl_c` turns into :class:`Stopped` (Windows has no SIGHUP)."""


class Stopped(KeyboardInterrupt):
    """Raised in the main thread by a signal of :data:`STOP_SIGNALS`; ``signum`` says which."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"stopped by {signal.Signals(signum).name}")
        self.signum = signum

    @property
    def exit_code(self) -> int:
        """The shell's code for a process ended by this signal: 128 + its number."""
        return 128 + self.signum


@contextmanager
def stop_like_ctrl_c(what: str) -> Iterator[None]:
    """Inside the block, SIGTERM and SIGHUP raise :class:`Stopped` in the main thread (``what`` names the job in the
    log line). A signal whose handler is not the default one (ignored under ``nohup``, or the application's own) is
    left alone, and so is a block entered outside the main thread. The handlers before are restored on exit."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    stopping = threading.Event()

    def stop(signum: int, _frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if stopping.is_set():
            logger.warning("%s: %s again; still stopping what it started", what, name)
            return
        stopping.set()
        logger.warning("%s: %s; stopping what it started, as Ctrl-C does", what, name)
        raise Stopped(signum)

    previous = {sig: signal.signal(sig, stop) for sig in STOP_SIGNALS if signal.getsignal(sig) is signal.SIG_DFL}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
