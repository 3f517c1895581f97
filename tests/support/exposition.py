"""A strict reading of Prometheus' text exposition format, as the Go parser reads it (promtool,
the Pushgateway, node_exporter's textfile collector): prometheus-client's own parser takes a
family twice without a word, which those reject, the whole scrape with it.

The rules checked (the format's spec): at most one ``# HELP`` and one ``# TYPE`` line per
family, the TYPE before the family's first sample; every sample of a family in one run of lines
(none after another family began); no series twice; every value a number.
"""

from __future__ import annotations

import re

__all__ = ["strict_families"]

_SAMPLE = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})?\s+(\S+)(?:\s+-?\d+)?")
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"\s*(?:,|$)')
_SUFFIXES = ("_bucket", "_sum", "_count", "_created", "_total", "_info")


Sample = tuple[str, dict[str, str], float]


def strict_families(text: str) -> dict[str, list[Sample]]:
    """The families of ``text`` by name, each its samples ``(name, labels, value)`` (label
    values as written, escapes kept).

    Raises:
        AssertionError: ``text`` breaks a rule above; every problem found, one a line.
    """
    problems: list[str] = []
    families: dict[str, list[Sample]] = {}
    said: dict[tuple[str, str], int] = {}  # (HELP or TYPE, family) -> its line
    typed: set[str] = set()
    ended: set[str] = set()  # families whose run of lines is over
    series: set[tuple[str, str]] = set()
    current: str | None = None

    def enter(family: str, line_no: int) -> None:
        nonlocal current
        if family == current:
            return
        if family in ended or family in families:
            problems.append(f"line {line_no}: family {family} again, after other families began")
        if current is not None:
            ended.add(current)
        current = family
        families.setdefault(family, [])

    for line_no, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        if line.startswith("#"):
            parts = line.split(None, 3)
            if len(parts) < 3 or parts[1] not in ("HELP", "TYPE"):
                continue  # a comment
            kind, family = parts[1], parts[2]
            if (kind, family) in said:
                problems.append(f"line {line_no}: a second # {kind} {family} (line {said[kind, family]})")
                continue
            said[kind, family] = line_no
            if kind == "TYPE":
                if families.get(family):
                    problems.append(f"line {line_no}: # TYPE {family} after its samples")
                typed.add(family)
            enter(family, line_no)
            continue
        match = _SAMPLE.fullmatch(line.strip())
        if match is None:
            problems.append(f"line {line_no}: not a sample: {line!r}")
            continue
        name, labels, value_text = match.group(1), match.group(2) or "", match.group(3)
        try:
            value = float(value_text)
        except ValueError:
            problems.append(f"line {line_no}: {name}'s value {value_text!r} is no number")
            continue
        parsed = _labels(labels[1:-1])
        if parsed is None:
            problems.append(f'line {line_no}: labels not name="value" pairs: {labels}')
            continue
        family = _family_of(name, typed, current)
        enter(family, line_no)
        key = (name, str(sorted(parsed.items())))
        if key in series:
            problems.append(f"line {line_no}: series {name}{labels} twice")
        series.add(key)
        families[family].append((name, parsed, value))
    if problems:
        raise AssertionError("invalid exposition:\n" + "\n".join(problems))
    return families


def _labels(text: str) -> dict[str, str] | None:
    """``a="1",b="x"`` as a map; None where it is not such pairs, or names a label twice."""
    found: dict[str, str] = {}
    at = 0
    while at < len(text):
        match = _LABEL.match(text, at)
        if match is None or match.group(1) in found:
            return None
        found[match.group(1)] = match.group(2)
        at = match.end()
    return found


def _family_of(name: str, typed: set[str], current: str | None) -> str:
    """The family a sample belongs to: its own name where typed so, else its name less a suffix
    of the current family's kind (``x_bucket`` of ``x``), else its own name."""
    if name in typed:
        return name
    for suffix in _SUFFIXES:
        if name.endswith(suffix) and name.removesuffix(suffix) == current:
            return current
    return name
