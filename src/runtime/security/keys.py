"""CURVE key pairs on disk: ``troupe keys generate`` writes them, every process loads them.

A keys directory (mode 0700) holds pyzmq certificate files (``key_files`` writes them, never
through a link): ``NAME.key`` (the public key) and ``NAME.key_secret`` (both keys, mode 0600).

- ``cluster``: the one pair of master, nodes and workers. Every mailbox (server socket) of
  those processes uses it, and every connection between them presents it.
- ``operator`` and ``operator-NAME``: people or programs allowed every control message.
- ``reader`` and ``reader-NAME``: allowed the read-only control messages only (``roles``).

The public keys in the directory (``*.key``) are the authorised set, and a key's role is its
file name's prefix. Distribution: every host gets ``cluster.key``, ``cluster.key_secret`` and
the public keys of the operators and readers; an operator gets ``cluster.key`` (the servers'
key) and their own pair.
"""

from __future__ import annotations

import errno
import hashlib
import os
import re
import stat
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import zmq
import zmq.auth

from troupe.runtime.errors import ConfigError
from troupe.runtime.file_owner import is_another_users, user_name

from .key_files import in_the_way, planted_link, write_pair

__all__ = [
    "CLUSTER",
    "OPERATOR",
    "READER",
    "CurveKeys",
    "check_curve",
    "generate_keys",
    "load_keys",
    "not_own",
    "role_of",
    "user_id",
]

CLUSTER = "cluster"
OPERATOR = "operator"
READER = "reader"
_NAME = re.compile(r"^(cluster|operator|reader)(?:-([A-Za-z0-9_.]+))?$")
_PERSON = re.compile(r"^[A-Za-z0-9_.]{1,64}$")
_Z85_KEY_LEN = 40
_NOT_PERMITTED = (errno.EACCES, errno.EPERM, errno.EROFS)
_NO_ROOM = (errno.ENOSPC, errno.EDQUOT)


def role_of(name: str) -> str | None:
    """The role a key file's name gives (``operator-alice`` -> ``operator``); None if none."""
    m = _NAME.match(name)
    if m is None or (m.group(1) == CLUSTER and m.group(2)):
        return None
    return m.group(1)


def user_id(name: str) -> str:
    """What a peer with the key ``name`` is called in logs and in its messages' ``User-Id``:
    ``cluster``, ``operator``, ``operator:alice``, ``reader:bob``."""
    role, _, person = name.partition("-")
    return f"{role}:{person}" if person else role


@dataclass(frozen=True, eq=False)
class CurveKeys:
    """The keys one process uses: its own pair, the servers' public key, the authorised set.

    Attributes:
        directory: where they were loaded from (children of a node load them again there).
        name: the pair this process presents (``cluster``, ``operator-alice``, ...).
        public: its public key (Z85).
        secret: its secret key (Z85).
        server_public: the public key every server socket presents (the cluster's, Z85).
        authorised: every authorised public key (Z85) and the user id of its holder.
        cluster_secret: the cluster's secret key where this process has it (the heartbeat MAC
            key is derived from it); None for an operator's or reader's process.
        unnamed: the ``*.key`` files of the directory whose name gives no role, left out of
            the authorised set (``alice.key``, ``operator_alice.key``): said at start.
    """

    directory: Path
    name: str
    public: bytes
    secret: bytes = field(repr=False)  # the cluster's own on a host: never printed (report ak 9)
    server_public: bytes
    authorised: Mapping[bytes, str] = field(repr=False)
    cluster_secret: bytes | None = field(default=None, repr=False)
    unnamed: tuple[str, ...] = field(default=(), repr=False)

    @property
    def role(self) -> str:
        """``cluster``, ``operator`` or ``reader``."""
        return role_of(self.name) or CLUSTER

    @property
    def user_id(self) -> str:
        """How peers see this process (``operator:alice``)."""
        return user_id(self.name)

    def heartbeat_key(self) -> bytes | None:
        """The key of the heartbeats' MAC: derived from the cluster secret, so only processes
        of the cluster can sign a beat; None without it."""
        if self.cluster_secret is None:
            return None
        return hashlib.blake2b(self.cluster_secret, digest_size=32, person=b"troupe-hb").digest()


