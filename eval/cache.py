"""Memory reuse across eval runs: one store per construction key, plus a record of finished conversations.

The key covers everything that shapes the memory — model and server flags, construction knobs, the
construction prompts and program state, the embedder and the dataset checksum — so a changed setting
never reuses stale memory, while runs that change only the answer side (answer model, k, r, systems
that read the same memory) reuse it.
"""

from __future__ import annotations

import hashlib
import json
import threading
from pathlib import Path
from typing import Any, Callable

from nemori_dspy.config import DEFAULT_CACHE_DIR, NemoriSettings
from nemori_dspy.memory import Memory
from nemori_dspy.signatures import SIGNATURES, signature_hash
from nemori_dspy.stages import CONSTRUCTION_STAGES
from nemori_dspy.eval.systems import System

__all__ = ["MEMORY_FORMAT", "CONSTRUCTION_FIELDS", "construction_key", "CachedMemories"]

#: settings that change what memory construction produces (answer-side knobs are left out on purpose).
CONSTRUCTION_FIELDS = ("model", "api_base", "temperature", "seed", "adapter", "gguf", "local_model_size",
                       "local_memory_model", "local_f16", "n_ctx",
                       "flash_attn", "association_max_gap_hours", "episode_split_gap_hours", "naive_timezone",
                       "embedder", "window_size", "association_top_k", "evoke_top_k", "evoke_threshold",
                       "consolidation_top_k", "consolidation_min_similarity", "distillation", "consolidation",
                       "max_message_chars", "max_prompt_chars", "parse_retries", "semantic_management",
                       "summary_max_chars", "consolidation_mode", "narration_mode", "partition_min_messages",
                       "select_inputs", "resolve_relative_dates", "partition_message_chars",
                       "anticipate_without_facts", "consolidate_within_episode", "message_timestamps",
                       "hold_open_segment", "seed_demos", "association_min_similarity",
                       "distill_chunk_messages", "consolidation_topic_floor", "narrate_chunk_messages")
#: Version of what construction code writes into memory, part of every key: bump it when the pipeline stores
#: different things for the same settings and prompts (2: similarity floor, duplicate skip, noise guard and event
#: times on facts; 3: τ per embedder, flat management, cost switches, lexical index; 4: verbatim-copy and question
#: insights dropped, a truncated insight list kept without a re-ask; 5: message_timestamps and hold_open_segment;
#: 6: a narrative that copies a chat line is asked again with every message dated; 7: association_min_similarity
#: guard before P_sel; 8: junk insights and narratives never stored, copied chat lines stored as attributed facts,
#: a prose list reply read as its sentences; 9: a narrative or cue that only restates a seed demo re-asked, then
#: the messages quoted, instead of the session left unbuilt; 10: narrative polish (restatements dropped,
#: first-person sentences quoted) and distill_chunk_messages; 11: insights that only report a pleasantry dropped;
#: 12: a P_con merge gluing on a predicate with a pronoun refused; 13: narrate_chunk_messages; 14: a shared picture
#: credited to the speaker whose caption it is, a P_con merge saying "I" or "we" where no source does refused; 15: an
#: insight restating P_ant's prediction that no message holds dropped, "<A> shared a photo … with <B>" of B's picture
#: swapped; 16: an insight speaking in the first person quoted as the message it copies, or dropped, the prediction
#: copy caught at half its claim words, cue clauses credited to the right speaker, "Woah, Maria," read as an
#: address, P_dis shown the messages after the prediction, a prediction copy's dates left out; 17: an insight saying
#: "you" quoted as the message it copies, a picture judged and nothing else dropped, praise a pleasantry, a listener's
#: praise no sign a plan is theirs, "<A>'s … photo" of B's picture put right; 18: a sentence holding three words of a
#: demo sentence that no message holds is a demo echo; 19: "took care of <Name>", "gave <Name> a shout" and "says
#: he'll let her know" are pleasantries, "takes care of her dogs" no longer one; 20: a fact closely paraphrasing the
#: other speaker's own line moved to them; 21: a fact moved to the other speaker takes their pronouns; 22: a narrative sentence opening with "He"/"She" that
#: credits the wrong speaker gets the right one's name; 23: the chat's "[shares an image: …]" mark copied into a
#: narrative told as its sharer's picture, and the 0.5B partitioner served from F16; 24: a narrative sentence saying
#: "you" quoted with the speaker whose message it copies, or dropped, unless it names that speaker; 25: a quote's
#: closing mark stays with its sentence and a sentence inside an open quote does not end it, so a narrative's quotes
#: are no longer stored without their closing marks), so memories built by older code are never reused as if they were current.
MEMORY_FORMAT = 25


