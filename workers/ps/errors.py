"""The one exception family of the parameter-server runtime.

Every failure a user can see is a PSError whose message says what went wrong and, where the
runtime can know it, which role and index it concerns ("lost server-0 while waiting for ..."),
so that the job's log explains a failure without anyone reading a stack trace.
"""


class PSError(RuntimeError):
    """The job cannot go on; the message says why and, where known, because of whom."""


class ConfigError(PSError):
    """The environment (DMLC_*, TRAINYARD_*) does not describe a valid place in a job."""


class PeerError(PSError):
    """A peer went away, or did not answer within the timeout."""


class ProtocolError(PSError):
    """A peer sent something that breaks the kvstore's rules (e.g. uneven steps in sync mode)."""
