"""One-line messages for invalid config files: the file, the field path, what is wrong, the value.

A pydantic error such as ``stages -> 2 -> replicas: Input should be greater than or equal to 1``
becomes ``pipe.toml: stages.render.replicas: must be >= 1 (got -1)``: list entries are named by
their ``name`` when they have a usable one, unknown keys get the closest known key, and user
values are shortened so a long or multi-line value cannot swamp the line.
"""

from __future__ import annotations

import difflib
import re
import shlex
import types
import typing
from collections.abc import Iterable, Mapping, Sequence
from importlib.resources import files
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

__all__ = ["field_path", "known_keys", "shipped_hint", "short_repr", "validation_message"]

_LABEL = re.compile(r"[A-Za-z0-9_.\-]{1,100}")
_MAX_VALUE = 60  # characters of a bad value shown in a message
# ^[A-Za-z0-9_.\-]+$, and ^[A-Za-z0-9][A-Za-z0-9._\-]*$ (a first character of its own)
_NAME_SHAPE = re.compile(r"\^(?P<first>\[A-Za-z0-9\])?\[A-Za-z0-9(?P<chars>[._\\-]*)\][+*]\$")

# pydantic's wording, said the way the rest of troupe's messages say it
_RULES: dict[str, str] = {
    "greater_than": "must be > {gt}",
    "greater_than_equal": "must be >= {ge}",
    "less_than": "must be < {lt}",
    "less_than_equal": "must be <= {le}",
    "int_type": "must be an integer",
    "int_from_float": "must be an integer",
    "int_parsing": "must be an integer",
    "float_type": "must be a number",
    "float_parsing": "must be a number",
    "finite_number": "must be a finite number",
    "bool_type": "must be true or false",
    "string_type": "must be a string",
    "string_too_short": "must have at least {min_length} characters",
    "string_too_long": "must have at most {max_length} characters",
    "missing": "is missing",
    "dict_type": "must be a table",
    "model_type": "must be a table",
    "tuple_type": "must be a list",
    "list_type": "must be a list",
}


def short_repr(value: Any, most: int = _MAX_VALUE) -> str:
    """``repr(value)``, cut to ``most`` characters: it fits in a one-line message."""
    try:
        text = repr(value)
    except RecursionError:  # nested deeper than repr goes (a control payload may be)
        text = f"<{type(value).__name__} nested too deep to show>"
    return text if len(text) <= most else text[: most - 3] + "..."


def field_path(loc: Sequence[int | str], data: Any, rename: Mapping[str, str] | None = None) -> str:
    """Dotted path of ``loc`` in ``data``; a list entry with a ``name`` is called by that name.

    ``rename`` maps a top-level key to what the file calls it (e.g. ``hwm`` -> ``node.hwm``
    when a loader flattens the ``[node]`` table).
    """
    parts: list[str] = []
    cur = data
    for part in loc:
        label = str(part)
        if isinstance(part, int) and isinstance(cur, Sequence) and not isinstance(cur, str):
            cur = cur[part] if 0 <= part < len(cur) else None
            name = cur.get("name") if isinstance(cur, Mapping) else None
            if isinstance(name, str) and _LABEL.fullmatch(name):
                label = name
        elif isinstance(cur, Mapping):
            cur = cur.get(part)
        else:
            cur = None
        parts.append(label)
    if parts and rename and parts[0] in rename:
        parts[0] = rename[parts[0]]
    return ".".join(parts) or "(top level)"


def known_keys(model: type[BaseModel], loc: Sequence[int | str], hidden: Iterable[str] = ()) -> list[str]:
    """The keys the table at ``loc`` (a path into ``model``'s input) may hold; [] if unknown.

    ``hidden``: top-level fields not to offer (a loader fills them from other tables).
    """
    annotation: Any = model
    for part in loc:
        annotation = _step(_unwrap(annotation), part)
        if annotation is None:
            return []
    annotation = _unwrap(annotation)
    if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
        return []
    keys = {f.alias or name for name, f in annotation.model_fields.items()}
    return sorted(keys - set(hidden) if not loc else keys)


def validation_message(
    source: str,
    exc: ValidationError,
    data: Any = None,
    model: type[BaseModel] | None = None,
    rename: Mapping[str, str] | None = None,
    hidden: Iterable[str] = (),
) -> str:
    """Render pydantic errors as one line: ``source: path: what is wrong (got value)``.

    Args:
        source: the file (or whatever the input came from), first on the line.
        exc: the error.
        data: the input that was validated, to name list entries by their ``name``.
        model: the model validated, to list the known keys when a key is unknown.
        rename: top-level keys as the file calls them (see :func:`field_path`).
        hidden: top-level fields not to suggest for an unknown key (see :func:`known_keys`).
    """
    hide = tuple(hidden)
    parts = [_one(err, data, model, rename, hide) for err in exc.errors(include_url=False)]
    return f"{source}: " + "; ".join(parts)


