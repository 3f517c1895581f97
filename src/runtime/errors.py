"""Every error troupe raises, under one root.

::

    TroupeError
    ├── ConfigError(ValueError)            a config file or option is wrong
    │   ├── NameTaken                      another live node runs under the name (the master says)
    │   └── NoNodeNow                      no live node offers a stage's tags now (pipeline.hosts)
    ├── ProtocolError                      a frame broke the wire protocol
    │   ├── BadFrame(ValueError)           truncated, garbage, wrong shape or types
    │   ├── VersionMismatch                another protocol version
    │   ├── MessageTooLarge                over the receiver's size limit
    │   ├── BadRequest(ValueError)         a control payload lacks a field or mistypes one
    │   └── EncodeError(TypeError)         a payload value has no wire encoding
    ├── DeliveryError                      a message could not be handled
    │   ├── UnknownActor(LookupError)      no such actor at the target
    │   ├── UnknownMessageType(LookupError) the actor has no handler for that type
    │   ├── MailboxFull                    the target's mailbox is full and the sender asked not to wait
    │   ├── ActorStopped                   the actor stopped before it answered
    │   ├── NotPermitted(PermissionError)  the sender's key does not allow it (security.roles)
    │   └── Unreachable(ConnectionError)   no peer answers at that address
    │       └── Partitioned                a partition fault refuses the traffic on purpose
    ├── AskTimeout(TimeoutError)           no reply before the deadline
    │   └── PeerLost                       the asked process's connection ended first (it died)
    ├── RemoteError                        the handler raised; carries type, message, traceback
    ├── TaskError                          task bookkeeping refused an operation
    │   ├── JournalError                   the journal cannot be opened or is corrupt
    │   │   ├── JournalDamaged             its file is not a healthy SQLite database
    │   │   └── JournalBusy                another process holds the journal (tasks.journal_lock)
    │   ├── CommitError(OSError)           a task output could not be committed
    │   ├── InvalidTaskId(ValueError)      a task id cannot name an output
    │   ├── ContentError                   a task's context is missing or damaged in the store
    │   ├── UnknownWorker(LookupError)     the master does not know the worker: register again
    │   └── KindNotRun                     a runner does not run that task kind (tasks.task_runner)
    ├── FaultInjected                      raised on purpose by fault injection
    ├── ItemFailed                         one pipeline item failed and is pruned (not retried)
    ├── StageFailed                        a stage could not start, or its start or finalize hook failed
    └── JobCancelled                       a pipeline's job was cancelled at the master mid-run

Classes are defined here unless the tree names their module (under ``troupe.runtime``); a test
(tests/runtime/test_error_tree.py) parses this tree and fails on a TroupeError subclass of the
runtime that it does not draw. Domain errors live with the actors that raise them
(``troupe.actors.lerobot.errors.InvalidData``, ``troupe.actors.datagen.errors.PlanFailed``
under ItemFailed); their wire codes resolve once those modules are imported.

Errors from third-party libraries (pyzmq, msgpack, sqlite3) are translated into these at the
module that talks to them; nothing above that boundary sees a foreign exception type.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "ActorStopped",
    "AskTimeout",
    "BadFrame",
    "BadRequest",
    "CommitError",
    "ConfigError",
    "ContentError",
    "DeliveryError",
    "EncodeError",
    "FaultInjected",
    "InvalidTaskId",
    "ItemFailed",
    "JobCancelled",
    "JournalDamaged",
    "JournalError",
    "MailboxFull",
    "MessageTooLarge",
    "NameTaken",
    "Partitioned",
    "PeerLost",
    "ProtocolError",
    "RemoteError",
    "StageFailed",
    "TaskError",
    "TroupeError",
    "UnknownActor",
    "UnknownMessageType",
    "UnknownWorker",
    "Unreachable",
    "VersionMismatch",
]


class TroupeError(Exception):
    """Root of every troupe error. ``code`` is the stable name used on the wire.

    Every one pickles and copies as it is, attributes and all (multiprocessing, a process
    pool's futures, logging queues): an exception is rebuilt from its ``args``, which held the
    formatted message alone, and ``RemoteError(message)`` failed, breaking a user's whole
    ``ProcessPoolExecutor`` (report ap 5).

    ``from_reply`` is True on an error rebuilt from a peer's error reply (the asked process
    raised it, ``wire.replies``), False on one raised here: a control's own AskTimeout (the
    master's ask of a node, say) is then not taken for the asker's (report mt 3)."""

    code = "troupe_error"
    from_reply = False

    def __reduce__(self) -> tuple[Any, ...]:
        return _rebuilt, (type(self), self.args, self.__dict__)


def _rebuilt(cls: type[TroupeError], args: tuple[Any, ...], state: dict[str, Any]) -> TroupeError:
    """An error as it was pickled, its ``__init__`` not called again (its arguments are not its
    ``args``)."""
    error = cls.__new__(cls, *args)
    error.args = args
    error.__dict__.update(state)
    return error


class ConfigError(TroupeError, ValueError):
    """A config file, job file or option is invalid; the message names the field and the fix."""

    code = "config_error"


class NameTaken(ConfigError):
    """Another live process runs under the name this one asked for (a node's, at the master)."""

    code = "name_taken"


class ProtocolError(TroupeError):
    """A received frame broke the wire protocol (docs/PROTOCOL.md).

    ``envelope``: where the envelope itself was sound (a payload map with a refused key, a
    message refused unread for its size), its kind, msg_id, corr_id and target, so the receiver
    can answer the ask or settle the reply it came in; None otherwise.
    """

    code = "protocol_error"
    envelope: tuple[Any, int, int, str] | None = None


class BadFrame(ProtocolError, ValueError):
    """A frame is truncated, is not msgpack, or has fields of the wrong shape or type."""

    code = "bad_frame"


class VersionMismatch(ProtocolError):
    """The envelope carries a protocol version this process does not speak."""

    code = "version_mismatch"


class MessageTooLarge(ProtocolError):
    """A message is larger than the receiver's configured limit."""

    code = "message_too_large"


class DeliveryError(TroupeError):
    """A well-formed message could not be delivered or handled."""

    code = "delivery_error"


class UnknownActor(DeliveryError, LookupError):
    """No actor of that name lives at the target (or in the directory)."""

    code = "unknown_actor"


class UnknownMessageType(DeliveryError, LookupError):
    """The target actor has no handler for the message type."""

    code = "unknown_message_type"


class MailboxFull(DeliveryError):
    """The target mailbox is at its bound and the sender asked not to wait."""

    code = "mailbox_full"


class ActorStopped(DeliveryError):
    """The actor stopped (or its process died) before it could answer."""

    code = "actor_stopped"


class Unreachable(DeliveryError, ConnectionError):
    """Nothing answers at the address: the node or process is not running."""

    code = "unreachable"


class AskTimeout(TroupeError, TimeoutError):
    """No reply arrived before the ask's deadline; a reply that comes later is discarded."""

    code = "ask_timeout"


class PeerLost(AskTimeout):
    """The connection to the asked process ended before its reply came: the process died, was
    killed, or stopped. The ask ends then, not at its deadline; as with any AskTimeout, whether
    the request was handled is unknown (a reply that comes later is discarded)."""

    code = "peer_lost"


class RemoteError(TroupeError):
    """A handler raised; this carries the remote exception's type, message and traceback text.

    Args:
        remote_type: qualified name of the exception class raised remotely.
        message: ``str()`` of the remote exception.
        remote_traceback: formatted traceback text from the remote process.
        actor: address of the actor whose handler raised.
    """

    code = "remote_error"

    def __init__(self, remote_type: str, message: str, remote_traceback: str = "", actor: str = "") -> None:
        super().__init__(f"{remote_type}: {message}" + (f" (in actor {actor})" if actor else ""))
        self.remote_type = remote_type
        self.remote_message = message
        self.remote_traceback = remote_traceback
        self.actor = actor


class TaskError(TroupeError):
    """Task bookkeeping refused an operation (unknown task, stale lease, bad state)."""

    code = "task_error"


class JournalError(TaskError):
    """The task journal is missing, unreadable or corrupt; the master refuses to start on it."""

    code = "journal_error"


class JournalDamaged(JournalError):
    """The journal's file is not a healthy SQLite database (cut short, bytes changed): what it
    held is lost. A run's own journal can be set aside, its outputs being the truth."""

    code = "journal_damaged"

    def __init__(self, message: str, reason: str = "") -> None:
        super().__init__(message)
        self.reason = reason or message  # the damage alone, in SQLite's words


class CommitError(TaskError, OSError):
    """A task's output could not be written aside or committed (disk full, permissions)."""

    code = "commit_error"


class FaultInjected(TroupeError):
    """Raised on purpose by fault injection (the ``crash`` fault kind)."""

    code = "fault_injected"


_BY_CODE: dict[str, type[TroupeError]] = {}


def _index(cls: type[TroupeError]) -> None:
    # A class that keeps its parent's code (JournalBusy, KindNotRun) does not take it over: it
    # travels as its parent. It did, and every JournalError came back as JournalBusy, "another
    # master holds the journal", a master's full disk among them (report jx 2).
    if "code" in vars(cls):
        _BY_CODE[cls.code] = cls
    for sub in cls.__subclasses__():
        _index(sub)


def leaf_errors(exc: BaseException) -> list[BaseException]:
    """The exceptions inside (nested) exception groups, or ``exc`` itself."""
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for e in exc.exceptions for leaf in leaf_errors(e)]
    return [exc]


