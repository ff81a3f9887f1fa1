"""The stage registry (``nemori_dspy.stages``): its rows match what the pipeline, settings, signatures, eval and
optimize do with a stage, and no module keeps its own list of stages."""

from __future__ import annotations

import ast
from pathlib import Path

import dspy
import pytest

from nemori_dspy import stages
from nemori_dspy.config import NemoriSettings, load_settings
from nemori_dspy.errors import ConfigError
from nemori_dspy.modules.pipeline import NemoriPipeline, pipeline_stage, stage_factory
from nemori_dspy.modules.resources import Resources
from nemori_dspy.signatures import SIGNATURES

ROOT = Path(__file__).resolve().parents[1]

#: configurations that together run every pipeline stage.
CONFIGS = [{}, {"distillation": "direct"}, {"semantic_management": "flat"},
           {"narration_mode": "batched", "consolidation_mode": "batched"}]


def _pipeline(**overrides):
    settings = NemoriSettings(embedder="hashing-16", **overrides)
    return NemoriPipeline(Resources(None, None, settings), stage_factory(settings, {}))  # type: ignore[arg-type]


def test_names_are_unique_and_every_row_resolves_to_its_signature():
    assert len(set(stages.STAGES)) == len(stages.STAGE_TABLE)
    for row in stages.STAGE_TABLE:
        cls = row.signature_class()
        assert issubclass(cls, dspy.Signature) and SIGNATURES[row.name] is cls


def test_every_pipeline_path_is_where_the_pipeline_keeps_that_stage():
    seen = set()
    for overrides in CONFIGS:
        pipeline = _pipeline(**overrides)
        held = {name.rsplit(".", 1)[0] for name, _ in pipeline.named_predictors()}
        assert held <= set(stages.PIPELINE_PATHS.values())
        for name, path in stages.PIPELINE_PATHS.items():
            if path in held:
                assert pipeline_stage(pipeline, name).stage_name == name
                seen.add(name)
    assert seen == set(stages.PIPELINE_PATHS)
    assert {s.name for s in stages.STAGE_TABLE if s.path is None} == {"judge"}


def test_a_stage_the_configuration_does_not_run_is_refused_by_name():
    with pytest.raises(ConfigError, match="'distill' is not run"):
        pipeline_stage(_pipeline(distillation="direct"), "distill")
    with pytest.raises(ConfigError, match="unknown stage 'narate'"):
        pipeline_stage(_pipeline(), "narate")


def test_the_default_caps_are_what_each_stage_sends():
    settings = NemoriSettings(max_tokens=100_000)
    assert {s: settings.stage_max_tokens(s) for s in stages.STAGES} == stages.DEFAULT_STAGE_MAX_TOKENS
    make = stage_factory(settings)
    assert all(make(s).max_tokens == stages.stage(s).max_tokens for s in stages.PIPELINE_PATHS)
    assert NemoriSettings(max_tokens=50).stage_max_tokens("narrate") == 50  # the global cap still bounds it


def test_stage_lms_accept_every_stage_and_reject_any_other_name():
    assert set(NemoriSettings(stage_lms={s: {"max_tokens": 7} for s in stages.STAGES}).stage_lms) == set(stages.STAGES)
    with pytest.raises(ConfigError, match="stage_lms"):
        load_settings(stage_lms={"narate": {"max_tokens": 7}})


def test_sides_split_construction_answer_and_judge():
    assert stages.CONSTRUCTION_STAGES[0] == "partition" and "direct_distill" in stages.CONSTRUCTION_STAGES
    assert stages.ANSWER_STAGES == ("answer",)
    assert set(stages.STAGES) == {*stages.CONSTRUCTION_STAGES, *stages.ANSWER_STAGES, "judge"}
    assert set(stages.MEMORY_WRITING_STAGES) == set(stages.CONSTRUCTION_STAGES) - {"partition"}


def test_batched_stages_point_at_the_stage_they_replace_and_back():
    for row in stages.STAGE_TABLE:
        if row.batched:
            assert stages.stage(row.batched).batch_of == row.name
        if row.batch_of:
            assert stages.stage(row.batch_of).batched == row.name
    assert stages.BATCHED_STAGES == {"narrate_batch", "consolidate_batch"}


def test_truncation_policy_lists_are_consistent():
    assert stages.TRUNCATED_LIST_STAGES <= stages.SALVAGE_TRUNCATED_STAGES
    assert not {"answer", "judge", "partition", "select", "consolidate"} & stages.SALVAGE_TRUNCATED_STAGES


