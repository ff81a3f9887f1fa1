"""MkDocs hooks: the tables that are generated at build time rather than written by hand.

A page asks for a generated block with an HTML comment on a line of its own:

- ``<!-- generated: settings -->`` — every field of ``nemori_dspy.config.NemoriSettings`` (name, env var, type,
  default, description), read from the pydantic model, so the table cannot drift from ``--help``;
- ``<!-- generated: stages -->`` — the pipeline's stages with their signature and default output cap;
- ``<!-- generated: results -->`` — one section per file in ``benchmarks/results/`` (``*.json`` rendered as
  tables, ``*.md`` included as written), newest build first within each benchmark.

Only the standard library and the package itself are imported; a results file of an unknown shape is rendered
generically (its scalar values and lists of records), never skipped.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

__all__ = ["on_page_markdown", "settings_table", "stages_table", "results_sections"]

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
_MARK = re.compile(r"^<!-- generated: (\w+) -->$", re.MULTILINE)


def _cell(value: Any) -> str:
    """One Markdown table cell: ``value`` as text, pipes escaped, newlines flattened."""
    if isinstance(value, float):
        text = f"{value:.4g}" if abs(value) < 1e6 else f"{value:,.0f}"
    elif isinstance(value, (dict, list, tuple)):
        text = json.dumps(value, default=str, ensure_ascii=False)
        text = text if len(text) <= 120 else text[:117] + "…"
    else:
        text = "" if value is None else str(value)
    return text.replace("|", "\\|").replace("\n", " ")


def _table(header: list[str], rows: list[list[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


# ---------------------------------------------------------------- settings

def _type_name(annotation: Any) -> str:
    text = getattr(annotation, "__name__", None) if not getattr(annotation, "__args__", None) else None
    text = text or str(annotation)
    return re.sub(r"\b(typing|pathlib|pydantic\.types)\.", "", text).replace("NoneType", "None")


def settings_table() -> str:
    """Markdown table of every ``NemoriSettings`` field: setting, env var, type, default, description."""
    from nemori_dspy.config import NemoriSettings

    rows = []
    for name, field in NemoriSettings.model_fields.items():
        default = "(computed)" if field.default_factory is not None else field.default
        if hasattr(default, "get_secret_value"):
            default = "(secret)"
        rows.append([f"`{name}`", f"`NEMORI_{name.upper()}`", f"`{_type_name(field.annotation)}`",
                     f"`{default!s}`" if default is not None else "`None`", field.description or ""])
    return _table(["setting", "env var", "type", "default", "description"], rows)


# ---------------------------------------------------------------- stages

def stages_table() -> str:
    """Markdown table of the stages in pipeline order: stage, signature class, default max tokens, memory-writing."""
    from nemori_dspy import config
    from nemori_dspy.signatures import SIGNATURES

    writing = set(getattr(config, "MEMORY_WRITING_STAGES", ()))
    rows = []
    for stage in config.STAGES:
        sig = SIGNATURES.get(stage)
        doc = (getattr(sig, "__doc__", "") or "").strip().splitlines()
        rows.append([f"`{stage}`", f"`{getattr(sig, '__name__', '—')}`", doc[0] if doc else "",
                     config.DEFAULT_STAGE_MAX_TOKENS.get(stage, "—"), "yes" if stage in writing else ""])
    return _table(["stage", "signature", "what it asks", "default max tokens", "writes memory"], rows)


# ---------------------------------------------------------------- benchmark results

def _machine_line(machine: dict[str, Any] | None) -> str:
    if not isinstance(machine, dict):
        return ""
    keys = ("commit", "cpu", "cores", "memory_gib", "ram_gb", "load_avg_1min", "load_1min", "utc")
    parts = [f"{k} `{machine[k]}`" for k in keys if machine.get(k) is not None]
    return "Machine: " + ", ".join(parts) + "." if parts else ""


def _records(rows: list[Any]) -> str:
    """A list of dicts as one table over their scalar keys (nested values left out)."""
    dicts = [r for r in rows if isinstance(r, dict)]
    if not dicts:
        return "\n".join(f"- {_cell(r)}" for r in rows)
    keys: list[str] = []
    for r in dicts:
        keys += [k for k, v in r.items() if k not in keys and not isinstance(v, (dict, list))]
    return _table(keys, [[r.get(k, "") for k in keys] for r in dicts])


def _mapping(d: dict[str, Any]) -> str:
    """A dict: sub-dicts of scalars as one table keyed by name, the scalars as a key/value table."""
    parts = []
    scalars = [[f"`{k}`", v] for k, v in d.items() if not isinstance(v, (dict, list))]
    if scalars:
        parts.append(_table(["figure", "value"], scalars))
    subs = {k: v for k, v in d.items() if isinstance(v, dict)}
    flat = {k: v for k, v in subs.items() if all(not isinstance(x, (dict, list)) for x in v.values())}
    if flat:
        keys: list[str] = []
        for v in flat.values():
            keys += [k for k in v if k not in keys]
        parts.append(_table(["", *keys], [[f"`{name}`", *(v.get(k, "") for k in keys)] for name, v in flat.items()]))
    for k, v in subs.items():
        if k not in flat:
            parts.append(f"`{k}`:\n\n" + _mapping(v))
    for k, v in d.items():
        if isinstance(v, list) and v:
            parts.append(f"`{k}`:\n\n" + _records(v))
    return "\n\n".join(parts)


def _printed_table(text: str) -> str:
    """A benchmark's printed Markdown (tables and note lines): note lines become list items."""
    out = []
    for line in text.strip().splitlines():
        out.append(line if not line.strip() or line.lstrip().startswith("|") else f"- {line.strip()}")
    # a table must be preceded by a blank line to render
    return re.sub(r"(?m)^(- .*)\n(\|)", r"\1\n\n\2", "\n".join(out))


