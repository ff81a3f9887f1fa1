"""Settings: one pydantic-settings object, read from arguments, ``NEMORI_*`` env vars or a .env file.

Config flows one way: ``NemoriSettings`` → ``nemori_dspy.runtime.build_runtime`` (LMs, adapter,
cache, embedded server) and the ``Memory`` / ``NemoriPipeline`` it builds, at the entry point. Paper defaults (§4.1, Appendix C) carry descriptive names because the paper reuses
τ, m and r for other things.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, SecretStr, ValidationError, ValidationInfo, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from .stages import DEFAULT_STAGE_MAX_TOKENS, MEMORY_WRITING_STAGES, STAGES

__all__ = ["MEMORY_WRITING_STAGES", "NemoriSettings", "load_settings", "StageLM", "STAGES", "DEFAULT_CACHE_DIR", "DEFAULT_STAGE_MAX_TOKENS",
           "PARTITION_MIN_MESSAGES", "WINDOW_SIZE", "PARTITION_MESSAGE_CHARS", "ANSWER_CONTEXT_TOKENS", "PAPER_FAITHFUL", "NOT_IN_PAPER", "ASSOCIATION_MIN_SIMILARITY", "CONSOLIDATION_MIN_SIMILARITY", "CONSOLIDATION_TOPIC_FLOOR", "LOCAL_F16", "PAPER_EVOKE_THRESHOLD", "EVOKE_THRESHOLDS", "default_evoke_threshold", "DISTILL_CHUNK_MESSAGES"]

DEFAULT_CACHE_DIR = Path.home() / ".cache" / "nemori-dspy"

#: Segments shorter than this many messages become one episode without a P_par call (``partition_min_messages``).
#: 3 because the smallest coherent episode is one exchange — a message and its reply: P_par could only cut a
#: 2-message segment into a question without its answer and an answer without its question, two episodes that
#: each narrate and distill worse than the pair. A 3-message segment can hold a real topic change (an exchange
#: closing and a new one opening), so it still goes to P_par. The paper sends every window to P_par (§3.2.1);
#: 2 keeps that (only a lone message, which has a single partition, skips the call).
PARTITION_MIN_MESSAGES = 3

#: P_par sees each message cut to this many characters (``partition_message_chars``). Where a topic changes shows
#: in a message's opening words, so 160 keeps most turns whole and cuts only long ones (docs/decisions.md).
PARTITION_MESSAGE_CHARS = 160

#: Default cap of the answer context in tokens (``answer_context_tokens``): fewer tokens than the paper's k, m, r fill
#: at no measured loss of score (docs/decisions.md); narratives are kept first, then raw messages and facts by rank.
ANSWER_CONTEXT_TOKENS = 2000

#: The paper's value of every method setting (§3.2-§4.1, Appendix D): ``NemoriSettings(**PAPER_FAITHFUL)`` is the
#: paper's configuration with every addition of ours off (the ``nemori-paper`` eval system). Every field of
#: ``NemoriSettings`` is either here or in ``NOT_IN_PAPER``; a test checks it, so a new setting must record its
#: paper value (or say why the paper has none).
PAPER_FAITHFUL: dict[str, Any] = {
    # cost switches (docs/configuration.md, "Cost switches")
    "consolidation_mode": "per_insight", "narration_mode": "per_group", "partition_min_messages": 2,
    "select_inputs": "narratives", "answer_context_tokens": None, "local_prompt_cache": False,
    "partition_message_chars": None, "anticipate_without_facts": True, "consolidate_within_episode": True,
    # our guards, off: no similarity floor before P_con (top K_m whatever their cosine) or P_sel (top K_e), τ = 0.70
    "consolidation_min_similarity": None, "consolidation_topic_floor": None, "association_min_similarity": None,
    "evoke_threshold": 0.70,
    # our additions, off: no gap split before P_par, no time guard on merge candidates, vector-only answer search,
    # no date pre-resolution (the paper's LLM reasons about "yesterday" itself while forming memory, Appendix B.1)
    "episode_split_gap_hours": None, "association_max_gap_hours": None, "lexical_weight": 0.0,
    "resolve_relative_dates": False,
    # every message carries its own timestamp in the paper's prompts (Appendix D)
    "message_timestamps": "per_message",
    # fixed windows of w = 20 messages (§3.2.1, §4.1)
    "window_size": 20, "hold_open_segment": False,
    # §4.1: K_e = K_m = 5, K_s = 10, k = 10, m = 2k = 20, r = 2 (the defaults here too)
    "association_top_k": 5, "consolidation_top_k": 5, "evoke_top_k": 10, "episodes_top_k": 10, "semantic_top_k": 20,
    "raw_episodes_top_r": 2,
    # Nemori itself: prediction-error distillation (§3.3.2), P_con (§3.3.3), structured semantic memory (§3.3)
    "distillation": "prediction_error", "consolidation": True, "semantic_management": "structured",
    # one P_dis call per episode (§3.3.2)
    "distill_chunk_messages": None, "narrate_chunk_messages": None,
    # zero-shot prompts (Appendix D): no seed demos
    "seed_demos": False,
    # facts in the answer context by similarity (§3.4)
    "facts_order": "similarity",
}

#: Settings the paper has no value for: which model, embedder, store and server run, retries, prompt-size
#: bounds, serving and tracking. They do not switch a method step on or off.
NOT_IN_PAPER: frozenset[str] = frozenset({
    "model", "api_base", "api_key", "temperature", "seed", "max_tokens", "stage_lms", "predictor_classes",
    "judge_model", "judge_prompt", "judge_audit", "adapter", "cache", "num_retries", "parse_retries", "timeout_s",
    "gguf", "models_dir", "local_model_size", "local_memory_model", "local_f16", "n_ctx", "n_threads", "flash_attn", "server_port", "embedder",
    "embedder_path", "embedder_backend", "cache_dir", "store", "db_path", "weaviate_url", "locomo_path",
    "naive_timezone", "summary_max_chars", "max_message_chars", "max_prompt_chars", "api_token",
    "mlflow_tracking_uri", "mlflow_experiment", "mlflow_tracing", "serve_tracing",
})

#: Default cosine floor before P_con (``consolidation_min_similarity``, §3.3.3 guard): the highest floor at which every
#: update and refinement of tests/data/consolidation_pairs.jsonl reaches P_con (``python -m
#: benchmarks.consolidation_floor``; figures in docs/decisions.md).
CONSOLIDATION_MIN_SIMILARITY = 0.40

#: Default topic floor on P_con candidates (``consolidation_topic_floor``, our guard after the one above): cosine
#: with the speakers' names masked. MiniLM's plain cosine is lifted by a shared name, so every candidate list held
#: five entries of the same person. On the 76 labelled pairs (``python -m benchmarks.consolidation_floor --topic``)
#: 0.35 is the highest floor passing 27 of 28 updates (the one lost: "Noor wants to study medicine" → "Noor
#: decided to become an architect instead", masked cosine 0.19) and 12 of 12 refinements, leaking 0 of 36 negatives
#: (9 same-person-other-topic pairs reach P_con without it). On LoCoMo conv-26, 30, 41, 44, 47 sessions 1-3: P_con
#: calls 76 → 52, fact recall unchanged (1 gold observation won, 1 lost, n = 125); docs/decisions.md.
CONSOLIDATION_TOPIC_FLOOR = 0.35

#: Default cosine floor on merge candidates (``association_min_similarity``, §3.2.3 guard): only earlier episodes at
#: or above it reach P_sel. The floor only thins the candidates (MiniLM barely separates continuations from
#: unrelated sessions) and P_sel decides the rest; 0.70 keeps most continuations (``python -m
#: benchmarks.association_guard``; figures in docs/decisions.md).
ASSOCIATION_MIN_SIMILARITY = 0.70

#: Default ``local_f16``: the embedded model sizes served from an F16 copy of their Q4_K_M GGUF. On this 2-core AVX-512
#: machine the 0.5B prefills a 2,000-token prompt 1.33x faster from F16 and generates 0.89x as fast (it answers and
#: partitions: long prompts, short replies); the 1.5B is slower from F16 on both (``python -m benchmarks.gguf_encoding``).
LOCAL_F16 = ("0.5b",)

#: Default w (``window_size``): the top of the paper's flat range (Table 11). With ``hold_open_segment`` a window
#: ends at a time gap, so w only bounds one conversation's run, and 40 rarely cuts a LoCoMo session in two
#: (docs/decisions.md).
WINDOW_SIZE = 40


#: Default run length of P_dis (``distill_chunk_messages``): the 1.5B distiller writes about six facts per call
#: however long the episode, and with one episode per LoCoMo session (~19 messages) its facts stated a quarter
#: of the session's gold observations. On runs of at most 8 messages, against the same P_ant prediction, fact
#: recall on conv-26 and conv-30 sessions 1-3 went 25.5 → 37.3 (paired over 51 gold observations, +11.8
#: [−3.9, +27.5]); held out (conv-41, conv-43) 27.7 → 38.3, +10.6 [−4.3, +25.5]; pooled over 98 observations +11.2
#: [+0.0, +21.4], for ~1-3 min more construction per 120 turns (more P_dis and P_con calls; docs/decisions.md).
DISTILL_CHUNK_MESSAGES = 8

#: Default run length of P_nar (``narrate_chunk_messages``): with one episode per LoCoMo session (~19-27 messages) the
#: 1.5B narrator loops (a sentence cycle repeated to its 384-token cap; two of the main job's three narratives) and
#: what the session says after the loop never reaches the narrative. On runs of at most 8 messages (the runs P_dis
#: reads), narratives joined: conv-41, conv-44, conv-47 sessions 1-3 (not used for the choice), narrative coverage
#: of the gold observations 20.3 → 48.6, paired +28.4 [+13.5, +43.2] (n = 74; 29 gained, 8 lost), faithfulness
#: 66.7 → 73.6, fact recall unchanged (28.4 → 28.4); conv-26 sessions 1-3: coverage 25.0 → 35.7 but faithfulness
#: 83.3 → 50.0; ~3 P_nar calls per episode instead of 1 (docs/decisions.md).
NARRATE_CHUNK_MESSAGES = 8

#: τ of the paper, tuned for text-embedding-3-small (§4.1); the default for embedders without a measured τ.
PAPER_EVOKE_THRESHOLD = 0.70
#: Default τ per embedder, from ``python -m benchmarks.evoke_threshold``: MiniLM's cosines are lower than
#: text-embedding-3-small's, so the paper's 0.70 evokes almost nothing with it (figures in docs/decisions.md).
EVOKE_THRESHOLDS = {"text-embedding-3-small": PAPER_EVOKE_THRESHOLD, "openai/text-embedding-3-small": PAPER_EVOKE_THRESHOLD,
                    "all-MiniLM-L6-v2": 0.40, "sentence-transformers/all-MiniLM-L6-v2": 0.40}


def default_evoke_threshold(embedder: str) -> float:
    """τ for ``embedder`` when ``evoke_threshold`` is not set: ``EVOKE_THRESHOLDS`` (measured), else the paper's 0.70."""
    return EVOKE_THRESHOLDS.get(embedder.strip(), PAPER_EVOKE_THRESHOLD)


