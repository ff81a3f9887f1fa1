"""GGUF encoding: seconds per call of the embedded models served from their Q4_K_M file and from its F16 copy
(``NemoriSettings.local_f16``, ``nemori_dspy.local_server.f16_copy``), and whether the two replies are the same.

Each stage's prompt is what the pipeline sends (``benchmarks.local_serving.stage_messages``: the production adapter
around typical LoCoMo-like inputs), at temperature 0. Every measured call follows a call of another stage, so no
prompt prefix is reused. The F16 copy holds the Q4_K_M weights rounded to fp16: replies should match, and the
question is only which layout llama.cpp's CPU kernels run faster here. Decides ``LOCAL_F16`` (``config.py``).

usage: python -m benchmarks.gguf_encoding [--sizes 0.5b,1.5b] [--stages partition,narrate,answer] [--repeats 2]
"""

from __future__ import annotations

import argparse
from typing import Any

import httpx

from benchmarks.local_serving import STAGES, stage_messages, timed_call
from benchmarks.results_io import cli_description, table, write_result
from nemori_dspy.adapters import make_adapter
from nemori_dspy.config import NemoriSettings
from nemori_dspy.local_server import LlamaServer, f16_copy, resolve_gguf

__all__ = ["ENCODINGS", "run", "main"]

#: the encodings compared: the file as downloaded, and its F16 copy.
ENCODINGS = ("q4_k_m", "f16")


def _calls(server: LlamaServer, stages: list[str], repeats: int, max_tokens: int) -> dict[str, list[dict[str, Any]]]:
    """stage → ``repeats`` measured calls (seconds, tokens, reply text), each after another stage's call."""
    adapter = make_adapter("chat")
    out: dict[str, list[dict[str, Any]]] = {}
    with httpx.Client(timeout=600) as client:
        for i, stage in enumerate(stages):
            other = STAGES[(STAGES.index(stage) + 1) % len(STAGES)]
            out[stage] = []
            for r in range(repeats):
                timed_call(client, server.api_base, stage_messages(other, 100 + r, adapter), 1)
                out[stage].append(timed_call(client, server.api_base, stage_messages(stage, r, adapter), max_tokens,
                                             with_text=True))
    return out


def run(sizes: list[str], stages: list[str], repeats: int, max_tokens: int) -> dict[str, Any]:
    """Per size and encoding: start the server on that file, time ``repeats`` calls per stage.

    Returns:
        ``{size: {encoding: {"gguf": name, "stages": {stage: [call, ...]}}}}``; a call is ``{"seconds",
        "prompt_tokens", "completion_tokens", "text"}``.
    Raises:
        ConfigError / ModelServerError: a model file is missing or its server did not start.
    """
    out: dict[str, Any] = {}
    for size in sizes:
        s = NemoriSettings(local_model_size=size, local_f16=[], _env_file=None)
        q4 = resolve_gguf(s)
        paths = {"q4_k_m": q4, "f16": f16_copy(q4, fallback_dir=s.cache_dir / "models")}
        out[size] = {}
        for enc in ENCODINGS:
            with LlamaServer(paths[enc], n_ctx=s.n_ctx, n_threads=s.n_threads, seed=s.seed,
                             flash_attn=s.flash_attn) as server:
                out[size][enc] = {"gguf": paths[enc].name, "stages": _calls(server, stages, repeats, max_tokens)}
    return out


def _rows(f: dict[str, Any], stages: list[str]) -> list[list[str]]:
    rows = []
    for size, encs in f.items():
        for stage in stages:
            a, b = encs["q4_k_m"]["stages"][stage], encs["f16"]["stages"][stage]
            sa, sb = (sum(c["seconds"] for c in x) / len(x) for x in (a, b))
            same = sum(x["text"] == y["text"] for x, y in zip(a, b))
            rows.append([size, stage, f"{a[0]['prompt_tokens']:.0f}", f"{sum(c['completion_tokens'] for c in a) / len(a):.0f}",
                         f"{sa:.2f}", f"{sb:.2f}", f"{sa / sb:.2f}", f"{same}/{len(a)}"])
    return rows


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Command line: run, print the table, write ``results/gguf_encoding.json``."""
    ap = argparse.ArgumentParser(description=cli_description(__doc__))
    ap.add_argument("--sizes", default="0.5b,1.5b", help="comma-separated model sizes")
    ap.add_argument("--stages", default="partition,narrate,answer", help="comma-separated stages")
    ap.add_argument("--repeats", type=int, default=2, help="measured calls per stage and encoding")
    ap.add_argument("--max-tokens", type=int, default=48, help="output cap per call")
    ap.add_argument("--out-dir", help="where the JSON goes (default benchmarks/results/)")
    a = ap.parse_args(argv)
    sizes, stages = a.sizes.split(","), a.stages.split(",")
    f = run(sizes, stages, a.repeats, a.max_tokens)
    print(table(["size", "stage", "prompt tok", "output tok", "s / call Q4_K_M", "s / call F16", "Q4_K_M / F16",
                 "same reply"], _rows(f, stages)))
    print("Q4_K_M / F16 > 1: the F16 copy is faster; LOCAL_F16 lists the sizes where it is")
    print(f"written {write_result('gguf_encoding', vars(a), f, a.out_dir)}")
    return f


if __name__ == "__main__":
    main()