def check_curve() -> None:
    """Refuse to start with keys when the installed libzmq cannot do CURVE.

    Raises:
        ConfigError: one line saying so and how to get a libzmq that can.
    """
    if not zmq.has("curve"):
        raise ConfigError(
            f"the installed libzmq {zmq.zmq_version()} lacks CURVE, which --keys needs; reinstall "
            "pyzmq from its wheels (pip install --force-reinstall pyzmq), which bundle a libzmq "
            "with CURVE"
        )


def generate_keys(directory: Path, operators: Iterable[str] = (), readers: Iterable[str] = ()) -> list[Path]:
    """Write new key pairs into ``directory`` (made with mode 0700 if missing).

    Without ``operators`` and ``readers``: the ``cluster``, ``operator`` and ``reader`` pairs.
    With them: ``operator-NAME`` and ``reader-NAME`` for each name given, and nothing else.
    Nothing is written unless every pair is new.

    Returns:
        The secret key files written.

    Raises:
        ConfigError: a name is not ``[A-Za-z0-9_.]``, a pair exists already, or the directory
            cannot be written; one line, naming it.
    """
    operators, readers = list(operators), list(readers)
    for option, people in (("--operator", operators), ("--reader", readers)):
        for person in people:
            if not _PERSON.match(person):
                raise ConfigError(
                    f"{option} {person!r}: use ASCII letters (a-z, A-Z), digits, '_' and '.' "
                    "(1 to 64 of them)"
                )
    names = [f"{OPERATOR}-{p}" for p in operators] + [f"{READER}-{p}" for p in readers]
    if not names:
        names = [CLUSTER, OPERATOR, READER]
    for name in names:
        for path in (directory / f"{name}.key", directory / f"{name}.key_secret"):
            if path.is_symlink():  # not followed, not even to ask whether its target exists
                raise ConfigError(planted_link(path, directory))
    taken = [
        n for n in names if (directory / f"{n}.key").exists() or (directory / f"{n}.key_secret").exists()
    ]
    if taken:
        raise ConfigError(
            f"keys {directory}: the {taken[0]} pair exists already; it is not overwritten (remove "
            f"{taken[0]}.key and {taken[0]}.key_secret first to replace it)"
        )
    made_directory = not directory.exists()
    created: list[Path] = []
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        written = [write_pair(directory, name, created) for name in names]
    except OSError as exc:
        # A pair written part-way (a full disk: an empty cluster.key) made the rerun refuse it
        # as existing: what this call created goes, and nothing else (a name taken meanwhile).
        _take_back(created, directory if made_directory else None)
        raise ConfigError(in_the_way(exc, directory) or _cannot_write(directory, exc)) from None
    return written


def _cannot_write(directory: Path, exc: OSError) -> str:
    """Why :func:`generate_keys` wrote nothing into ``directory``, and the way out: a full disk
    was the advice for every error, a directory the user may not write too."""
    if exc.errno in _NOT_PERMITTED:
        where = directory.absolute()  # "cannot write in ." names no folder
        while not where.exists() and where.parent != where:  # the folder it could not make it in
            where = where.parent
        return f"keys {directory}: cannot write in {where} ({exc.strerror}): give a directory you may write"
    room = (
        "free space on its disk (or give another directory)"
        if exc.errno in _NO_ROOM
        else "give another directory"
    )
    said = f"keys {directory}: cannot write ({exc.strerror})"
    return f"{said}; nothing was left there: {room}, then generate again"


def _cannot_read(path: Path, exc: OSError) -> str:
    try:
        owner = f"; it belongs to {user_name(path.stat().st_uid)}"
    except OSError:
        owner = ""
    return (
        f"cannot read {path} ({exc.strerror or exc}{owner}); use a keys directory of this user's "
        "own: the cluster's cluster.key and a pair of yours"
    )


