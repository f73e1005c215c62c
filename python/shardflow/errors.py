"""The exceptions shardflow raises.

Every one derives from :class:`ShardflowError`; where callers expect a built-in
exception, it derives from that too (``except FileNotFoundError`` catches a missing
shard). Errors about data carry ``url`` (the file or URL) and ``position`` (e.g.
``"line 7"``, ``"row group 3"``, ``"byte 1024"``) when known. Messages and ``url``
show URLs with their user info and secret query values (signatures, tokens, keys,
credentials) masked as ``***``.
"""

from __future__ import annotations


class ShardflowError(Exception):
    """Base class of every shardflow error."""

    url: str | None = None
    position: str | None = None


class NotFoundError(ShardflowError, FileNotFoundError):
    """A file, object or pattern that does not exist or matches nothing."""


class AccessDeniedError(ShardflowError, PermissionError):
    """Reading was refused."""


class InvalidArgumentError(ShardflowError, ValueError):
    """A bad argument to a shardflow function."""


class ReadError(ShardflowError, OSError):
    """An I/O failure while reading."""


class WriteError(ShardflowError, OSError):
    """An I/O failure while writing shards or their manifest."""


class AlreadyExistsError(ShardflowError, FileExistsError):
    """A write destination that already holds files (``overwrite=True`` replaces them)."""


class DecodeError(ShardflowError):
    """Bytes that are not valid data of the expected format."""


class TemplateError(ShardflowError, ValueError):
    """A row a chat template or tokenizer cannot turn into tokens: no list of messages,
    content of the wrong type, or the template's own ``raise_exception``. The message
    names the row."""


class SchemaError(ShardflowError):
    """Valid data whose columns do not fit the dataset's schema."""


class InternalError(ShardflowError):
    """A bug in shardflow (please report it), including a caught decoder panic."""


__all__ = [
    "AccessDeniedError",
    "AlreadyExistsError",
    "DecodeError",
    "InternalError",
    "InvalidArgumentError",
    "NotFoundError",
    "ReadError",
    "SchemaError",
    "ShardflowError",
    "TemplateError",
    "WriteError",
]
