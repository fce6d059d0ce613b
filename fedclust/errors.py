"""Errors a user can act on: each names the field, the bad value and the fix."""

from __future__ import annotations


class FedclustError(Exception):
    """Base class of every error fedclust raises on purpose."""


class ConfigError(FedclustError):
    """A config field has a bad value.  The message names field, value and fix."""

    def __init__(self, field: str, value: object, fix: str):
        self.field, self.value, self.fix = field, value, fix
        super().__init__(f"config field '{field}' = {value!r}: {fix}")


class DataError(FedclustError):
    """A data set is missing or too small for the asked split."""


class DivergenceError(FedclustError):
    """Training produced a non-finite loss."""

    def __init__(self, round_: int, clients: list[int]):
        self.round, self.clients = round_, clients
        shown = ", ".join(str(c) for c in clients[:20]) + (" ..." if len(clients) > 20 else "")
        super().__init__(
            f"training diverged in round {round_}: non-finite loss on clients [{shown}] "
            f"({len(clients)} in all). Lower 'train.lr' or check the data; "
            "metrics of earlier rounds are kept in metrics.jsonl."
        )


class CollectiveError(FedclustError):
    """A collective (all-gather) failed or timed out: another rank stopped or hangs."""


class CheckpointError(FedclustError):
    """A checkpoint cannot be written (a full or read-only disk), or none under the run directory can be used."""


class OutputError(FedclustError):
    """A file of the run directory cannot be written."""


class StartupError(FedclustError):
    """The processes of a run did not all start: a rank died or hangs before the process group formed."""
