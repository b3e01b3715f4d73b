"""One error hierarchy for the whole domain.

Every message here is safe to show to a client: it names the problem (a column,
a row, a party, a parameter) but never carries a share, a key or engine output.
The services map these classes once to gRPC status codes and problem details.
"""

from __future__ import annotations


class PpfsError(Exception):
    """Base of every error ppfs raises on purpose."""


class InputDataError(PpfsError):
    """The data a data owner supplied cannot be used (bad CSV, NaN, ...)."""


class ParameterError(PpfsError):
    """A job parameter is out of range or inconsistent (k, label, security, ...)."""


class ShareFormatError(PpfsError):
    """A share bundle is malformed, truncated or fails its checksum."""


class EngineUnavailableError(PpfsError):
    """The requested MPC engine is not installed or not usable here."""


class EngineError(PpfsError):
    """An MPC run failed. ``party`` names the failing party when known. ``waited``: how
    long this party's engine had been waiting (neither computing nor printing) when the
    run stopped, as its stall watch saw it (:mod:`ppfs.engines.stall`); None where no
    watch ran (its limit off, or no ``/proc``)."""

    def __init__(self, message: str, party: str | None = None,
                 waited: float | None = None) -> None:
        super().__init__(message)
        self.party = party
        self.waited = waited


class IntegrityError(EngineError):
    """The input checks of an active setting failed: a server input something other
    than the share components it holds (altered data).

    Raised before anything is revealed.
    """


class PeerLostError(EngineError):
    """An MPC run stopped because another party went away first (a symptom)."""


class TimedOutError(EngineError):
    """An MPC run exceeded its time limit."""


class StalledError(TimedOutError):
    """An MPC run made no progress for its stall limit: no party it watched computed or
    printed, as when a peer stops answering (its engine frozen, or its connection cut
    off without closing). ``party`` names the stopped party only where the engine sees
    it stopped (every party on one machine); a party daemon sees its own process only
    and names nobody."""


class SessionMismatchError(EngineError):
    """The engine's peers input another job's session tag: they run another job.

    Raised before any data is input.
    """


class RangeAbortError(EngineError):
    """A secure run stopped because a value left the range its fixed-point encoding
    carries (Step 2B's range checks). Only that one public bit was revealed."""
