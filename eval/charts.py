"""PNG charts for an eval run: per-category scores by system, and LLM tokens by stage.

matplotlib is imported lazily inside each function and drawn on an explicit Agg canvas
(``matplotlib.backends.backend_agg.FigureCanvasAgg``), so importing this module is cheap
and the global pyplot backend/state is never touched.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from nemori_dspy.eval.locomo import CATEGORY_NAMES, SCORED_CATEGORIES
from nemori_dspy.eval.metrics import Group, ordered_stages, usage_dict, category_scores

__all__ = ["category_bar_chart", "cost_by_stage_chart"]

_CATEGORIES = [*(CATEGORY_NAMES[c] for c in SCORED_CATEGORIES), "overall"]


def _figure(width: float, height: float) -> Any:
    """A new matplotlib ``Figure`` attached to an Agg canvas (no pyplot)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=100)
    FigureCanvasAgg(fig)
    return fig


def _save(fig: Any, path: str | Path) -> Path:
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(out, format="png")
    return out


def category_bar_chart(rows: list[dict], metric: str, systems: list[str] | None, path: str | Path,
                       groups: list[Group] | None = None, benchmark: str = "LoCoMo") -> Path:
    """Grouped bar chart of one metric: one group per category (1-4 + overall), one bar per system.

    Args:
        rows: ``results.jsonl`` rows (``eval/runner.py``) with ``category``, ``system`` and
            ``metric`` (float in [0, 1] or ``None``); aggregated by
            :func:`eval.metrics.category_scores` (category 5 ignored, ``None`` skipped).
        metric: e.g. ``"judge"``, ``"f1"``, ``"bleu1"``, ``"f1_locomo"``.
        systems: bar order; ``None`` → all systems in order of appearance.
        path: output ``.png`` path (parent folders are created).
        groups: bar groups (default LoCoMo categories 1-4, :data:`eval.metrics.LOCOMO_GROUPS`) + overall.
        benchmark: name in the title.

    Bars are mean × 100 with 95% CI whiskers (:func:`eval.metrics.mean_ci95`), labelled
    with the mean; an empty cell draws no bar. Returns ``path`` as a ``Path``.
    """
    scores = category_scores(rows, metric, systems, groups)
    cats = _CATEGORIES if groups is None else [name for name, _ in groups] + ["overall"]
    names = list(scores)
    fig = _figure(max(6.0, 1.2 * len(cats) * max(1, len(names)) / 2 + 3), 4.5)
    ax = fig.add_subplot(1, 1, 1)
    width = 0.8 / max(1, len(names))
    for i, system in enumerate(names):
        _system_bars(ax, scores[system], i, width, system, len(names), cats)
    ax.set_xticks(range(len(cats)), cats, rotation=0 if groups is None else 20, ha="center" if groups is None else "right")
    ax.set_ylim(0, 105)
    ax.set_ylabel(f"{metric} (×100, 95% CI)")
    ax.set_title(f"{benchmark} {metric} by category")
    if names:
        ax.legend(loc="upper left", fontsize="small")
    return _save(fig, path)


def _system_bars(ax: Any, cells: dict[str, tuple[float, float, float, int]], i: int, width: float,
                 label: str, count: int, cats: list[str]) -> None:
    xs, means, errs = [], [], [[], []]
    for j, name in enumerate(cats):
        mean, low, high, n = cells.get(name, (0.0, 0.0, 0.0, 0))
        if n:
            xs.append(j + (i - (count - 1) / 2) * width)
            means.append(100 * mean)
            errs[0].append(100 * (mean - low))
            errs[1].append(100 * (high - mean))
    bars = ax.bar(xs, means, width, yerr=errs, capsize=3, label=label)
    ax.bar_label(bars, fmt="%.1f", fontsize="x-small", padding=2)


def cost_by_stage_chart(stage_usage: dict[str, Any], path: str | Path,
                        stages_order: list[str] | None = None) -> Path:
    """Stacked horizontal bars of input and output tokens per LLM stage.

    Args:
        stage_usage: ``{stage: usage}``, usage a ``types.Usage`` or its ``model_dump()``
            (``input_tokens``, ``output_tokens``), e.g. ``RunSummary.usage`` from
            ``eval/runner.py``.
        path: output ``.png`` path (parent folders are created).
        stages_order: stages first, top to bottom (e.g. ``runner.CONSTRUCTION_STAGES``);
            the rest follow in dict order.

    Returns ``path`` as a ``Path``.
    """
    stages = ordered_stages(stage_usage, stages_order)
    use = [usage_dict(stage_usage[s]) for s in stages]
    inp = [u["input_tokens"] for u in use]
    out = [u["output_tokens"] for u in use]
    fig = _figure(7.0, max(2.5, 0.45 * len(stages) + 1.5))
    ax = fig.add_subplot(1, 1, 1)
    ys = list(range(len(stages)))
    ax.barh(ys, inp, label="input tokens")
    ax.barh(ys, out, left=inp, label="output tokens")
    ax.set_yticks(ys, stages)
    ax.invert_yaxis()
    ax.set_xlabel("tokens")
    ax.set_title("LLM tokens by stage")
    ax.legend(loc="lower right", fontsize="small")
    return _save(fig, path)