def test_optimize_accepts_the_tunable_stages_in_pipeline_order():
    from nemori_dspy.optimizers.tune import parse_stages

    assert parse_stages(",".join(reversed(stages.TUNABLE_STAGES))) == list(stages.TUNABLE_STAGES)
    assert "anticipate+distill" in stages.TUNABLE_STAGES
    assert all(stages.stage(n).tunable for t in stages.TUNABLE_STAGES for n in t.split("+"))
    with pytest.raises(ConfigError):
        parse_stages("select")


def test_an_unknown_stage_name_is_a_key_error_that_lists_the_stages():
    with pytest.raises(KeyError, match="partition"):
        stages.stage("narate")


def test_eval_and_optimize_read_the_registry():
    from nemori_dspy.eval import runner, stage_activity
    from nemori_dspy.optimizers import programs

    assert runner.CONSTRUCTION_STAGES == list(stages.CONSTRUCTION_STAGES)
    assert stage_activity.STAGES == stages.CONSTRUCTION_STAGES
    assert programs.PIPELINE_PATHS is stages.PIPELINE_PATHS


# ---------------------------------------------------------------- no stage list kept by hand

#: dicts keyed by stage that hold per-stage content (demos, metrics, inputs, explanations), not facts the
#: registry could hold: (file, name of the variable or function holding the literal). Their keys must be stages.
PER_STAGE_CONTENT = {
    ("signatures/demos.py", "SEED_DEMOS"), ("optimizers/metrics.py", "STAGE_METRICS"),
    ("optimizers/tune.py", "RECORDED_AS"), ("optimizers/tune.py", "_WHY_SKIPPED"),
    ("benchmarks/local_serving.py", "_typical_inputs"),
}
SCANNED = ("nemori_dspy", "eval", "optimizers", "signatures", "benchmarks")


def _owner(parents: dict[ast.AST, ast.AST], node: ast.AST) -> str:
    """Name of the assignment or function the literal ``node`` sits in ('' at module level outside both)."""
    while node in parents:
        node = parents[node]
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            return node.targets[0].id
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            return node.target.id
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return node.name
    return ""


def hand_kept_stage_lists(source: str, rel_path: str, names: set[str]) -> list[str]:
    """Literal tuples, lists, sets and dict keys in ``source`` that name 3 or more stages, as
    ``"<path>:<line> <owner>"``; per-stage content dicts (``PER_STAGE_CONTENT``) pass if every key is a stage."""
    tree = ast.parse(source, filename=rel_path)
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    bad = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            items = node.elts
        elif isinstance(node, ast.Dict):
            items = [k for k in node.keys if k is not None]
        else:
            continue
        strings = {e.value for e in items if isinstance(e, ast.Constant) and isinstance(e.value, str)}
        if len(strings & names) < 3:
            continue
        owner = _owner(parents, node)
        if isinstance(node, ast.Dict) and (rel_path, owner) in PER_STAGE_CONTENT and strings <= names:
            continue
        bad.append(f"{rel_path}:{node.lineno} {owner}")
    return bad


def _names() -> set[str]:
    return set(stages.STAGES) | set(stages.TUNABLE_STAGES)


def test_no_module_lists_stages_by_hand():
    files = [p for f in SCANNED for p in sorted((ROOT / f).rglob("*.py")) if p != ROOT / "nemori_dspy" / "stages.py"]
    bad = [v for p in files for v in hand_kept_stage_lists(p.read_text(encoding="utf-8"),
                                                           str(p.relative_to(ROOT)), _names())]
    assert bad == []


def test_every_per_stage_content_table_is_still_there():
    """Each exemption names a literal that exists (a removed one must leave the set)."""
    for rel, owner in PER_STAGE_CONTENT:
        elsewhere = hand_kept_stage_lists((ROOT / rel).read_text(encoding="utf-8"), "elsewhere.py", _names())
        assert owner in {v.split()[-1] for v in elsewhere}, (rel, owner)


@pytest.mark.parametrize("source, flagged", [
    ('CONSTRUCTION = ("partition", "narrate", "select")', True),
    ('ORDER = ["answer", "judge", "narrate", "other"]', True),
    ('def f(s):\n    return s in {"distill", "anticipate", "consolidate"}', True),
    ('CAPS = {"partition": 320, "narrate": 384, "answer": 64}', True),
    ('SEED_DEMOS = {"narrate": [], "distill": [], "answer": [], "narate": []}', True),  # a content table with a typo
    ('PAIR = ("narrate", "narrate_batch")', False),
    ('WORDS = ("partition", "select", "other words")', False),
    ('SEED_DEMOS = {"narrate": [], "distill": [], "answer": []}', False),  # per-stage content
])
def test_the_scan_catches_a_hand_kept_list(source, flagged):
    assert bool(hand_kept_stage_lists(source, "signatures/demos.py", _names())) is flagged
