"""Errors a user can act on. The CLI prints their message on one line and exits with code 2; a stop
signal's interruption exits 128 + its number."""

import signal


class RlbenchError(Exception):
    """Base class for errors caused by input or environment, not by a bug."""


class UnknownComponentError(RlbenchError, KeyError):
    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


class UnavailableComponentError(RlbenchError):
    pass


class InvalidCombinationError(RlbenchError):
    pass


STOP_SIGNALS = {signal.SIGINT: "interrupted (Ctrl-C)", signal.SIGTERM: "stopped by SIGTERM",
                signal.SIGHUP: "stopped by SIGHUP"}  # schedulers (Slurm, Kubernetes, Ray) stop jobs with SIGTERM


class SignalInterrupt(KeyboardInterrupt):
    """A second stop signal: the run is interrupted at once, and `rlbench run` exits 128 + `signum`
    (143 for SIGTERM), as it does when the first one stops the run in order. Also raised after a
    run of a series that a first signal stopped (`stop_series_if_signalled`), with that `why`."""

    def __init__(self, signum: int, why: str = "a second time: stopped at once") -> None:
        super().__init__(signum)
        self.signum = signum
        self.why = why

    def __str__(self) -> str:
        return f"{STOP_SIGNALS[self.signum]}, {self.why}"
