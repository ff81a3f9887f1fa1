"""Stage activity of memory construction: how often each Nemori stage ran, and how often a guard skipped or rewrote
its work and why. LLM-free: it reads a run's per-stage usage and its ledger counters.

A stage that never runs makes the method something else (0 P_sel, P_int and P_con calls and P_ant for 1 of 18
episodes is Nemori-s with one narrative per session); the counters say which guard stopped it. Two tables:

* per construction stage (``STAGES``): LLM calls (real calls plus response-cache hits: a cached reply is the stage
  running), per 100 turns and per episode;
* per guard counter (``nemori_dspy.usage.tally`` names: ``partition_skipped_short``, ``evoke_empty``,
  ``insights_dropped.<reason>``, ``association.<reason>``, ...): its count, per 100 turns and per episode, the
  stage it belongs to and a one-line why (``GUARDS``, or a generic text for a counter not listed: every counter
  present is shown, grouped by stage).

``stage_activity(...)`` gives the figures as a dict (``RunSummary.stage_activity``); ``stage_activity_table(...)``
renders them with ``eval.metrics.format_table``; ``stage_metrics(...)`` names them for MLflow.
"""

from __future__ import annotations

from typing import Any, Mapping

from nemori_dspy.eval.metrics import format_table
from nemori_dspy.stages import CONSTRUCTION_STAGES

__all__ = ["STAGES", "GUARDS", "stage_activity", "stage_activity_table", "stage_metrics", "guard_stage"]

#: construction stages, in pipeline order (batched variants and Nemori-s / flat stages after).
STAGES = CONSTRUCTION_STAGES

