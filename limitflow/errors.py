"""Errors limitflow raises.

    LimitflowError                  root; ``retriable`` says whether trying again may help
    ├── RulesError                  the rules file is unusable (defined in schemas.rules)
    ├── EventRejected               an input record is not a valid event (schemas.events)
    ├── ConfigError                 a setting or URL is unusable
    ├── StoppedOpening              a stop signal came while a store was opened
    └── StoreError
        ├── StoreUnavailable        retriable: the server is down, slow or refusing
        ├── ConflictError           retriable: state changed since it was read
        ├── StoreNotInitialized     not retriable: run ``limitflow store init``
        └── StoreRejected           not retriable: the store refused the request itself
    └── BrokerError                 Kafka failed (translated in streams/, never raw aiokafka)
        ├── BrokerUnavailable       retriable: brokers down, slow or refusing
        ├── PartitionLost           not retriable here: the partition moved to another
        │                           member (fenced, commit refused); its batch is abandoned
        └── BrokerRejected          not retriable: the broker refused the request itself

Driver errors are translated into these at the adapter boundary (``raise … from exc``);
code above the adapters tests the type and ``retriable``, never the message text.
"""

from __future__ import annotations

from typing import ClassVar


class LimitflowError(Exception):
    """Root of every error limitflow raises on purpose."""

    retriable: ClassVar[bool] = False


class ConfigError(LimitflowError):
    """A setting, option or URL cannot be used."""


class StoppedOpening(LimitflowError):
    """A stop signal came while the store was being opened, in a wait for another
    process's lock: the start ends there, keeping nothing more."""


class StoreError(LimitflowError):
    """A state store failed."""


class StoreUnavailable(StoreError):
    """The store cannot be reached or timed out; the same request may succeed later."""

    retriable = True


class ConflictError(StoreError):
    """A record changed since it was read (another writer won); re-read and decide again."""

    retriable = True


class StoreNotInitialized(StoreError):
    """Tables, collections or indexes are missing: run ``limitflow store init --store URL``.

    Raised with what is missing; its text adds the hint. ``missing`` is that text alone,
    for a command that gives the hint in full (with the URL)."""

    hint: ClassVar[str] = "run `limitflow store init`"

    def __init__(self, missing: str) -> None:
        super().__init__(missing)
        self.missing = missing

    def __str__(self) -> str:
        return f"{self.missing}: {self.hint}"


class StoreRejected(StoreError):
    """The store refused a request for a reason that retrying will not fix."""


class BrokerError(LimitflowError):
    """A Kafka broker or client failed."""


class BrokerUnavailable(BrokerError):
    """Brokers cannot be reached or timed out; the same request may succeed later."""

    retriable = True


class PartitionLost(BrokerError):
    """This member no longer owns a partition: its uncommitted records go to the new owner."""


class BrokerRejected(BrokerError):
    """The broker refused a request for a reason that retrying will not fix."""