def _json_section(path: Path) -> str:
    d = json.loads(path.read_text(encoding="utf-8"))
    lines = [f"### `{path.name}`", ""]
    params = d.get("params") or d.get("args")
    if params is None:
        params = {k: v for k, v in d.items() if k in ("lm", "model_label", "data", "sessions", "conversations", "k",
                                                       "answer", "judge_model", "max_questions", "configs",
                                                       "complete", "seconds", "embedder", "probes", "facts",
                                                       "questions", "turns", "what", "A", "B", "command", "runs")}
    if params:
        lines += ["Parameters: " + ", ".join(f"`{k}` = `{_cell(v)}`" for k, v in params.items()), ""]
    machine = _machine_line(d.get("machine"))
    if machine:
        lines += [machine, ""]
    if isinstance(d.get("table"), str):
        lines += [_printed_table(d["table"]), ""]
        return "\n".join(lines)
    body = {k: v for k, v in d.items() if k not in ("benchmark", "params", "args", "machine", *params)}
    figures = body.pop("figures", None)
    if isinstance(figures, dict):
        body = {**figures, **body}
    lines += [_mapping(body), ""]
    return "\n".join(lines)


def _md_section(path: Path) -> str:
    text = path.read_text(encoding="utf-8").strip()
    # demote the file's headings below the page's own "### file" level
    text = re.sub(r"(?m)^(#{1,3}) ", lambda m: "#" * (len(m.group(1)) + 3) + " ", text)
    return f"### `{path.name}`\n\n{text}\n"


def results_sections(results: Path = RESULTS) -> str:
    """Every file in ``results`` as a Markdown section, grouped by benchmark (the name before the first ``-``)."""
    files = sorted([*results.glob("*.json"), *results.glob("*.md")])
    groups: dict[str, list[Path]] = {}
    for p in files:
        groups.setdefault(re.split(r"[-.]", p.name, maxsplit=1)[0], []).append(p)
    out = []
    for name, paths in groups.items():
        out.append(f"## {name}\n")
        for p in sorted(paths, reverse=True):
            out.append(_md_section(p) if p.suffix == ".md" else _json_section(p))
    return "\n".join(out)


_GENERATORS = {"settings": settings_table, "stages": stages_table, "results": results_sections}


def on_page_markdown(markdown: str, page: Any = None, config: Any = None, files: Any = None) -> str:
    """MkDocs hook: replace each ``<!-- generated: NAME -->`` line with the generated Markdown.

    Raises:
        KeyError: the page asks for a generator that does not exist (fails the build).
    """
    return _MARK.sub(lambda m: _GENERATORS[m.group(1)](), markdown)