def construction_key(settings: NemoriSettings, model_label: str, embedder_name: str, dataset_sha256: str,
                     program_state: dict[str, Any] | None = None, sessions: str | None = None) -> str:
    """sha256[:16] over the construction settings, per-stage construction LMs and caps, prompt hashes,
    the construction predictors' saved state, model label, embedder, dataset checksum and the LoCoMo slice
    (``sessions`` such as ``"1-3"``; None = whole conversations, keyed as before slices existed)."""
    d = settings.model_dump(mode="json")
    payload = {
        "settings": {k: d[k] for k in CONSTRUCTION_FIELDS},
        "stages": {s: [d["stage_lms"].get(s), settings.stage_max_tokens(s), d["predictor_classes"].get(s)]
                   for s in CONSTRUCTION_STAGES},
        "prompts": {s: signature_hash(SIGNATURES[s]) for s in CONSTRUCTION_STAGES},
        "program": _construction_state_delta(settings, program_state),
        "model_label": model_label, "embedder": embedder_name, "dataset": dataset_sha256,
        "format": MEMORY_FORMAT,
        "seed_demos": _seed_demos_hash() if settings.seed_demos else None,
    }
    if sessions:
        payload["sessions"] = sessions
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _seed_demos_hash() -> str:
    """sha256[:16] of the seed demos' content (``signatures.demos.SEED_DEMOS``): editing a demo changes the key."""
    from nemori_dspy.signatures.demos import SEED_DEMOS

    return hashlib.sha256(_canonical({k: [d.toDict() for d in v] for k, v in SEED_DEMOS.items()}).encode()
                          ).hexdigest()[:16]


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def _without_lm(state: Any) -> Any:
    """A predictor state without its ``lm`` entry: a program saved with or without its stage LMs keys alike."""
    return {k: v for k, v in state.items() if k != "lm"} if isinstance(state, dict) else state


def _construction_state_delta(settings: NemoriSettings, program_state: dict[str, Any] | None) -> dict[str, str]:
    """The construction predictors' entries of a saved program that differ from a fresh pipeline's.

    Answer-side entries (``response.*``) and ``metadata`` (dependency versions) never shape memory, and a
    predictor saved unchanged (e.g. a program tuned only on the answer stage) keys like no program at all,
    so ``--program tuned.json`` reuses the memory an untuned run built.
    """
    if not program_state:
        return {}
    from nemori_dspy.modules.pipeline import NemoriPipeline, stage_factory
    from nemori_dspy.modules.resources import Resources

    fresh = NemoriPipeline(Resources(None, None, settings), stage_factory(settings, {}))  # type: ignore[arg-type]
    default = fresh.dump_state()
    delta = {}
    for name, state in program_state.items():
        if name == "metadata" or name.startswith("response."):
            continue
        state = _without_lm(state)  # the stage LMs are keyed apart (settings, model label)
        if name not in default or _canonical(state) != _canonical(_without_lm(default[name])):
            delta[name] = _canonical(state)
    return delta


class CachedMemories:
    """``MemoryProvider`` keeping each construction's store under ``cache_dir/memory/<key>.sqlite3``.

    Args:
        settings: the run's settings; a system's ``construction`` overrides are applied on top.
        make_memory: builds a ``Memory`` for (settings, store path).
        key_of: settings → construction key (see ``construction_key``).
        cache_dir: default ``~/.cache/nemori-dspy``.
    """

    def __init__(self, settings: NemoriSettings, make_memory: Callable[[NemoriSettings, Path], Memory],
                 key_of: Callable[[NemoriSettings], str], cache_dir: Path = DEFAULT_CACHE_DIR) -> None:
        self.settings, self.make_memory, self.key_of = settings, make_memory, key_of
        self.dir = cache_dir / "memory"
        self._memories: dict[str, Memory] = {}
        self._lock = threading.Lock()

    def _settings(self, system: System) -> NemoriSettings:
        return self.settings.model_copy(update=system.construction)

    def path(self, system: System) -> Path:
        """Store file for the system's construction."""
        return self.dir / f"{self.key_of(self._settings(system))}.sqlite3"

    def memory(self, system: System) -> Memory:
        """The system's memory: its construction's store, answering with the system's ``answer`` overrides (a
        system with its own answer side gets its own ``Memory`` on the same store file)."""
        with self._lock:
            path = self.path(system)
            key = f"{path}|{sorted(system.answer.items())}" if system.answer else str(path)
            if key not in self._memories:
                self._memories[key] = self.make_memory(self._settings(system).model_copy(update=system.answer), path)
            return self._memories[key]

    def record_path(self, system: System) -> Path:
        """Stage records of the system's memory (``recording.py``), beside its store file."""
        return self.path(system).with_suffix(".stages.jsonl")

    def _done_file(self, system: System) -> Path:
        return self.path(system).with_suffix(".done.json")

    def is_built(self, system: System, sample_id: str) -> bool:
        f = self._done_file(system)
        return f.exists() and sample_id in json.loads(f.read_text())

    def mark_built(self, system: System, sample_id: str) -> None:
        with self._lock:
            f = self._done_file(system)
            done = json.loads(f.read_text()) if f.exists() else []
            f.parent.mkdir(parents=True, exist_ok=True)
            f.write_text(json.dumps(sorted({*done, sample_id})))