def _secret_in_public(path: Path) -> str:
    """Why a public key file that holds a secret key is refused: ``NAME.key`` files are the ones
    handed out (every host and operator gets ``cluster.key``), with no mode check, so the secret
    in it went to all of them, readable by every user of each host (report ak 2)."""
    secret = path.with_name(f"{path.stem}.key_secret")
    return (
        f"public key file {path} holds a secret key ({secret.name} copied under the public name?); "
        f"{path.name} is handed out and may be read by anyone: put the public {path.name} that "
        f"`troupe keys generate` wrote there, keep the secret in {secret.name} (mode 0600) on its "
        "own host only, and make a new pair if this one was copied elsewhere"
    )


def _take_back(created: list[Path], made_directory: Path | None) -> None:
    """Remove what a failed :func:`generate_keys` wrote: the files it ``created``, and the
    directory where it made it (and it is empty)."""
    for path in created:
        try:
            path.unlink(missing_ok=True)
        except OSError:
            pass  # not there to remove, or not removable: the error says what failed
    if made_directory is not None:
        try:
            made_directory.rmdir()
        except OSError:
            pass


def load_keys(directory: Path | str, identity: str | None = CLUSTER) -> CurveKeys:
    """Load the keys of one process from ``directory``.

    Args:
        directory: a keys directory (``troupe keys generate``).
        identity: the pair to present: ``cluster`` (master, nodes, workers), a name such as
            ``operator-alice``, or None for a client's choice: the first ``operator*`` pair
            whose secret is there and this user may read (a lab's shared folder holds the
            others' too), else the first such ``reader*`` one, else ``cluster`` (where there is
            no secret this user may read, the first there is, to be refused naming its owner).

    Raises:
        ConfigError: the directory or a needed file is missing, unreadable, not a key, or a
            secret key file is readable by others; one line, naming the file.
    """
    directory = Path(directory)
    if directory.exists() and not directory.is_dir():  # DIR/cluster.key_secret, say
        raise ConfigError(
            f"keys {directory.absolute()}: is a file, not a directory; give the directory that "
            "holds the keys (`troupe keys generate DIR` made it)"
        )
    if not directory.is_dir():
        raise ConfigError(
            f"keys {directory.absolute()}: no such directory (a typo?); give the cluster's keys "
            "directory: the one `troupe keys generate` made on its first host, or a copy of it (a "
            "directory made anew holds another cluster's keys, which this cluster refuses)"
        )
    publics: dict[str, bytes] = {}
    unnamed: list[str] = []
    for path in sorted(directory.glob("*.key")):
        if role_of(path.stem) is not None:
            publics[path.stem] = _read(path)[0]
        else:
            unnamed.append(path.name)
    if CLUSTER not in publics:
        raise ConfigError(
            f"keys {directory}: no cluster.key; copy it from the directory `troupe keys generate` made"
        )
    name = identity or _client_identity(directory)
    if identity is None and name == CLUSTER and not (directory / f"{CLUSTER}.key_secret").exists():
        raise ConfigError(_no_pair_of_yours(directory))
    own_public, own_secret = _read(directory / f"{name}.key_secret", secret=True)
    if publics.get(name, own_public) != own_public:  # one file of a rotation's two replaced (report ak 13)
        raise ConfigError(
            f"keys {directory}: {name}.key is not the public key of {name}.key_secret (a pair "
            "replaced half-way?); put back both files of one pair, as `troupe keys generate` wrote them"
        )
    cluster_secret = own_secret if name == CLUSTER else None
    authorised = {key: user_id(n) for n, key in publics.items()}
    authorised.setdefault(own_public, user_id(name))
    return CurveKeys(
        directory, name, own_public, own_secret, publics[CLUSTER], authorised, cluster_secret, tuple(unnamed)
    )