#: counter → (stage, why it fired). Prefix entries end with "." and cover every ``<prefix><name>`` counter.
GUARDS: dict[str, tuple[str, str]] = {
    "segments_held": ("partition", "the talk after a window's last time gap waits for the next window"),
    "partition_skipped_short": ("partition", "segment shorter than partition_min_messages: one episode, no P_par"),
    "partition_repairs": ("partition", "P_par reply repaired (missing, repeated or out-of-range numbers)"),
    "partition_fallback_whole_window": ("partition", "P_par failed: the whole window is one episode"),
    "narrate_copied_line": ("narrate", "narrative was a copied chat line: asked again, every message dated"),
    "narrate_junk_retry": ("narrate", "narrative or cue echoed a prompt or was a placeholder: asked again"),
    "narrate_fallback": ("narrate", "still junk after the re-ask: the messages stored quoted and dated"),
    "narrate_fallback_cue": ("narrate", "cue still junk after the re-ask: speakers and date as the cue"),
    "narrate_repeats_dropped": ("narrate", "sentences a looping narrative repeated: dropped"),
    "narrate_restatements_dropped": ("narrate", "narrative sentence saying nothing an earlier one did not: dropped"),
    "narrate_captions_attributed": ("narrate", "the chat's [shares an image: …] mark copied into a narrative: told as "
                                    "its sharer's picture, or dropped"),
    "narrate_first_person_quoted": ("narrate", "first- or second-person sentence copying a message: quoted with its speaker"),
    "narrate_first_person_dropped": ("narrate", "first- or second-person sentence copying no message: dropped"),
    "narrate_demo_echo_dropped": ("narrate", "narrative sentence restating a seed demo, not the episode: dropped"),
    "narrate_demo_echo_retry": ("narrate", "narrative only restated a seed demo: asked again"),
    "narrate_demo_echo_cue": ("narrate", "cue restated a seed demo: speakers and date as the cue"),
    "narrate_cue_reattributed": ("narrate", "cue clause crediting one speaker with another's picture or words: "
                                 "names put right"),
    "narrate_reattributed": ("narrate", "narrative sentence crediting one speaker with another's words: name put right"),
    "narrate_batch_fallback": ("narrate_batch", "batched reply unusable: one P_nar call per group"),
    "association.no_candidate_in_gap": ("select", "no earlier episode within association_max_gap_hours"),
    "association.below_similarity": ("select", "earlier episodes below association_min_similarity"),
    "association.candidates": ("select", "earlier episodes shown to P_sel as candidates"),
    "association.": ("select", "association guard"),
    "episode_merges": ("integrate", "P_sel chose a continuation: merged by P_int"),
    "integrate_reattributed": ("integrate", "merged-narrative sentence crediting the wrong speaker: name put right"),
    "integrate_junk_fallback": ("integrate", "merged narrative or cue was junk: both narratives kept in order"),
    "evoke_calls": ("anticipate", "evocations (semantic search before P_ant)"),
    "evoke_empty": ("anticipate", "nothing evoked above τ (evoke_threshold)"),
    "anticipate_skipped_no_facts": ("anticipate", "no known fact: nothing predicted, no P_ant call"),
    "noise_messages_skipped": ("distill", "machine-noise message not shown to the distiller"),
    "distill_skipped_noise_only": ("distill", "episode of machine noise only: not distilled"),
    "insights": ("distill", "insights kept for consolidation"),
    "insights_attributed": ("distill", "copied chat line or message stored as an attributed, dated fact"),
    "insights_reattributed": ("distill", "fact crediting one speaker with another's words: name put right"),
    "insights_redated": ("distill", "fact dating its event otherwise than the message telling it: date put right"),
    "noise_insights_dropped": ("distill", "insight quoting machine noise: dropped"),
    "insights_dropped.demo_echo": ("distill", "insight restating a seed demo, not the episode: dropped"),
    "insights_dropped.question": ("distill", "insight was a question: dropped"),
    "insights_dropped.no_fact": ("distill", "copied greeting, thanks or reaction (no fact): dropped"),
    "insights_dropped.chat_line": ("distill", "chat line matching no message of its speaker: dropped"),
    "insights_dropped.verbatim_copy": ("distill", "verbatim copy of a message: dropped"),
    "insights_dropped.instruction_echo": ("distill", "insight echoed an instruction: dropped"),
    "insights_dropped.field_description_echo": ("distill", "insight echoed a field description: dropped"),
    "insights_dropped.placeholder": ("distill", "placeholder (e.g. 'nothing predicted'): dropped"),
    "insights_dropped.fragment": ("distill", "fragment with no predicate: dropped"),
    "insights_dropped.no_subject": ("distill", "opens with a bare pronoun and names nobody: dropped"),
    "insights_dropped.predicted_only": ("distill", "restates P_ant's prediction, no message holds it: dropped"),
    "insights_dropped.first_person": ("distill", "speaks in the first person, copies no message: dropped"),
    "insights_dropped.pleasantry": ("distill", "only thanks, compliments or goodbyes between the speakers: dropped"),
    "insights_dropped.picture_reaction": ("distill", "only judges a picture shared in the chat: dropped"),
    "insights_dropped.": ("distill", "insight dropped"),
    "insight_duplicates_skipped": ("consolidate", "insight already in memory: skipped, no P_con"),
    "insight_duplicates_redated": ("consolidate", "duplicate restated later: its stored entry re-dated"),
    "insight_duplicates": ("consolidate", "a candidate is a near-duplicate (cosine ≥ 0.95)"),
    "consolidation.candidates_below_floor": ("consolidate", "candidates below consolidation_min_similarity"),
    "consolidation.below_floor": ("consolidate", "no candidate cleared the floor: stored as new, no P_con"),
    "consolidation.other_topic": ("consolidate", "candidates on another topic once the speakers' names are masked "
                                  "(consolidation_topic_floor)"),
    "consolidation.new": ("consolidate", "stored as new (P_con, or no candidate: no call)"),
    "consolidation.merge": ("consolidate", "merged into similar entries"),
    "consolidation.conflict": ("consolidate", "replaced conflicting entries"),
    "consolidation.deleted": ("consolidate", "entries retired by a merge or conflict"),
    "consolidation.refused_targets": ("consolidate", "P_con named a target out of range or already retired"),
    "consolidation.merge_refused_junk": ("consolidate", "merged text echoed an instruction or a placeholder: stored "
                                                        "as new instead"),
    "consolidation.merge_refused_content": ("consolidate", "merged text dropped what the insight or a target "
                                            "states: stored as new instead"),
    "consolidation.merge_refused_quote": ("consolidate", "merged text changed a quoted passage: stored as new "
                                          "instead"),
    "consolidation.merge_refused_first_person": ("consolidate", "merged text said I or we outside a quote where "
                                                 "no source did (a chat line copied in): stored as new instead"),
    "consolidation.merge_refused_glued": ("consolidate", "merged text only strung its sources together, or glued "
                                          "another fact's predicate on with a pronoun: stored as new instead"),
    "consolidation.merge_refused_person": ("consolidate", "merged text names people the insight and targets do "
                                           "not: stored as new instead"),
    "consolidation.batch_fallback": ("consolidate_batch", "no batched decision: per-insight P_con"),
    "consolidation.other_person": ("consolidate", "candidates about another speaker of the conversation than the "
                                   "insight names: left out"),
    "consolidation.": ("consolidate", "consolidation"),
    "narrate_chunks": ("narrate", "runs of narrate_chunk_messages messages, one P_nar call each"),
    "distill_chunks": ("distill", "runs of distill_chunk_messages messages, one P_dis call each"),
    "judge_known_wrong.": ("answer", "judged WRONG without a call"),
    "summary_fallback": ("summarize", "summary reply lost text: the insights appended instead"),
    "summary_truncated": ("summarize", "summary cut to summary_max_chars"),
    "embedder_inputs_clipped": ("other", "embedder input cut to max_message_chars"),
    "parked_windows": ("other", "window failed: its messages stay buffered"),
    "parked_distillations": ("other", "distillation failed: retried next flush"),
    "retries": ("other", "stage calls re-asked (all stages)"),
    "failed_stage_calls": ("other", "stage calls failed after every attempt"),
    "answer_context_items_dropped": ("answer", "context items cut to answer_context_tokens"),
    "answers_failed": ("answer", "no usable answer after retries"),
    "full_context_truncated": ("answer", "full-context baseline cut to its budget"),
    "judge_strict_overrides": ("answer", "strict judge overrode the generous one"),
}
#: counters ``<prefix>.<stage>`` that belong to the stage named after the dot.
_PER_STAGE = {"retries.": "re-asked after a failed call", "truncated.": "reply cut by its token cap",
              "truncation_retries.": "cut reply asked again with twice the cap",
              "truncated_accepted.": "cut reply kept as it parsed (a list without its last item)"}
