"""SIGINT (Ctrl-C) and SIGTERM (what SLURM and Kubernetes send before they kill a job) during a run's long part.

Decoding stops at once: `raise_on_signals` turns either signal into `Interrupted`, and the run keeps what it
finished (its answers are on disk as they finish, its metrics are written with `finished: false`). Training
stops at the next step boundary: `StopRequest` only records the signal, the loop sees it between steps (every
process of a torchrun job at the same step, see training/loop.py) and checkpoints. Python runs signal handlers
in the main thread between bytecodes, so a handler never interrupts a tensor operation half-way.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading

SIGNALS = (signal.SIGINT, signal.SIGTERM)
log = logging.getLogger("eaglet")


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM arrived; `signame` says which ("SIGINT", "SIGTERM")."""

    def __init__(self, signame: str):
        super().__init__(signame)
        self.signame = signame


def exit_code(signame: str) -> int:
    """The shell's status for a process ended by this signal (130 for SIGINT, 143 for SIGTERM)."""
    return 128 + signal.Signals[signame].value


def _installable() -> bool:
    return threading.current_thread() is threading.main_thread()  # signal.signal works only there


@contextlib.contextmanager
def raise_on_signals():
    """Inside: SIGINT and SIGTERM raise Interrupted(name) wherever the main thread is."""
    if not _installable():
        yield
        return

    def handler(signum, frame):
        raise Interrupted(signal.Signals(signum).name)

    before = {s: signal.signal(s, handler) for s in SIGNALS}
    try:
        yield
    finally:
        for s, h in before.items():
            signal.signal(s, h)


class StopRequest(contextlib.AbstractContextManager):
    """Inside `with StopRequest() as stop:`, SIGINT and SIGTERM set `stop.signame` and nothing else; the loop
    stops at its next check. A second SIGINT raises KeyboardInterrupt at once (no checkpoint)."""

    def __init__(self):
        self.signame: str | None = None
        self._before: dict = {}

    def __enter__(self) -> "StopRequest":
        if _installable():
            self._before = {s: signal.signal(s, self._handle) for s in SIGNALS}
        return self

    @property
    def signum(self) -> int:
        """The signal's number, 0 while none came."""
        return signal.Signals[self.signame].value if self.signame else 0

    def __exit__(self, *exc) -> None:
        for s, h in self._before.items():
            signal.signal(s, h)
        self._before = {}

    def _handle(self, signum, frame) -> None:
        name = signal.Signals(signum).name
        if self.signame is not None:
            if signum == signal.SIGINT:
                raise KeyboardInterrupt
            return
        self.signame = name
        log.warning(f"{name}: stopping after this step, with a checkpoint (Ctrl-C again stops at once, without one)")