def not_own(keys: CurveKeys) -> str | None:
    """Why the keys a process loaded are not its user's alone, as ssh's StrictModes judges a
    ``~/.ssh``: the directory, or the secret file the process presents, belongs to another user,
    or another user may write the directory; None where they are its own.

    Whoever owns or writes the directory decides who may control the cluster (its public keys
    are the authorised set) and, owning the secret, can read it: a node that loaded another
    user's directory was theirs without a word (report sh 10). Said, not refused: root running
    a node on a folder a service account owns is a choice.
    """
    directory = Path(keys.directory)
    secret = directory / f"{keys.name}.key_secret"
    try:
        folder, own = directory.stat(), secret.stat()
    except OSError:  # loaded a moment ago: gone since, which the next start will say
        return None
    me = user_name(os.geteuid())
    if is_another_users(folder):
        return f"keys {directory} belong to {user_name(folder.st_uid)}, not to this process's user {me}"
    if is_another_users(own):
        return f"secret key {secret} belongs to {user_name(own.st_uid)}, not to this process's user {me}"
    if folder.st_mode & 0o022:
        return f"keys {directory} may be written by other users (mode {stat.S_IMODE(folder.st_mode):04o})"
    return None


def _client_identity(directory: Path) -> str:
    unreadable: list[str] = []
    for role in (OPERATOR, READER):
        found = sorted(p.name[: -len(".key_secret")] for p in directory.glob(f"{role}*.key_secret"))
        found = [n for n in found if role_of(n) == role]
        readable = [n for n in found if _readable(directory / f"{n}.key_secret")]
        if readable:
            return readable[0]
        unreadable += found
    if unreadable and not _readable(directory / f"{CLUSTER}.key_secret"):
        return unreadable[0]  # none this user may read: _read says whose the first one is
    return CLUSTER


def _no_pair_of_yours(directory: Path) -> str:
    """Why a client found no pair to present in ``directory``: it said "no cluster.key_secret",
    which sent an operator to copy the cluster's secret to their laptop (report ak 7)."""
    misnamed = sorted(
        p.name for p in directory.glob("*.key_secret") if role_of(p.name[: -len(".key_secret")]) is None
    )
    found = f" ({', '.join(misnamed)} is there, but its name gives no role)" if misnamed else ""
    return (
        f"keys {directory}: no operator or reader pair{found}; an operator's directory holds "
        "cluster.key and their own operator-NAME.key and operator-NAME.key_secret (a reader's, "
        "reader-NAME.*): generate it with `troupe keys generate DIR --operator NAME` and have its "
        "public key copied to the cluster's hosts"
    )


def _readable(path: Path) -> bool:
    """Whether this process may read ``path`` (its effective ids, as the open will be)."""
    return os.access(path, os.R_OK, effective_ids=os.access in os.supports_effective_ids)


def _read(path: Path, secret: bool = False) -> tuple[bytes, bytes]:
    if not path.is_file():
        what = "secret key" if secret else "public key"
        raise ConfigError(f"keys {path.parent}: no {path.name} ({what})")
    if secret:
        mode = stat.S_IMODE(path.stat().st_mode)
        if mode & 0o077:
            raise ConfigError(
                f"secret key {path} is readable by others (mode {mode:04o}); run chmod 600 {path}"
            )
    try:
        public, secret_key = zmq.auth.load_certificate(path)
    except OSError as exc:  # another user's (a lab's shared folder): it was "not a CURVE certificate"
        raise ConfigError(_cannot_read(path, exc)) from None
    except ValueError as exc:
        raise ConfigError(f"key file {path}: not a CURVE certificate ({exc})") from None
    if secret and secret_key is None and len(public) == _Z85_KEY_LEN:  # the public key copied here (ak 15)
        raise ConfigError(
            f"key file {path}: holds only a public key; the secret {path.name} that `troupe keys "
            f"generate` wrote is expected here (was {path.stem}.key copied in its place?)"
        )
    if len(public) != _Z85_KEY_LEN or (secret and (secret_key is None or len(secret_key) != _Z85_KEY_LEN)):
        raise ConfigError(f"key file {path}: not a CURVE certificate (keys are 40 Z85 characters)")
    if not secret and secret_key is not None:  # a NAME.key_secret copied under the public name
        raise ConfigError(_secret_in_public(path))
    return public, secret_key or b""
