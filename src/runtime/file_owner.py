"""Whose a file is, in words: for a folder that several users of one host share.

A folder another user may write (a lab's shared logs, keys or run folder) can hold files that
are not ours: a node acts only on what its own user wrote, and an error about another user's
file names that user (and the file's mode), where "Permission denied" alone sent the reader to
look at the directory.
"""

from __future__ import annotations

import os
import pwd
import stat

__all__ = ["belongs_to", "is_another_users", "login_name", "user_name"]


def login_name(uid: int) -> str | None:
    """``uid``'s login name; None where the user database has none (a container's uid)."""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return None


def user_name(uid: int) -> str:
    """``uid``'s login name, or ``uid N`` where the system knows no name for it."""
    return login_name(uid) or f"uid {uid}"


def is_another_users(st: os.stat_result) -> bool:
    """Whether the file ``st`` describes belongs to another user than this process's (its euid)."""
    return st.st_uid != os.geteuid()


def belongs_to(st: os.stat_result) -> str:
    """``it belongs to USER (mode 0644)``: the words for a file this process may not use."""
    return f"it belongs to {user_name(st.st_uid)} (mode {stat.S_IMODE(st.st_mode):04o})"
