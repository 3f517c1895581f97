"""Outside text for rich: paths, endpoints, job ids, names, reasons and errors, shown as they are.

Text a peer, a file or the user gave is not troupe's markup. Given to rich as a string, a
journal path holding ``[/]`` raised a MarkupError (``ctl status`` failed), one holding
``[prod]`` was printed with that part gone; and ``rich.markup.escape`` doubles a trailing
backslash, which is right only where a tag follows (``C:\\data\\`` came out ``C:\\data\\\\``).
A :class:`~rich.text.Text` is never parsed: outside text goes to rich as one, and troupe's own
markup beside it through :func:`markup`.
"""

from __future__ import annotations

from rich.text import Text

__all__ = ["literal", "markup"]


def literal(value: object, style: str = "") -> Text:
    """``str(value)`` as rich text, never read as markup, in ``style``."""
    return Text(str(value), style=style)


def markup(*parts: str | Text) -> Text:
    """One line of ``parts``: each ``str`` is troupe's own markup (``"[bold red]error:[/] "``),
    each :class:`~rich.text.Text` outside text, kept as it is (:func:`literal`). A tag does not
    span parts: give outside text that needs a style its own (``literal(job, "bold")``)."""
    line = Text()
    for part in parts:
        line.append(part if isinstance(part, Text) else Text.from_markup(part))
    return line
