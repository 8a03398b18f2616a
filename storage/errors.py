"""Every error the storage layer raises: one sentence a person can act on, never a traceback."""

from __future__ import annotations

import errno

NO_SPACE = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})
READ_ONLY = frozenset({errno.EROFS, errno.EACCES, errno.EPERM})


class StorageError(RuntimeError):
    pass


class StorageFullError(StorageError):
    """The disk (or a file-size limit) has no room left for a write."""


class KVFileError(StorageError):
    """A KV file is missing, truncated or corrupted: the cache must be recomputed."""


class ReadOnlyError(StorageError):
    """The data folder cannot be written: the library can be read and asked, not changed."""


class DatabaseError(StorageError):
    """The library's SQLite file is missing, empty or damaged while its files are there. Nothing
    was changed; `docqa repair` rebuilds it (from its backup, else from the files)."""
