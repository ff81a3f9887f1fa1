"""Local model serving: seconds per call and tokens/s for each stage's typical prompt, with and without
llama.cpp's prefix reuse, on the real local GGUF (default Qwen2.5-Coder-0.5B) served by
``nemori_dspy.local_server.LlamaServer``.

Prompts are what the pipeline sends: the stage's signature formatted by the production adapter
(``nemori_dspy.adapters.make_adapter``) around synthetic LoCoMo-like inputs of typical size. llama.cpp keeps
the previous prompt's tokens and re-computes only from the first token that differs, so:

* **no reuse**: the call follows a call of *another* stage (different system prompt: only the chat
  template's first tokens are shared);
* **prefix reuse**: the call follows a call of the *same* stage with other inputs (its whole system
  prompt — instructions, field structure — is reused).

Each figure is one call per stage and mode (``--repeats`` for more); output is capped at ``--max-tokens``.
Tokens/s = (prompt + completion tokens) / seconds, and completion tokens/s alone. Minutes on 2 cores.

usage: python -m benchmarks.local_serving [--size 0.5b] [--max-tokens 48] [--repeats 1] [--stages all]
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import httpx

from benchmarks.framework_overhead import synthetic_messages
from benchmarks.results_io import cli_description, table, write_result
from nemori_dspy.adapters import make_adapter
from nemori_dspy.config import NemoriSettings
from nemori_dspy.local_server import LlamaServer
from nemori_dspy.stages import STAGES as ALL_STAGES

__all__ = ["STAGES", "typical_inputs", "stage_messages", "timed_call", "run", "main"]

def _lines(n: int, seed: int) -> list[str]:
    return [f"[{m['timestamp'][:16].replace('T', ' ')}] {m['speaker']}: {m['content']}"
            for m in synthetic_messages(n, seed=seed)]


def typical_inputs(stage: str, seed: int = 0) -> dict[str, Any]:
    """Inputs of typical size for ``stage`` (one of ``STAGES``): a 20-turn window, an 8-turn episode, 5 known facts,
    5 candidate entries, an answer context of 10 episodes and 20 facts (``seed`` varies the text, not the size).

    Raises:
        KeyError: ``stage`` is not measured here.
    """
    return _typical_inputs(seed)[stage]


def _typical_inputs(seed: int) -> dict[str, dict[str, Any]]:
    """stage → its typical inputs (see ``typical_inputs``)."""
    msgs = _lines(20, seed)
    facts = [f"Caroline mentioned fact {seed}-{i}: she enjoys topic {i} a lot." for i in range(20)]
    episode = "\n".join(msgs[:8])
    return {
        "partition": {"messages": "\n".join(f"{i + 1}. {m}" for i, m in enumerate(msgs)), "message_count": 20},
        "narrate": {"messages": episode},
        "anticipate": {"episode_cue": f"Caroline and Melanie talk about week {seed}", "known_facts": facts[:5]},
        "distill": {"episode_messages": episode, "predicted_episode": "They talked about their week."},
        "consolidate": {"insight": facts[0], "existing_entries": "\n".join(f"[{i}] {f}" for i, f in enumerate(facts[1:6]))},
        "answer": {"context": "\n".join([f"Episode {i}: " + " ".join(msgs[i:i + 3]) for i in range(10)] + facts),
                   "question": f"When did Caroline go to the support group (case {seed})?"},
    }


#: the stages measured (those with typical inputs), in pipeline order (``nemori_dspy.stages.STAGES``).
STAGES = tuple(s for s in ALL_STAGES if s in _typical_inputs(0))


def stage_messages(stage: str, seed: int, adapter: Any) -> list[dict[str, Any]]:
    """The chat messages the pipeline would send for ``stage`` (no demos)."""
    from nemori_dspy.signatures import SIGNATURES

    return adapter.format(SIGNATURES[stage], [], typical_inputs(stage, seed))


def timed_call(client: httpx.Client, base: str, messages: list[dict[str, Any]], max_tokens: int,
          with_text: bool = False) -> dict[str, Any]:
    """One chat completion at temperature 0: seconds, prompt and completion tokens (and the reply, ``with_text``)."""
    t0 = time.perf_counter()
    r = client.post(f"{base}/chat/completions", json={"model": "local", "messages": messages, "temperature": 0.0,
                                                      "max_tokens": max_tokens, "seed": 0})
    r.raise_for_status()
    seconds = time.perf_counter() - t0
    u = r.json()["usage"]
    out = {"seconds": seconds, "prompt_tokens": u["prompt_tokens"], "completion_tokens": u["completion_tokens"]}
    if with_text:
        out["text"] = r.json()["choices"][0]["message"]["content"]
    return out


def _figures(calls: list[dict[str, float]]) -> dict[str, float]:
    s = sum(c["seconds"] for c in calls)
    p, c = sum(x["prompt_tokens"] for x in calls), sum(x["completion_tokens"] for x in calls)
    return {"seconds_per_call": s / len(calls), "prompt_tokens": p / len(calls), "completion_tokens": c / len(calls),
            "tokens_per_s": (p + c) / s, "completion_tokens_per_s": c / s}


def run(settings: NemoriSettings, stages: list[str], max_tokens: int, repeats: int) -> dict[str, Any]:
    """Start the server, then per stage: ``repeats`` calls after another stage's call (no reuse) and
    ``repeats`` calls after the same stage's call (reuse). Returns figures per stage and mode."""
    adapter = make_adapter(settings.adapter)
    out: dict[str, Any] = {}
    with LlamaServer.from_settings(settings) as server, httpx.Client(timeout=600) as client:
        out["server_startup_s"] = server.startup_s
        out["server"] = {k: v for k, v in server.flags.items() if k != "port"}
        for i, stage in enumerate(stages):
            other = stages[(i + 1) % len(stages)] if len(stages) > 1 else None
            cold, warm = [], []
            for r in range(repeats):
                if other is not None:
                    timed_call(client, server.api_base, stage_messages(other, 100 + r, adapter), 1)
                cold.append(timed_call(client, server.api_base, stage_messages(stage, 2 * r, adapter), max_tokens))
                warm.append(timed_call(client, server.api_base, stage_messages(stage, 2 * r + 1, adapter), max_tokens))
            out[stage] = {"no_reuse": _figures(cold), "prefix_reuse": _figures(warm)}
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Command line: run, print the table, write ``results/local_serving.json``."""
    ap = argparse.ArgumentParser(description=cli_description(__doc__))
    ap.add_argument("--size", default="0.5b", choices=["0.5b", "1.5b"], help="local model (local_model_size)")
    ap.add_argument("--max-tokens", type=int, default=48, help="output cap per call")
    ap.add_argument("--repeats", type=int, default=1, help="calls per stage and mode")
    ap.add_argument("--stages", default="all", help="comma-separated stages (default: all six)")
    ap.add_argument("--out-dir", help="where the JSON goes (default benchmarks/results/)")
    a = ap.parse_args(argv)
    stages = list(STAGES) if a.stages == "all" else [s.strip() for s in a.stages.split(",")]
    f = run(NemoriSettings(local_model_size=a.size, _env_file=None), stages, a.max_tokens, a.repeats)
    rows = []
    for stage in stages:
        for mode in ("no_reuse", "prefix_reuse"):
            x = f[stage][mode]
            rows.append([stage, mode.replace("_", " "), f"{x['prompt_tokens']:.0f}", f"{x['completion_tokens']:.0f}",
                         f"{x['seconds_per_call']:.2f}", f"{x['tokens_per_s']:.0f}", f"{x['completion_tokens_per_s']:.1f}"])
    print(f"server ready in {f['server_startup_s']:.1f} s ({f['server']['gguf_name']}, {f['server']['n_threads']} threads)")
    print(table(["stage", "mode", "prompt tok", "output tok", "s / call", "tok/s (all)", "output tok/s"], rows))
    print("target (issue 10): fewer seconds per call with prefix reuse than without; <= 15 s per Nemori answer")
    print(f"written {write_result('local_serving', vars(a), f, a.out_dir)}")
    return f


if __name__ == "__main__":
    main()
