"""Errors a user can act on. The CLI prints their message on one line and exits with code 2."""


class RlbenchError(Exception):
    """Base class for errors caused by input or environment, not by a bug."""


class UnknownComponentError(RlbenchError, KeyError):
    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


class UnavailableComponentError(RlbenchError):
    pass


class InvalidCombinationError(RlbenchError):
    pass