class StageLM(BaseModel):
    """Per-stage override of the LLM: a litellm model string and/or a max_tokens cap."""

    model: str | None = Field(default=None, description="litellm model string, or 'local:0.5b' / 'local:1.5b' (an "
                              "embedded server of that size, shared with a local judge of that size); None = the "
                              "main model")
    max_tokens: int | None = Field(default=None, gt=0, description="output token cap for this stage")

    @field_validator("model")
    @classmethod
    def _local_size(cls, v: str | None) -> str | None:
        if isinstance(v, str) and v.startswith("local:") and v[6:] not in ("0.5b", "1.5b"):
            raise ValueError(f"unknown local model size {v[6:]!r}; use 'local:0.5b' or 'local:1.5b', "
                             "or a litellm model string")
        return v


class NemoriSettings(BaseSettings):
    """Every knob of nemori-dspy. Env vars use the prefix ``NEMORI_`` (e.g. ``NEMORI_MODEL``).

    Model strings are litellm's: ``openai/gpt-4o-mini``, ``ollama_chat/qwen2.5:1.5b``,
    ``openai/<name>`` with ``api_base`` for any OpenAI-compatible server, or ``local``
    to start the embedded llama.cpp server on ``gguf``.
    """

    model_config = SettingsConfigDict(env_prefix="NEMORI_", env_file=".env", extra="ignore",
                                      env_nested_delimiter="__")

    # --- models
    model: str = Field(default="local", description="litellm model string, or 'local' for the embedded llama.cpp server")
    api_base: str | None = Field(default=None, description="base URL of an OpenAI-compatible server")
    api_key: SecretStr | None = Field(default=None, description="API key; never logged")
    temperature: float = Field(default=0.0, ge=0.0, le=2.0)
    seed: int = Field(default=0, description="sampling seed sent to the provider")
    max_tokens: int = Field(default=1024, gt=0, description="default output token cap per call")
    stage_lms: dict[str, StageLM] = Field(default_factory=dict, description="per-stage model/max_tokens overrides, keyed by STAGES")
    predictor_classes: dict[str, str] = Field(default_factory=dict, description="per-stage DSPy predictor class, e.g. {'answer': 'dspy.ChainOfThought'}")
    judge_model: str | None = Field(default=None, description="model for the LLM judge: a litellm string, "
                                    "'local:0.5b' / 'local:1.5b' (a second embedded server unless it is the main model's size), "
                                    "or unset / 'none' = the main model")
    judge_prompt: Literal["generous", "strict", "both"] = Field(
        default="generous", description="LoCoMo judge prompt: generous (mem0's rules, scores 'judge'), strict (key "
        "facts, dates at the gold's precision; scores 'judge_strict') or both side by side")
    judge_audit: int = Field(default=10, ge=0, description="judge audit: calibration pairs (gold answer must be "
                             "judged CORRECT, a known-wrong answer WRONG) scored beside every judged eval; 0 = off")
    adapter: Literal["chat", "json"] = Field(default="chat", description="DSPy adapter formatting prompts")
    cache: bool = Field(default=True, description="DSPy response cache; retries always bypass it")
    num_retries: int = Field(default=3, ge=0, description="litellm retries on timeouts/5xx/rate limits")
    parse_retries: int = Field(default=1, ge=0, description="re-asks (cache bypassed) when a reply does not parse")
    timeout_s: float = Field(default=600.0, gt=0, description="per-call timeout in seconds")

    # --- embedded local model (llama.cpp server)
    gguf: str | None = Field(default=None, description="path to a GGUF file, or 'hf:<repo>/<file>' to download")
    models_dir: Path | None = Field(default=None, description="folder holding the Qwen2.5-Coder GGUF files and all-MiniLM-L6-v2/ (e.g. assembled by an offline-models tool); unset: $NEMORI_OFFLINE_MODELS, ~/.cache/nemori-offline-models, then the Hugging Face Hub")
    local_model_size: Literal["0.5b", "1.5b"] = Field(default="0.5b", description="which Qwen2.5-Coder GGUF 'local' uses when gguf is unset")
    local_memory_model: Literal["0.5b", "1.5b"] | None = Field(
        default="1.5b", description="with model='local': the embedded model size that writes memory, every stage in "
        "MEMORY_WRITING_STAGES (all construction stages but P_par), unless stage_lms names a model for one; it shares "
        "a server with a local judge of that size (the 0.5B model writes poor memory). "
        "None = the main model for every stage")
    local_f16: list[Literal["0.5b", "1.5b"]] = Field(
        default_factory=lambda: list(LOCAL_F16), description="embedded default GGUFs of these sizes are served "
        "from an F16 copy of their Q4_K_M weights, written once beside the file (the same weights to fp16 rounding): "
        "llama.cpp's CPU prefill of the 0.5B is ~1.3x faster from F16, the 1.5B's slower (python -m "
        "benchmarks.gguf_encoding); [] = the Q4_K_M files as they are. JSON in the env: NEMORI_LOCAL_F16='[]'")
    n_ctx: int = Field(default=8192, gt=0, description="llama.cpp context length")
    n_threads: int = Field(default=2, gt=0, description="llama.cpp threads")
    flash_attn: bool = Field(default=True, description="embedded llama.cpp server: flash attention (--flash_attn); "
                             "part of the memory key, since outputs are not bit-identical")
    server_port: int | None = Field(default=None, description="port of the embedded server; None = a free one")

    # --- embedder
    embedder: str = Field(default="all-MiniLM-L6-v2", description="'all-MiniLM-L6-v2' (local; see embedder_backend), 'hashing' or 'hashing-<dim>' (no model: tests, smoke checks), or a litellm embedding model string")
    embedder_path: Path | None = Field(default=None, description="folder of the local MiniLM model (config.json, tokenizer.json, onnx/ or model.safetensors)")
    embedder_backend: Literal["auto", "onnx", "torch"] = Field(default="auto", description="how all-MiniLM-L6-v2 runs: 'onnx' (ONNX Runtime via fastembed, no torch; needs <model folder>/onnx/ from python -m nemori_dspy.onnx_export), 'torch' (sentence-transformers), 'auto' (onnx when its folder is there, else torch); same vectors (cosine >= 0.999), same embedder name")

    # --- store
    cache_dir: Path = Field(default=DEFAULT_CACHE_DIR, description="eval memory stores reused across runs, downloads")
    store: Literal["sqlite", "weaviate"] = Field(default="sqlite")
    db_path: Path = Field(default=DEFAULT_CACHE_DIR / "memory.sqlite3", description="SQLite file of the embedded store")
    weaviate_url: str | None = Field(default=None, validate_default=True,
                                     description="Weaviate HTTP URL, e.g. http://localhost:8080 (needed when store='weaviate')")
    locomo_path: Path | None = Field(default=None, description="LoCoMo file used when --data is not given (else the upstream "
                                     "locomo10.json is downloaded into cache_dir)")

    # --- method knobs (§4.1, Appendix C)
    window_size: int = Field(default=WINDOW_SIZE, ge=1, description="w: buffer size that triggers episode formation "
                             "(§3.2.1); default 40 (WINDOW_SIZE), the paper's 20 in PAPER_FAITHFUL")
    hold_open_segment: bool = Field(
        default=True, description="our addition: a full window that holds a time gap (episode_split_gap_hours) "
        "forms episodes only up to its last gap; the messages after it stay buffered for the next window, since the "
        "conversation they belong to may go on, so no conversation is cut at the window's edge (a flush forms "
        "them). False = the paper's fixed windows of w messages (§3.2.1)")
    episode_split_gap_hours: float | None = Field(
        default=6.0, ge=0, description="our addition: a window is cut where consecutive messages are more than this "
        "many hours apart before P_par sees it (one episode never spans separate conversations); None = off")
    association_top_k: int = Field(default=5, ge=1, description="K_e: candidate episodes for merging (§3.2.3)")
    association_max_gap_hours: float | None = Field(
        default=None, ge=0, description="our addition: only episodes within this many hours of the new one are "
        "merge candidates; None (default) = the paper's behaviour; association_min_similarity is the guard now")
    association_min_similarity: float | None = Field(
        default=ASSOCIATION_MIN_SIMILARITY, ge=-1.0, le=1.0, description="our addition: only earlier episodes "
        "with cosine >= this to the new episode (v = emb(cue ‖ narrative)) go to P_sel as merge candidates; none "
        "→ no P_sel call (association.below_similarity). Stops the small model merging unrelated sessions "
        "without excluding continuations (see ASSOCIATION_MIN_SIMILARITY for the measurement). None = the "
        "paper's behaviour (the top K_e whatever their similarity, §3.2.3)")
    evoke_top_k: int = Field(default=10, ge=0, description="K_s: evoked semantic entries (§3.3.1)")
    evoke_threshold: float | None = Field(
        default=None, ge=-1.0, le=1.0, description="τ: cosine threshold for evocation (§3.3.1); None = the "
        "measured default of the embedder (EVOKE_THRESHOLDS: 0.40 for all-MiniLM-L6-v2), else the paper's 0.70")
    consolidation_top_k: int = Field(default=5, ge=1, description="K_m: entries compared per insight (§3.3.3)")
    consolidation_min_similarity: float | None = Field(
        default=CONSOLIDATION_MIN_SIMILARITY, ge=-1.0, le=1.0, description="our addition: only existing entries "
        "with cosine >= this to the insight (both embedded as bare text) go to P_con (and so can be merged or "
        "retired by it); none above it → the insight is stored as new without an LLM call "
        "(consolidation.below_floor). See CONSOLIDATION_MIN_SIMILARITY for the measurement. None = the paper's "
        "behaviour (the top K_m whatever their similarity, §3.3.3)")
    consolidation_topic_floor: float | None = Field(
        default=CONSOLIDATION_TOPIC_FLOOR, ge=-1.0, le=1.0, description="our addition: a P_con candidate must "
        "also have cosine >= this to the insight with the speakers' names masked (insight_rules.mask_people), so "
        "entries that only share a person's name stay away from P_con (consolidation.other_topic). See "
        "CONSOLIDATION_TOPIC_FLOOR for the measurement. None = the paper's behaviour (no such check)")
    episodes_top_k: int = Field(default=10, ge=0, description="k: episodes retrieved per query (§3.4)")
    semantic_top_k: int = Field(default=20, ge=0, description="m = 2k: semantic entries retrieved (§4.1)")
    lexical_weight: float = Field(
        default=0.3, ge=0.0, le=1.0, description="our addition: weight w of the lexical match in the "
        "answer-path search: episodes/facts are ranked by (1-w)·cosine + w·BM25 over a trigram index (works for "
        "Chinese/Japanese/Korean as for English), each min-max normalised over its candidates (relative score "
        "fusion; Weaviate hybrid alpha = 1-w); construction searches stay cosine only. 0 = the paper's vector-only search")
    raw_episodes_top_r: int = Field(default=2, ge=0, description="r: top episodes whose raw messages enter the answer context (§4.1)")
    distill_chunk_messages: int | None = Field(
        default=DISTILL_CHUNK_MESSAGES, ge=2, description="our addition: P_dis (or the direct distiller) runs on runs of at most "
        "this many of an episode's messages, each against the episode's one P_ant prediction, instead of once on "
        "the whole episode (structured semantic management; flat keeps one call); a small distiller writes about "
        "six facts per call however long the episode "
        "(see DISTILL_CHUNK_MESSAGES). None = the paper (one P_dis call per episode, §3.3.2)")
    narrate_chunk_messages: int | None = Field(
        default=NARRATE_CHUNK_MESSAGES, ge=2, description="our addition: P_nar runs on runs of at most this many of an "
        "episode's messages (the runs P_dis reads, ``message_runs``) and the episode's narrative is the runs' "
        "narratives joined, its cue their distinct cues joined by '; '; a small narrator loops on a whole session "
        "(see NARRATE_CHUNK_MESSAGES). None = the paper (one P_nar call per episode, §3.2.2)")
    distillation: Literal["prediction_error", "direct"] = Field(default="prediction_error", description="Nemori vs Nemori-s (Appendix D.2)")
    consolidation: bool = Field(default=True, description="False = append insights without P_con (Appendix A.2)")
    semantic_management: Literal["structured", "flat"] = Field(
        default="structured", description="structured = semantic entries with evocation and P_con (§3.3); flat = one "
        "running summary per user, the constant evoked context, rewritten by P_sum with each episode's insights "
        "(Appendix A.1, a conceptual illustration in the paper)")
    summary_max_chars: int = Field(default=6000, gt=0, description="flat management: a longer summary is cut at this "
                                   "many characters (oldest text kept, noted as summary_truncated) so P_ant, P_sum "
                                   "and P_ans prompts stay bounded")
    resolve_relative_dates: bool = Field(default=True, description="our addition: write the absolute date next to "
                                         "'last week', 'yesterday', … (from the message timestamp) in messages "
                                         "shown to P_nar, P_dis and P_ans, so small models need not do date "
                                         "arithmetic. False = the paper, whose LLM resolves them while forming "
                                         "memory (Appendix B.1)")
    naive_timezone: str = Field(default="UTC", description="time zone in which timestamps without a UTC offset "
                                "are read when they are ordered or subtracted (naive and offset-carrying messages "
                                "of one user can then be mixed); prompts still show each message's own clock time")
    seed_demos: bool = Field(
        default=True, description="our addition: start each construction stage with its hand-written worked "
        "example(s) (signatures/demos.py: invented people, no LoCoMo text) as DSPy demos, which an optimizer may "
        "replace; zero-shot, the small model echoes field descriptions and copies chat lines. False = the paper's "
        "zero-shot prompts (Appendix D)")
    # --- cost switches (docs/configuration.md "Cost switches"; PAPER_FAITHFUL holds the paper's value of each)
    consolidation_mode: Literal["per_insight", "batched"] = Field(
        default="per_insight", description="P_con per insight (the paper, §3.3.3) or 'batched': every insight of "
        "an episode that has candidates above consolidation_min_similarity in one call, one decision per insight "
        "(same new/merge/conflict semantics; an unparseable or short reply falls back to per-insight calls)")
    narration_mode: Literal["per_group", "batched"] = Field(
        default="per_group", description="P_nar per group (the paper, §3.2.2) or 'batched': every group of a "
        "window in one call (an unparseable reply or a wrong number of episodes falls back to per-group calls)")
    partition_min_messages: int = Field(
        default=PARTITION_MIN_MESSAGES, ge=2, description="segments shorter than this become one episode "
        "without a P_par call (see PARTITION_MIN_MESSAGES); 2 = the paper's behaviour")
    select_inputs: Literal["narratives", "cues"] = Field(
        default="narratives", description="what P_sel sees of the K_e candidates: their cues and narratives "
        "(the paper, §3.2.3) or 'cues' only (dated titles; the new episode keeps its narrative)")
    partition_message_chars: int | None = Field(
        default=PARTITION_MESSAGE_CHARS, gt=0, description="P_par sees each message cut to this many characters "
        "(it needs only where the topic changes, not every detail; P_nar and P_dis still see whole messages); "
        "None = whole messages, the paper's behaviour")
    anticipate_without_facts: bool = Field(
        default=False, description="run P_ant when evocation found no semantic entry (the paper, §3.3.1). False: "
        "with nothing known the prediction is empty without an LLM call, so P_dis keeps everything the episode "
        "says (a guess from a one-line cue alone predicts nothing about these people)")
    consolidate_within_episode: bool = Field(
        default=False, description="show P_con this episode's own pending insights as candidates (the paper "
        "consolidates insight by insight, §3.3.3). False: P_con compares an insight only with entries of earlier "
        "episodes — insights of one episode come from one P_dis reply at one time, so none can update another "
        "(a 'conflict' between them deleted true facts); an exact duplicate of one is still skipped")
    facts_order: Literal["similarity", "chronological"] = Field(
        default="chronological", description="our addition: how the answer context lists the retrieved facts: by "
        "event time, oldest first under 'Known facts (oldest first; a later fact updates an earlier one)', so "
        "of two that disagree the newer is plain and nearest the question; 'similarity' = the paper's rank order (§3.4)")
    answer_context_tokens: int | None = Field(
        default=ANSWER_CONTEXT_TOKENS, gt=0, description="cap of the answer context in tokens (litellm's counter, as the eval "
        "reports context_tokens); every episode's narrative enters first by rank, then episode i's raw "
        "messages (i <= r) and its m/k facts for i = 1, 2, ...; the paper's section order is kept; None = the "
        "paper's k, m, r uncut (max_prompt_chars only)")
    local_prompt_cache: bool = Field(
        default=False, description="embedded llama.cpp server: keep a RAM cache of prompt states (--cache) so "
        "a stage's instruction + demos prefix is reused across interleaved stages, not only from the previous "
        "call (llama-cpp-python always reuses the prefix shared with the previous prompt)")
    message_timestamps: Literal["per_message", "on_change"] = Field(
        default="on_change", description="how prompts date messages: '[YYYY-MM-DD HH:MM]' on every message (the "
        "paper's layout) or 'on_change': the stamp on a line of its own, shown again only where it changes. LoCoMo "
        "dates a whole session with one time, so per-message stamps repeat one time on every line; every message "
        "is still dated by the stamp above it")
    max_message_chars: int = Field(default=4000, gt=0, description="longer messages are cut for prompts and the embedder (noted)")
    max_prompt_chars: int = Field(default=12000, gt=0, description="budget for the messages or context one prompt carries "
                                  "(≈3k tokens at ~4 chars/token, the paper's answer context is ~2.7k tokens, Table 4)")

    # --- serving (nemori-dspy serve http / mcp --http)
    api_token: SecretStr | None = Field(default=None, description="bearer token of the HTTP servers (env "
                                        "NEMORI_API_TOKEN); required to bind a non-loopback host; never logged")

    # --- tracking
    mlflow_tracking_uri: str | None = Field(default=None, description="MLflow URI; None = MLFLOW_TRACKING_URI or sqlite:///mlruns.db")
    mlflow_experiment: str = Field(default="nemori-dspy", description="MLflow experiment of eval runs; optimize logs to <name>-optimize")
    mlflow_tracing: bool = Field(default=True, description="evals trace every LLM call (stage, inputs, outputs, tokens, "
                                 "latency) into their MLflow run; false turns tracing off")
    serve_tracing: bool = Field(default=False, description="serve http / mcp trace each request's and background pass's "
                                "LLM calls into MLflow (experiment '<mlflow_experiment>-serve'; the traces hold the "
                                "users' messages); off by default")

    @field_validator("episode_split_gap_hours", "association_max_gap_hours", "association_min_similarity",
                     "consolidation_min_similarity", "consolidation_topic_floor",
                     "answer_context_tokens", "partition_message_chars", "distill_chunk_messages", "narrate_chunk_messages", mode="before")
    @classmethod
    def _off_words(cls, v: Any) -> Any:
        """``null`` / ``none`` / ``off`` / empty (e.g. from an env var or CLI flag) switch the guard off."""
        if isinstance(v, str) and v.strip().lower() in {"", "null", "none", "off"}:
            return None
        return v

    @field_validator("naive_timezone")
    @classmethod
    def _known_zone(cls, v: str) -> str:
        from .errors import InvalidInputError
        from .types import zone

        try:
            zone(v)
        except InvalidInputError as exc:
            raise ValueError(f"{exc.problem}; {exc.fix}") from None
        return v

    @field_validator("weaviate_url")
    @classmethod
    def _weaviate_needs_url(cls, v: str | None, info: ValidationInfo) -> str | None:
        if info.data.get("store") == "weaviate" and not v:
            raise ValueError("store='weaviate' needs the server's URL: set NEMORI_WEAVIATE_URL "
                             "(e.g. http://localhost:8080), or NEMORI_STORE=sqlite")
        return v

    @field_validator("judge_model", mode="before")
    @classmethod
    def _judge_model(cls, v: Any) -> Any:
        """``null``/``none``/empty → None (the main model); ``local:<size>`` must name a known size."""
        if isinstance(v, str) and v.strip().lower() in {"", "null", "none"}:
            return None
        if isinstance(v, str) and v.startswith("local:") and v[6:] not in ("0.5b", "1.5b"):
            raise ValueError(f"unknown local judge size {v[6:]!r}; use 'local:0.5b' or 'local:1.5b', "
                             "or a litellm model string")
        return v

    @field_validator("stage_lms", "predictor_classes")
    @classmethod
    def _known_stages(cls, v: dict) -> dict:
        unknown = sorted(set(v) - set(STAGES))
        if unknown:
            raise ValueError(f"unknown stage(s) {unknown}; valid stages: {', '.join(STAGES)}")
        return v

    @model_validator(mode="after")
    def _embedder_tau(self) -> "NemoriSettings":
        """Fill an unset τ with the embedder's measured default (``default_evoke_threshold``)."""
        if self.evoke_threshold is None:
            self.evoke_threshold = default_evoke_threshold(self.embedder)
        return self

    def stage_max_tokens(self, stage: str) -> int:
        """Output cap for ``stage``: its override, else ``DEFAULT_STAGE_MAX_TOKENS``, else ``max_tokens``."""
        o = self.stage_lms.get(stage)
        if o and o.max_tokens:
            return o.max_tokens
        return min(DEFAULT_STAGE_MAX_TOKENS.get(stage, self.max_tokens), self.max_tokens)

    def public_dict(self) -> dict:
        """The resolved config as plain JSON-able values, with secrets removed (for MLflow)."""
        d = self.model_dump(mode="json", exclude={"api_key", "api_token"})
        d["api_key_set"] = self.api_key is not None
        d["api_token_set"] = self.api_token is not None
        return d


def load_settings(**overrides: Any) -> NemoriSettings:
    """``NemoriSettings`` from the environment / ``.env`` plus ``overrides``, with errors a user can act on.

    Raises:
        ConfigError: a value is invalid; the message names each field with its env var,
            the value given, what is allowed, and ends with ``Fix:``.
    """
    from .errors import ConfigError

    try:
        return NemoriSettings(**overrides)
    except ValidationError as exc:
        lines = []
        for err in exc.errors():
            name = ".".join(str(p) for p in err["loc"]) or "settings"
            top = str(err["loc"][0]) if err["loc"] else ""
            where = (f"given as --{top.replace('_', '-')} / {top}=" if top in overrides
                     else f"env NEMORI_{name.upper()}")
            lines.append(f"{name} ({where}): {err['msg']}; got {err.get('input')!r}")
        raise ConfigError("invalid settings:\n  " + "\n  ".join(lines) + "\nFix: change the value in the "
                          "environment, .env or the matching CLI flag (`nemori-dspy eval locomo --help`).") from None
