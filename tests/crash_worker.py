"""Subprocess for the crash test: ingest a LoCoMo-schema conversation into DB with a prompt-hash scripted LM.

usage: python -m tests.crash_worker DB LOCOMO_JSON [--slow SECONDS]
Prints "ready" once imports are done, then "done" after the final flush. With the environment variable
NEMORI_CRASH_AFTER_CALLS=N the process SIGKILLs itself when its N-th LLM call starts (a crash point
measured in progress, not wall time, so it lands mid-pipeline on fast and slow machines alike).
"""

from __future__ import annotations

import os
import signal
import sys
import time

import dspy

from nemori_dspy.config import NemoriSettings
from nemori_dspy.embedders import HashingEmbedder
from nemori_dspy.eval.locomo import load_locomo
from nemori_dspy.memory import Memory
from nemori_dspy.store.sqlite import SQLiteStore
from tests.fakes import ScriptedLM, replay_responders


def hash_responders(slow: float) -> dict:
    """``replay_responders()`` (replies depend only on the prompt, so a replay after a crash gets the same
    ones), each call delayed by ``slow`` seconds, and the process SIGKILLs itself when call number
    ``$NEMORI_CRASH_AFTER_CALLS`` starts."""
    crash_at = int(os.environ.get("NEMORI_CRASH_AFTER_CALLS", "0"))
    calls = [0]

    def delayed(fn):
        def inner(i):
            calls[0] += 1
            if calls[0] == crash_at:
                os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(slow)
            return fn(i)
        return inner

    return {k: delayed(v) for k, v in replay_responders().items()}


def main(db: str, data: str, slow: float) -> None:
    dspy.configure_cache(enable_disk_cache=False, enable_memory_cache=False)
    conv = load_locomo(data)[0]
    lm = ScriptedLM(hash_responders(slow))
    dspy.configure(lm=lm, adapter=dspy.ChatAdapter())
    mem = Memory(SQLiteStore(db), HashingEmbedder(64), NemoriSettings(window_size=20, cache=False))
    print("ready", flush=True)
    for i in range(0, len(conv.messages), 20):
        mem.add_messages(conv.sample_id, conv.messages[i:i + 20])
    mem.flush(conv.sample_id)
    print("done", flush=True)


if __name__ == "__main__":
    slow = float(sys.argv[sys.argv.index("--slow") + 1]) if "--slow" in sys.argv else 0.0
    main(sys.argv[1], sys.argv[2], slow)