def _one(
    err: Mapping[str, Any],
    data: Any,
    model: type[BaseModel] | None,
    rename: Mapping[str, str] | None,
    hidden: tuple[str, ...],
) -> str:
    loc = tuple(err["loc"])
    where = field_path(loc, data, rename)
    kind = err["type"]
    if kind == "extra_forbidden":
        return f"{where}: unknown key{_suggest(str(loc[-1]), model, loc[:-1], hidden)}"
    if kind == "value_error":  # our own validators: the message says it all (where too, at the top)
        said = str(err["msg"]).removeprefix("Value error, ")
        return said if not loc else f"{where}: {said}"
    ctx = err.get("ctx") or {}
    rule = (
        "must not be empty" if kind == "string_too_short" and ctx.get("min_length") == 1 else _RULES.get(kind)
    )
    if kind == "string_pattern_mismatch":
        rule = _name_rule(str(ctx.get("pattern", "")))
    what = rule.format(**ctx) if rule is not None and _formats(rule, ctx) else err["msg"]
    value = err.get("input")
    if kind == "missing" or isinstance(value, Mapping | list | tuple):
        return f"{where}: {what}"
    return f"{where}: {what} (got {short_repr(value)})"


def _name_rule(pattern: str) -> str | None:
    """What a name pattern (``^[A-Za-z0-9_.\\-]+$`` and its kin: troupe's fields take no other)
    lets through, said: 'letters' alone was read as any letter, and refused 'ñode' as if it
    were none; and a stage name said '.' was allowed where its pattern has none. None for a
    pattern of another shape (pydantic's own words then)."""
    shape = _NAME_SHAPE.fullmatch(pattern)
    if shape is None:
        return None
    kinds = ["ASCII letters (a-z, A-Z)", "digits", *(f"'{c}'" for c in "._-" if c in shape["chars"])]
    starting = ", starting with an ASCII letter or digit" if shape["first"] else ""
    return f"may hold only {', '.join(kinds[:-1])} and {kinds[-1]}{starting}"


def _formats(rule: str, ctx: Mapping[str, Any]) -> bool:
    try:
        rule.format(**ctx)
    except (KeyError, IndexError):
        return False
    return True


def _suggest(
    key: str, model: type[BaseModel] | None, loc: Sequence[int | str], hidden: tuple[str, ...]
) -> str:
    known = known_keys(model, loc, hidden) if model is not None else []
    if not known:
        return ""
    close = difflib.get_close_matches(key, known, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ";"
    return f"{hint} known keys: {', '.join(known)}"


def _unwrap(annotation: Any) -> Any:
    """``X | None`` -> ``X``; ``Annotated[X, ...]`` -> ``X``."""
    while True:
        origin = typing.get_origin(annotation)
        if origin is typing.Annotated:
            annotation = typing.get_args(annotation)[0]
        elif origin in (typing.Union, types.UnionType):
            rest = [a for a in typing.get_args(annotation) if a is not type(None)]
            if len(rest) != 1:
                return annotation
            annotation = rest[0]
        else:
            return annotation


def _step(annotation: Any, part: int | str) -> Any:
    """The annotation one step down ``part`` from ``annotation``, or None."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        for name, f in annotation.model_fields.items():
            if part in (name, f.alias):
                return f.annotation
        return None
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (tuple, list) and args and isinstance(part, int):
        return args[0]
    if origin is dict and len(args) == 2:
        return args[1]
    return None


def shipped_hint(path: Path) -> str:
    """How to get ``path`` where it names a config troupe ships (``configs/train.toml``, which
    the README and --help name): an install without the repository has no such folder."""
    parts = path.parts
    if "configs" not in parts[:-1]:
        return ""
    at = len(parts) - 1 - parts[::-1].index("configs", 1)
    name = "/".join(parts[at + 1 :])
    try:
        shipped = files("troupe.configs").joinpath(name).is_file()
    except (ModuleNotFoundError, OSError):
        return ""
    if not shipped:
        return ""
    out = "" if path == Path("configs", name) else f" --out {shlex.quote(str(path))}"
    return f"; troupe ships it: `troupe configs {name}{out}` writes it there"
