"""Context builders of the baselines that share Nemori's answer signature: Full Context and RAG-4096 (§4.1)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from nemori_dspy.embedders import Embedder
from nemori_dspy.formatting import clip
from nemori_dspy.temporal import annotate_relative_dates
from nemori_dspy.types import Message

__all__ = ["render_turn", "full_context", "RagIndex", "CHARS_PER_TOKEN", "ANSWER_RESERVE_TOKENS", "CONTEXT_FILL",
           "context_budget_chars"]

#: rough English chars per token, used to turn token budgets into character budgets.
CHARS_PER_TOKEN = 4

#: tokens of the model's context window (``n_ctx``) kept free of baseline context: P_ans's instruction and
#: field labels, the question, and the reply (the answer stage's cap is 64 tokens by default).
ANSWER_RESERVE_TOKENS = 1024

#: share of the remaining tokens a baseline context (full-context, RAG) may fill. ``CHARS_PER_TOKEN`` is an
#: English average and names, dates and numbers tokenise denser, so a quarter is kept as margin: a context at
#: the budget must never overflow ``n_ctx`` and be cut by the server.
CONTEXT_FILL = 0.75


def context_budget_chars(n_ctx: int) -> int:
    """Characters of context the full-context and RAG baselines may send to a model of ``n_ctx`` tokens:
    ``(n_ctx - ANSWER_RESERVE_TOKENS) * CHARS_PER_TOKEN * CONTEXT_FILL`` (21,504 for n_ctx = 8192)."""
    return int((n_ctx - ANSWER_RESERVE_TOKENS) * CHARS_PER_TOKEN * CONTEXT_FILL)


def render_turn(m: Message, resolve_dates: bool = False) -> str:
    """``[YYYY-MM-DD HH:MM] speaker: content``; ``resolve_dates`` annotates relative dates as Nemori's
    prompts do (``NemoriSettings.resolve_relative_dates``), so baselines and Nemori see the same turns."""
    content = annotate_relative_dates(m.content, m.timestamp) if resolve_dates else m.content
    return f"[{m.timestamp:%Y-%m-%d %H:%M}] {m.speaker}: {content}"


def full_context(messages: Sequence[Message], budget_chars: int,
                 resolve_dates: bool = False) -> tuple[str, list[str], bool]:
    """The whole conversation, or — when it does not fit ``budget_chars`` — its most recent turns that do.

    Returns:
        (context, ids of the turns included, truncated?)
    """
    lines, ids, used = [], [], 0
    for m in reversed(messages):
        line = render_turn(m, resolve_dates)
        if used + len(line) + 1 > budget_chars:
            return "\n".join(reversed(lines)), list(reversed(ids)), True
        lines.append(line)
        ids.append(m.id or "")
        used += len(line) + 1
    return "\n".join(reversed(lines)), list(reversed(ids)), False


@dataclass
class RagChunk:
    """Consecutive turns packed up to the chunk size; ``vector`` embeds ``text``."""

    ids: list[str]
    text: str
    vector: np.ndarray = field(repr=False)


class RagIndex:
    """RAG-4096: the raw dialogue cut into chunks of ≤ ``chunk_tokens`` tokens (≈ 4 chars/token), dense
    retrieval with the same embedder as Nemori. One index per user, in memory (rebuilt per run: cheap).

    Note the embedder sees only the first ``max_embed_chars`` of a chunk (MiniLM reads 256 tokens), a known
    weakness of large-chunk RAG that the paper's numbers reflect.
    """

    def __init__(self, embedder: Embedder, chunk_tokens: int = 4096, max_embed_chars: int = 4000,
                 resolve_dates: bool = False) -> None:
        self.embedder, self.chunk_chars, self.max_embed_chars = embedder, chunk_tokens * CHARS_PER_TOKEN, max_embed_chars
        self.resolve_dates = resolve_dates
        self.chunks: dict[str, list[RagChunk]] = {}

    def build(self, user_id: str, messages: Sequence[Message]) -> int:
        """Chunk and embed one user's dialogue; returns the number of chunks."""
        groups: list[list[Message]] = [[]]
        size = 0
        for m in messages:
            n = len(render_turn(m, self.resolve_dates)) + 1
            if groups[-1] and size + n > self.chunk_chars:
                groups.append([])
                size = 0
            groups[-1].append(m)
            size += n
        texts = [clip("\n".join(render_turn(m, self.resolve_dates) for m in g), self.chunk_chars) for g in groups if g]
        vecs = np.asarray(self.embedder.embed([t[: self.max_embed_chars] for t in texts]), dtype=np.float32)
        self.chunks[user_id] = [RagChunk([m.id or "" for m in g], t, v) for g, t, v in zip(groups, texts, vecs)]
        return len(texts)

    def search(self, user_id: str, query: str, budget_chars: int) -> list[RagChunk]:
        """Chunks by decreasing cosine to ``query``, as many as fit ``budget_chars`` (at least one)."""
        chunks = self.chunks.get(user_id, [])
        if not chunks:
            return []
        q = np.asarray(self.embedder.embed([query])[0], dtype=np.float32)
        order = np.argsort(-np.stack([c.vector for c in chunks]) @ q, kind="stable")
        out, used = [], 0
        for i in order:
            if out and used + len(chunks[i].text) > budget_chars:
                break
            out.append(chunks[i])
            used += len(chunks[i].text)
        return out
