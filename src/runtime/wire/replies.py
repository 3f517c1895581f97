"""Error replies: how an exception becomes a wire payload and back again.

An ERROR envelope's payload is a map ``{code, type, message, traceback, actor}``. ``code`` is a
troupe error code (docs/PROTOCOL.md) or ``remote_error`` for any other exception a handler
raised; the asker re-raises the matching TroupeError subclass, or RemoteError carrying the
remote type, message and traceback text.

Only a ``remote_error`` carries the Python traceback (the handler's failure, for its asker to
read). Every other error (a bad frame, a delivery error, a control's own refusal) is an answer
about the message, not a fault of the process: its traceback is one line, ``type: message``, so
that a peer, authenticated or not, learns nothing of the server's files from it.
"""

from __future__ import annotations

import traceback
from typing import Any, NoReturn

from troupe.runtime.errors import RemoteError, TroupeError, error_class

__all__ = ["MESSAGE_MOST", "TRACEBACK_MOST", "error_payload", "raise_error_payload"]

MESSAGE_MOST = 64 * 1024  # characters of an error's message an error reply carries
TRACEBACK_MOST = 256 * 1024  # and of its traceback (which repeats the message)


def error_payload(exc: BaseException, actor: str = "", from_handler: bool = False) -> dict[str, Any]:
    """Describe ``exc`` as an error-reply payload.

    Args:
        exc: the exception.
        actor: the address of the actor concerned.
        from_handler: the exception escaped an actor's handler. It then always travels as
            ``remote_error``, even a TroupeError, so that an asker never mistakes a handler's
            failure (say, its own nested ask timing out) for a delivery failure of its ask.
    """
    if isinstance(exc, RemoteError):
        return {
            "code": exc.code,
            "type": exc.remote_type,
            "message": exc.remote_message,
            "traceback": exc.remote_traceback,
            "actor": exc.actor or actor,
        }
    code = exc.code if isinstance(exc, TroupeError) and not from_handler else "remote_error"
    kind = f"{type(exc).__module__}.{type(exc).__qualname__}"
    message = _cut(_message(exc), MESSAGE_MOST)
    if code == "remote_error":
        trace = _cut("".join(traceback.format_exception(exc)), TRACEBACK_MOST)
    else:
        trace = f"{kind}: {message}"
    return {"code": code, "type": kind, "message": message, "traceback": trace, "actor": actor}


def _message(exc: BaseException) -> str:
    """``str(exc)``, or what says it failed: an exception whose ``__str__`` raises ended the
    worker as its error reply was made, taking every actor of the process with it."""
    try:
        return str(exc)
    except Exception as failed:
        return f"<{type(exc).__qualname__}: its str() raised {type(failed).__qualname__}>"


def _cut(text: str, most: int) -> str:
    """``text`` up to ``most`` characters, and how much was cut: an error's message of 80 MB
    made an error reply past the wire's bound, which ended the worker."""
    if len(text) <= most:
        return text
    return f"{text[:most]}... ({len(text) - most} more characters cut)"


def raise_error_payload(payload: Any) -> NoReturn:
    """Raise the exception an error-reply payload describes (its ``from_reply`` set)."""
    raise _from_reply(_error_of(payload))


def _from_reply(error: TroupeError) -> TroupeError:
    error.from_reply = True
    return error


def _error_of(payload: Any) -> TroupeError:
    if not isinstance(payload, dict):
        return RemoteError("troupe.MalformedError", f"error reply with payload {payload!r}")
    code = str(payload.get("code", "remote_error"))
    message = str(payload.get("message", ""))
    actor = str(payload.get("actor", ""))
    cls = RemoteError if code == "remote_error" else error_class(code)
    if cls is RemoteError:
        return RemoteError(
            str(payload.get("type", "Exception")), message, str(payload.get("traceback", "")), actor
        )
    return cls(message)
