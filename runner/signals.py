"""SIGINT (Ctrl-C) and SIGTERM (what SLURM and Kubernetes send before they kill a job) for the life of a run.

`with Interrupts() as sig:` installs one handler for both; what a signal does depends on the run's phase:

- "raise" (loading, decoding): Interrupted(name) at once, wherever the main thread is. Decoding catches it and
  keeps what finished (its answers are on disk as they finish; its metrics are written with `finished: false`).
- "defer" (a training loop, the final writes of any run): only `signame` is set and a line says what happens
  next; the code looks at it at its next safe point (the training loop between steps, every process of a
  torchrun job at the same one). A second SIGINT then raises KeyboardInterrupt at once, the way out of a stuck
  step; a second SIGTERM is ignored (SIGKILL follows it anyway).

Python runs signal handlers in the main thread between bytecodes, so a handler never interrupts a tensor
operation half-way. Outside the main thread (where signal.signal is refused) nothing is installed, and a signal
the process ignores stays ignored.
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


class Interrupts(contextlib.AbstractContextManager):
    """The run's SIGINT/SIGTERM handler (see the module docstring); it starts in the "raise" phase."""

    def __init__(self):
        self.signame: str | None = None  # the first signal that came
        self.deferring, self.note = False, ""
        self._before: dict = {}

    @property
    def signum(self) -> int:
        """The first signal's number, 0 while none came."""
        return signal.Signals[self.signame].value if self.signame else 0

    def defer(self, note: str) -> None:
        """From now on a signal is only recorded, and `note` (what happens next) logged."""
        self.deferring, self.note = True, note

    def __enter__(self) -> "Interrupts":
        if threading.current_thread() is threading.main_thread():
            # a signal the process was started with ignored (a background job of a script: SIGINT) stays ignored,
            # as Python's own default does
            self._before = {s: signal.signal(s, self._handle) for s in SIGNALS
                            if signal.getsignal(s) is not signal.SIG_IGN}
        return self

    def __exit__(self, *exc) -> None:
        for s, h in self._before.items():
            signal.signal(s, h)
        self._before = {}

    def _handle(self, signum, frame) -> None:
        name = signal.Signals(signum).name
        if not self.deferring:
            # once: what runs after this (the results being written) is not cut short by a second signal
            self.signame, self.deferring, self.note = name, True, "already stopping"
            raise Interrupted(name)
        if self.signame is not None:
            if signum == signal.SIGINT:
                raise KeyboardInterrupt
            return
        self.signame = name
        log.warning(f"{name}: {self.note}")
