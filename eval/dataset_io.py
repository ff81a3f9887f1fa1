"""Reading benchmark files: one JSON-list reader whose errors name the file and the fix."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from nemori_dspy.errors import DatasetError

__all__ = ["read_json_list"]


def read_json_list(file: Path, missing_fix: str, schema_fix: str, item: str = "sample") -> list[dict[str, Any]]:
    """Load ``file`` as a JSON list of objects.

    Args:
        missing_fix: what to say when the file does not exist (where to get it).
        schema_fix: what to say when it is not valid JSON or not a list of objects.
        item: what one element is called in messages ("sample", "question").
    Raises:
        DatasetError: missing file, invalid JSON/UTF-8, or not a list of objects.
    """
    if not file.is_file():
        raise DatasetError(f"{file}: file not found. Fix: {missing_fix}")
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise DatasetError(f"{file}: not valid JSON ({exc}). Fix: re-download the file; {schema_fix}") from exc
    if not isinstance(data, list) or not all(isinstance(s, dict) for s in data):
        raise DatasetError(f"{file}: expected a JSON list of {item} objects. Fix: {schema_fix}")
    return data
