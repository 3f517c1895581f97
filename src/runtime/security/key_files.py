"""Writing a new CURVE key pair's files, never through a link.

``troupe keys generate`` wrote with pyzmq's ``create_certificates``, which opens its files as
``open(path, 'w')`` does: it follows a symbolic link at the file's name and truncates what it
points to, and the ``chmod`` after it changed the link's target too. In a folder other users
may write (a lab's shared one, ``/tmp``), one of them could plant ``cluster.key_secret ->
/somewhere`` and have the cluster's secret written where they read it, or a file of the user's
overwritten (report kl 3). Each file is created here with ``O_CREAT | O_EXCL | O_NOFOLLOW``:
a name taken by anything, a link above all, fails the open, and nothing is followed.

The files are pyzmq's certificate format (``zmq.auth.load_certificate`` reads them).
"""

from __future__ import annotations

import datetime
import errno
import os
from pathlib import Path

import zmq

__all__ = ["in_the_way", "planted_link", "write_pair"]

_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_TAKEN = (errno.EEXIST, errno.ELOOP)  # ELOOP: O_NOFOLLOW's refusal, where O_EXCL did not come first

_PUBLIC_BANNER = """#   ****  Generated on {0} by troupe keys generate  ****
#   ZeroMQ CURVE Public Certificate
#   Hand it to the cluster's hosts (and the servers' cluster.key to every operator).

"""
_SECRET_BANNER = """#   ****  Generated on {0} by troupe keys generate  ****
#   ZeroMQ CURVE **Secret** Certificate
#   DO NOT PROVIDE THIS FILE TO OTHER USERS nor change its permissions.

"""


def write_pair(directory: Path, name: str, created: list[Path]) -> Path:
    """Write a new pair ``name`` into ``directory``: ``NAME.key`` (mode 0644) and
    ``NAME.key_secret`` (0600, never more readable, not even briefly); each file is appended
    to ``created`` once it exists, so that a failure part-way removes only this call's files.

    Returns:
        The secret key file.

    Raises:
        OSError: a file could not be written; ``EEXIST`` or ``ELOOP`` where its name is taken
            (a link planted there: see :func:`in_the_way`).
    """
    public, secret = zmq.curve_keypair()
    now = datetime.datetime.now()
    public_file, secret_file = directory / f"{name}.key", directory / f"{name}.key_secret"
    _create(public_file, _PUBLIC_BANNER.format(now) + _curve(public), 0o644, created)
    _create(secret_file, _SECRET_BANNER.format(now) + _curve(public, secret), 0o600, created)
    return secret_file


def planted_link(path: Path, directory: Path) -> str:
    """Why a new key file is not written at ``path``, a symbolic link: where it points, and that
    it is not followed, nor removed (someone put it there)."""
    return (
        f"keys {directory}: {path.name} is a symbolic link (to {os.readlink(path)}), which a key "
        f"file is never written through; remove it (who may write {directory.absolute()} could "
        "have put it there: keys belong in a directory of your own), then generate again"
    )


def in_the_way(exc: OSError, directory: Path) -> str | None:
    """Why the open that raised ``exc`` found its file's name taken (a link planted there, or a
    file made meanwhile), or None where it failed otherwise."""
    if exc.errno not in _TAKEN or exc.filename is None:
        return None
    path = Path(exc.filename)
    if path.is_symlink():
        return planted_link(path, directory)
    return (
        f"keys {directory}: {path.name} appeared while the keys were written (another `troupe keys "
        "generate` there?); it is not overwritten: generate again once it is done"
    )


def _curve(public: bytes, secret: bytes | None = None) -> str:
    lines = ["metadata", "curve", f'    public-key = "{public.decode()}"']
    if secret is not None:
        lines.append(f'    secret-key = "{secret.decode()}"')
    return "\n".join(lines) + "\n"


def _create(path: Path, text: str, mode: int, created: list[Path]) -> None:
    fd = os.open(path, _CREATE, mode)  # created with mode & ~umask: the secret never wider
    created.append(path)
    with os.fdopen(fd, "w", encoding="ascii") as f:
        os.fchmod(f.fileno(), mode)  # the descriptor's file: no name to follow
        f.write(text)