_ORDER = (*STAGES, "other", "answer")


def guard_stage(counter: str) -> tuple[str, str]:
    """(stage, why) of a ledger counter: ``GUARDS``' entry, else its longest matching prefix entry (with the rest
    of the name added), else a per-stage counter (``retries.<stage>``, ``truncated.<stage>``, ...), else
    ``("other", counter)``."""
    if counter in GUARDS:
        return GUARDS[counter]
    for prefix, why in _PER_STAGE.items():
        if counter.startswith(prefix):
            return counter[len(prefix):], why
    prefixes = [p for p in GUARDS if p.endswith(".") and counter.startswith(p)]
    if prefixes:
        stage_name, why = GUARDS[max(prefixes, key=len)]
        return stage_name, f"{why}: {counter[len(max(prefixes, key=len)):]}"
    return "other", counter


def _calls(usage: Any) -> int:
    """Calls of a ``Usage`` or its ``model_dump()``: real calls plus response-cache hits."""
    get = usage.get if isinstance(usage, Mapping) else (lambda k, d=0: getattr(usage, k, d))
    return int(get("calls", 0) or 0) + int(get("cache_hits", 0) or 0)


def _rates(n: int, turns: int, episodes: int) -> dict[str, float | None]:
    return {"per_100_turns": round(100 * n / turns, 2) if turns else None,
            "per_episode": round(n / episodes, 3) if episodes else None}