def error_class(code: str) -> type[TroupeError]:
    """Return the error class for a wire ``code``, or ``TroupeError`` for an unknown one."""
    if code not in _BY_CODE:
        _index(TroupeError)  # subclasses may have been defined since the last look-up
    return _BY_CODE.get(code, TroupeError)


class BadRequest(ProtocolError, ValueError):
    """A control message's payload lacks a field, or has one of the wrong type
    (docs/PROTOCOL.md section 10); the message names the control, the field and the value."""

    code = "bad_request"


class EncodeError(ProtocolError, TypeError):
    """A payload holds a value the codec cannot encode (see docs/PROTOCOL.md for the types)."""

    code = "encode_error"


class InvalidTaskId(TaskError, ValueError):
    """A task id is empty, starts with a dot or holds a path separator; it cannot name an output."""

    code = "invalid_task_id"


class ItemFailed(TroupeError):
    """One pipeline item failed and is pruned; the job goes on without it (not retried)."""

    code = "item_failed"


class StageFailed(TroupeError):
    """A pipeline stage could not start its first replicas, or its ``start`` or ``finalize`` hook
    failed; the items' outcomes stand (what was committed stays committed), and a rerun runs the
    hook again."""

    code = "stage_failed"


class JobCancelled(TroupeError):
    """A pipeline run's job was cancelled at the master (``troupe ctl cancel``) while it ran: the
    run stops as a stopped run does, and what its stages committed stays committed."""

    code = "job_cancelled"


class Partitioned(Unreachable):
    """Traffic to or from the peer is refused on purpose: a partition fault is in force."""

    code = "partitioned"


class ContentError(TaskError):
    """A task's context is missing from the content store, damaged, or cannot be written."""

    code = "content_error"


class UnknownWorker(TaskError, LookupError):
    """The master does not know the worker (it restarted, or the worker left): register again."""

    code = "unknown_worker"
