"""Typed errors a caller can cause. Services map them to gRPC / HTTP status in one place
each (verifier_svc/status.py, gateway/errors.py); our own invariants use `assert`."""

from __future__ import annotations


class DDTreeError(Exception):
    """Base class of every error the library raises on purpose."""


class InvalidArgumentError(DDTreeError, ValueError):
    """A request argument is out of range or malformed (-> INVALID_ARGUMENT / HTTP 400)."""


class TreeValidationError(InvalidArgumentError):
    """A draft tree from outside breaks an invariant (parent order, shape, dtype, size)."""


class CheckpointError(DDTreeError):
    """A checkpoint directory is missing files, has a corrupt file or an unsupported config."""


class IncompatibleModelsError(DDTreeError):
    """The drafter and the target do not fit together (hidden size, vocab, layer ids)."""


class CapacityError(DDTreeError):
    """No room: the KV cache or the session table is full (-> RESOURCE_EXHAUSTED / 429)."""


class SessionNotFoundError(DDTreeError, KeyError):
    """An unknown or already closed session / request id (-> NOT_FOUND / 404)."""
