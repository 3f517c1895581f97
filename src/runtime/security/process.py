"""The keys of this process: set once where the process starts, used by every runtime it makes.

A node, a master, a worker and the CLI each call :func:`install` (or :func:`install_from_env`,
in children a node starts) before they make a runtime; ``process_runtime`` then builds every
transport of the process on those keys. A node writes the keys it loaded to a file of its own
(:func:`hand_down`, ``snapshot``) and passes its path, and its keys directory, to its children
in the environment (``TROUPE_KEYS_SNAPSHOT``, ``TROUPE_KEYS``, see :func:`child_env_entry`):
they load the node's keys, not the directory as it is at their start. Loading the same
directory again returns the same keys, so a node and a master sharing one process share one
authenticator.
"""

from __future__ import annotations

import os
from pathlib import Path

from troupe.runtime.library_logging import get_logger

from .keys import CLUSTER, CurveKeys, check_curve, load_keys, not_own
from .snapshot import read_snapshot, write_snapshot

__all__ = [
    "KEYS_ENV",
    "SNAPSHOT_ENV",
    "child_env_entry",
    "hand_down",
    "install",
    "install_from_env",
    "installed",
    "keys_for",
    "security_status",
    "warn_if_insecure",
    "warn_if_not_own",
    "warn_of_unnamed_keys",
    "withdraw",
]

log = get_logger(__name__)

KEYS_ENV = "TROUPE_KEYS"
SNAPSHOT_ENV = "TROUPE_KEYS_SNAPSHOT"

_installed: list[CurveKeys | None] = [None]
_loaded: dict[tuple[str, str | None], CurveKeys] = {}
# The keys this process's children load, and the file that holds them (:func:`hand_down`).
_snapshot: list[tuple[CurveKeys, Path] | None] = [None]


def keys_for(directory: str | os.PathLike[str], identity: str | None = CLUSTER) -> CurveKeys:
    """:func:`load_keys`, once per directory and identity in this process (checks CURVE first).

    Raises:
        ConfigError: libzmq lacks CURVE, or the keys cannot be loaded (one line).
    """
    check_curve()
    key = (os.path.realpath(directory), identity)
    keys = _loaded.get(key)
    if keys is None:
        keys = _loaded[key] = load_keys(Path(directory), identity)
    return keys


def install(keys: CurveKeys | None) -> None:
    """Make ``keys`` the process's keys (None: no CURVE, as without ``--keys``)."""
    _installed[0] = keys


def installed() -> CurveKeys | None:
    """The process's keys, or None."""
    return _installed[0]


def install_from_env() -> CurveKeys | None:
    """In a child of a node: install the node's keys from ``$TROUPE_KEYS_SNAPSHOT``, else the
    cluster keys from ``$TROUPE_KEYS`` (a node that could not write its snapshot), if set.

    Raises:
        ConfigError: as :func:`keys_for` and :func:`~.snapshot.read_snapshot`.
    """
    snapshot = os.environ.get(SNAPSHOT_ENV)
    directory = os.environ.get(KEYS_ENV)
    if snapshot:
        handed = read_snapshot(Path(snapshot))
        _snapshot[0] = (handed, Path(snapshot))  # handed on as it came, to a child of this one
        install(handed)
        return handed
    keys = keys_for(directory) if directory else None
    install(keys)
    return keys


def hand_down(path: Path) -> None:
    """In a node, once its keys are installed: write them to ``path`` for the children it
    starts from now on (nothing without keys). Where it cannot be written, said in the log,
    the children load the keys directory at their start, as they did before snapshots."""
    keys = installed()
    if keys is None:
        return
    try:
        write_snapshot(keys, path)
    except OSError as exc:
        log.warning(
            "keys_snapshot_not_written",
            path=str(path),
            error=str(exc),
            message=(
                "each worker loads the keys directory at its own start instead: an edit of it "
                "reaches a worker at its next restart, and the node only at its own"
            ),
        )
        return
    _snapshot[0] = (keys, path)


def withdraw(path: Path) -> None:
    """In a node, as it stops: remove the snapshot :func:`hand_down` wrote to ``path``."""
    if _snapshot[0] is not None and _snapshot[0][1] == path:
        _snapshot[0] = None
    try:
        path.unlink(missing_ok=True)
    except OSError:  # a folder that went read-only: the next node of this name removes it
        pass


def child_env_entry() -> dict[str, str]:
    """What a child's environment needs for the child to use this process's cluster keys
    (empty without keys; the caller removes an inherited ``TROUPE_KEYS`` and
    ``TROUPE_KEYS_SNAPSHOT`` then)."""
    keys = installed()
    if keys is None:
        return {}
    entry = {KEYS_ENV: str(Path(keys.directory).resolve())}
    handed = _snapshot[0]
    if handed is not None and handed[0] is keys:  # keys installed since are not the file's
        entry[SNAPSHOT_ENV] = str(handed[1].resolve())
    return entry


def security_status(insecure: bool) -> dict[str, object]:
    """The ``security`` section of a status reply: CURVE on or off, whose key this process
    presents, peers refused so far, and ``insecure`` (listening without keys by override)."""
    from .auth import incomplete_handshakes, refused_peers  # loads pyzmq's auth thread module

    keys = installed()
    return {
        "curve": keys is not None,
        "user": keys.user_id if keys is not None else None,
        "insecure": insecure and keys is None,
        "refused_peers": refused_peers(),
        "incomplete_handshakes": incomplete_handshakes(),
    }


def warn_if_insecure(endpoint: str, insecure: bool) -> None:
    """Say loudly, once at start, that this process listens without keys by ``--insecure``."""
    if insecure and installed() is None:
        log.warning(
            "insecure",
            endpoint=endpoint,
            message=(
                "--insecure: listening without CURVE keys; anyone who can reach this endpoint "
                "can send any message, stop the cluster, or read what it sends; use --keys DIR"
            ),
        )


def warn_if_not_own() -> None:
    """Say once at start, in one line, where this process's keys are not its user's alone
    (:func:`~.keys.not_own`): whoever owns or writes them holds the cluster."""
    keys = installed()
    problem = not_own(keys) if keys is not None else None
    if problem is not None:
        log.warning(
            "keys_not_own",
            keys=str(keys.directory) if keys is not None else None,
            message=(
                f"{problem}: whoever owns or writes them decides who may control this cluster; "
                "use a keys directory that only this user owns and writes (chown, chmod 700)"
            ),
        )


def warn_of_unnamed_keys() -> None:
    """Say once at start which public keys of this process's directory give no role by their
    name (``operator_alice.key``): they are not authorised, and their holder, refused, was told
    to put there the key that is there already (report ak 4)."""
    keys = installed()
    if keys is not None and keys.unnamed:
        log.warning(
            "keys_unnamed",
            keys=str(keys.directory),
            files=list(keys.unnamed),
            message=(
                f"{', '.join(keys.unnamed)} in {keys.directory}: not authorised, the name gives no "
                "role; name an operator's public key operator-NAME.key, a reader's reader-NAME.key "
                "(NAME: letters, digits, '_' and '.'), then restart"
            ),
        )
