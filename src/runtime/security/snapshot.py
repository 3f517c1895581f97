"""The keys a node loaded at its start, handed to the processes it starts for its whole life.

A keys directory may change under a running node (a key revoked or added, a new cluster pair
staged before the maintenance window). Each worker read the directory at its own start, so a
node served the set of its start and a worker restarted since the new one: a revoked key still
ran the node's controls while restarted workers refused it, and a staged cluster pair left a
restarted worker unable to register with its own node, failed for good (report ak 1). A node
now writes what it loaded into a file of its own (mode 0600, beside its log), and its children
load that: every process of a node has the keys of the node's start, and an edit takes effect
at the node's restart. The file holds secrets: it is neither passed in the environment nor on a
command line (only its path is), and it is read only if this user alone may read it.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

from troupe.runtime.errors import ConfigError

from .keys import CurveKeys

__all__ = ["read_snapshot", "write_snapshot"]


def write_snapshot(keys: CurveKeys, path: Path) -> None:
    """Write ``keys`` to ``path`` anew (mode 0600 from the start, replaced whole).

    Raises:
        OSError: it could not be written (nothing is left half-written).
    """
    data = {
        "directory": str(keys.directory),
        "name": keys.name,
        "public": keys.public.decode(),
        "secret": keys.secret.decode(),
        "server_public": keys.server_public.decode(),
        "authorised": [[key.decode(), user] for key, user in keys.authorised.items()],
        "cluster_secret": keys.cluster_secret.decode() if keys.cluster_secret is not None else None,
    }
    tmp = path.with_name(f"{path.name}.tmp")
    tmp.unlink(missing_ok=True)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        with os.fdopen(os.open(tmp, flags, 0o600), "w", encoding="utf-8") as file:
            json.dump(data, file)
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)
        raise


def read_snapshot(path: Path) -> CurveKeys:
    """The keys :func:`write_snapshot` wrote to ``path``.

    Raises:
        ConfigError: it is gone, another user's, readable by others, or not a snapshot; one
            line, naming it.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise ConfigError(
            f"keys snapshot {path}: cannot read it ({exc.strerror}); the node that started this "
            "process writes it beside its log as it starts: restart the node"
        ) from None
    with os.fdopen(fd, encoding="utf-8") as file:
        st = os.fstat(fd)
        if st.st_uid != os.geteuid() or stat.S_IMODE(st.st_mode) & 0o077:
            raise ConfigError(
                f"keys snapshot {path}: not this user's alone (owner uid {st.st_uid}, mode "
                f"{stat.S_IMODE(st.st_mode):04o}); it is not used: restart the node"
            )
        try:
            data = json.load(file)
            cluster_secret = data["cluster_secret"]
            return CurveKeys(
                Path(data["directory"]),
                str(data["name"]),
                data["public"].encode(),
                data["secret"].encode(),
                data["server_public"].encode(),
                {key.encode(): str(user) for key, user in data["authorised"]},
                cluster_secret.encode() if cluster_secret is not None else None,
            )
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            said = f"keys snapshot {path}: not a keys snapshot ({exc!r}); restart the node"
            raise ConfigError(said) from None
