"""The keys of this process: set once where the process starts, used by every runtime it makes.

A node, a master, a worker and the CLI each call :func:`install` (or :func:`install_from_env`,
in children a node starts) before they make a runtime; ``process_runtime`` then builds every
transport of the process on those keys. A node passes its keys directory to its children in the
environment (``TROUPE_KEYS``, see :func:`child_env_entry`). Loading the same directory again
returns the same keys, so a node and a master sharing one process share one authenticator.
"""

from __future__ import annotations

import os
from pathlib import Path

from troupe.runtime.library_logging import get_logger

from .keys import CLUSTER, CurveKeys, check_curve, load_keys, not_own

__all__ = [
    "KEYS_ENV",
    "child_env_entry",
    "install",
    "install_from_env",
    "installed",
    "keys_for",
    "security_status",
    "warn_if_insecure",
    "warn_if_not_own",
]

log = get_logger(__name__)

KEYS_ENV = "TROUPE_KEYS"

_installed: list[CurveKeys | None] = [None]
_loaded: dict[tuple[str, str | None], CurveKeys] = {}


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
    """In a child of a node: install the cluster keys from ``$TROUPE_KEYS``, if set.

    Raises:
        ConfigError: as :func:`keys_for`.
    """
    directory = os.environ.get(KEYS_ENV)
    keys = keys_for(directory) if directory else None
    install(keys)
    return keys


def child_env_entry() -> dict[str, str]:
    """What a child's environment needs for the child to use this process's cluster keys
    (empty without keys; the caller removes an inherited ``TROUPE_KEYS`` then)."""
    keys = installed()
    if keys is None:
        return {}
    return {KEYS_ENV: str(Path(keys.directory).resolve())}


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