def stage_activity(construction_usage: Mapping[str, Any], counters: Mapping[str, int], turns: int,
                   episodes: int) -> dict[str, Any]:
    """Stage calls and guard firings of a build, as rates.

    Args:
        construction_usage: stage → ``Usage`` (or its ``model_dump()``) of memory construction only.
        counters: the run's ledger counters (``UsageLedger.counters``: name → count).
        turns: messages built (the rate base: per 100 turns); 0 gives None rates.
        episodes: live episodes built; 0 gives None per-episode rates.

    Returns:
        ``{"turns", "episodes", "stages": {stage: {"calls", "per_100_turns", "per_episode"}},
        "guards": [{"counter", "stage", "why", "count", "per_100_turns", "per_episode"}]}``: every construction
        stage of ``STAGES`` (0 calls included, so a stage that never ran shows), then any other stage with calls
        except answering and judging; guards are every non-zero counter, ordered by stage then name; answering's
        and judging's counters (stage ``answer``) have no rates (None): they count questions, not turns.
    """
    names = [*STAGES, *sorted(s for s in construction_usage if s not in STAGES
                              and not s.startswith(("answer", "judge")) and _calls(construction_usage[s]))]
    stages = {s: {"calls": _calls(construction_usage.get(s, {})),
                  **_rates(_calls(construction_usage.get(s, {})), turns, episodes)} for s in names}
    rows = []
    for counter, n in counters.items():
        if not n:
            continue
        stage_name, why = guard_stage(counter)
        rates = _rates(int(n), turns, episodes) if stage_name != "answer" else _rates(0, 0, 0)
        rows.append({"counter": counter, "stage": stage_name, "why": why, "count": int(n), **rates})
    order = {s: i for i, s in enumerate(_ORDER)}
    rows.sort(key=lambda r: (order.get(r["stage"], len(order)), r["stage"], r["counter"]))
    return {"turns": int(turns), "episodes": int(episodes), "stages": stages, "guards": rows}


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def stage_activity_table(construction_usage: Mapping[str, Any] | None = None, counters: Mapping[str, int] | None = None,
                         turns: int = 0, episodes: int = 0, activity: dict[str, Any] | None = None) -> str:
    """Two plain-text tables (``format_table``): calls per stage, then guard firings with why, per 100 turns and
    per episode. Pass the arguments of ``stage_activity``, or its result as ``activity``."""
    a = activity if activity is not None else stage_activity(construction_usage or {}, counters or {}, turns, episodes)
    head = f"{a['turns']} turns, {a['episodes']} episodes (calls include response-cache hits)"
    stages = format_table(["stage", "calls", "per 100 turns", "per episode"],
                          [[s, str(v["calls"]), _fmt(v["per_100_turns"]), _fmt(v["per_episode"])]
                           for s, v in a["stages"].items()])
    if not a["guards"]:
        return f"{head}\n{stages}\n\nguards: none fired"
    guards = format_table(["stage", "guard", "count", "per 100 turns", "per episode", "why"],
                          [[g["stage"], g["counter"], str(g["count"]), _fmt(g["per_100_turns"]),
                            _fmt(g["per_episode"]), g["why"]] for g in a["guards"]], key_cols=2, width=200)
    return f"{head}\n{stages}\n\n{guards}"


def stage_metrics(activity: dict[str, Any]) -> dict[str, float]:
    """MLflow metrics of a ``stage_activity`` result: ``stage.<stage>.calls_per_100_turns``,
    ``stage.<stage>.calls_per_episode`` and ``guard.<counter>.per_100_turns`` (None rates left out)."""
    out: dict[str, float] = {}
    for s, v in activity.get("stages", {}).items():
        if v.get("per_100_turns") is not None:
            out[f"stage.{s}.calls_per_100_turns"] = float(v["per_100_turns"])
        if v.get("per_episode") is not None:
            out[f"stage.{s}.calls_per_episode"] = float(v["per_episode"])
    for g in activity.get("guards", []):
        if g.get("per_100_turns") is not None:
            out[f"guard.{g['counter']}.per_100_turns"] = float(g["per_100_turns"])
    return out
