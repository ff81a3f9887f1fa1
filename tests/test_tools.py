"""DSPy tools over ``Memory``: a ``dspy.ReAct`` agent (scripted LM through the real ChatAdapter)
remembers in one session and recalls in the next, on a new ``Memory`` over the same SQLite file."""

from __future__ import annotations

import json
from pathlib import Path

import dspy
import pytest

from nemori_dspy.config import NemoriSettings
from nemori_dspy.embedders import HashingEmbedder
from nemori_dspy.errors import InvalidInputError
from nemori_dspy.memory import Memory
from nemori_dspy.store.sqlite import SQLiteStore
from nemori_dspy.tools import MemoryOps, memory_tools

from .fakes import ScriptedLM, chat_reply, default_responders


class MemoryAgent(dspy.Signature):
    """Chat with the user as a helpful assistant that keeps long-term memory across sessions."""

    message: str = dspy.InputField(desc="the user's message")
    reply: str = dspy.OutputField(desc="the assistant's reply")


def react_step(i: dict[str, str]) -> str:
    """First step: 'remember: X' → remember X; anything else → search it. Then finish."""
    msg = i["message"]
    if "observation_0" in i:
        return chat_reply(next_thought="I have what I need.", next_tool_name="finish", next_tool_args={})
    if msg.lower().startswith("remember:"):
        fact = msg.split(":", 1)[1].strip()
        return chat_reply(next_thought="The user wants me to keep this.", next_tool_name="remember",
                          next_tool_args={"messages": [{"content": fact, "speaker": "user",
                                                        "timestamp": "2024-05-08T10:00:00"}]})
    return chat_reply(next_thought="Let me look in memory.", next_tool_name="search_memory",
                      next_tool_args={"query": msg, "top_k": 3})


def extract(i: dict[str, str]) -> str:
    """Reply from what the first observation returned (the agent has no other knowledge)."""
    obs = json.loads(i.get("observation_0") or "{}")
    if "stored" in obs:
        return chat_reply(reasoning="saved", reply=f"Noted ({len(obs['stored'])} stored).")
    facts = [h["text"] for h in obs.get("semantic", [])] + [h["narrative"] for h in obs.get("episodes", [])]
    return chat_reply(reasoning="from memory", reply=facts[0] if facts else "I don't remember that.")


@pytest.fixture
def agent_lm():
    lm = ScriptedLM({**default_responders(), "ReAct": react_step, "MemoryAgent": extract})
    with dspy.context(lm=lm, adapter=dspy.ChatAdapter()):
        yield lm


def session(db: Path, user: str, message: str) -> dspy.Prediction:
    """One agent session: a fresh store + Memory on the file, a ReAct agent with the memory tools."""
    store = SQLiteStore(db)
    try:
        memory = Memory(store, HashingEmbedder(64), NemoriSettings(window_size=20))
        agent = dspy.ReAct(MemoryAgent, tools=memory_tools(memory, user), max_iters=4)
        return agent(message=message)
    finally:
        store.close()


def test_react_agent_remembers_across_sessions(tmp_path: Path, agent_lm):
    db = tmp_path / "agent.db"
    first = session(db, "sam", "remember: my dog is called Rex and he is three")
    assert first.trajectory["tool_name_0"] == "remember"
    assert json.loads(first.trajectory["observation_0"])["episodes"] == 1
    assert first.reply.startswith("Noted")

    second = session(db, "sam", "what is my dog called?")
    assert second.trajectory["tool_name_0"] == "search_memory"
    assert "Rex" in second.reply                       # recalled from the first session's store
    assert agent_lm.calls["ReAct"] == 4 and agent_lm.calls["MemoryAgent"] == 2

    other = session(db, "tom", "what is my dog called?")  # another user's memory is not searched
    assert other.reply == "I don't remember that."


def test_tools_have_typed_args_and_docstrings(tmp_path: Path, agent_lm):
    store = SQLiteStore(tmp_path / "m.db")
    tools = {t.name: t for t in memory_tools(Memory(store, HashingEmbedder(64)), "u1")}
    assert set(tools) == {"remember", "search_memory", "answer_from_memory", "forget"}
    assert tools["search_memory"].args["query"]["type"] == "string"
    assert tools["search_memory"].args["top_k"]["type"] == "integer"
    assert tools["remember"].args["messages"]["type"] == "array"
    assert all(len(t.desc) > 40 for t in tools.values())
    with pytest.raises(InvalidInputError):
        memory_tools(Memory(store, HashingEmbedder(64)), "bad\nid")
    store.close()


def test_tool_operations_answer_and_forget(tmp_path: Path, agent_lm):
    store = SQLiteStore(tmp_path / "m.db")
    memory = Memory(store, HashingEmbedder(64), NemoriSettings(window_size=20))
    tools = {t.name: t for t in memory_tools(memory, "u1")}
    stored = json.loads(tools["remember"](messages=[{"content": "I moved to Lisbon", "id": "x1",
                                                     "metadata": {"session": "s1"}}]))
    assert stored["stored"] == ["x1"] and stored["pending"] == 0
    again = json.loads(tools["remember"](messages=[{"content": "I moved to Lisbon", "id": "x1"}]))
    assert again["duplicates"] == ["x1"] and again["stored"] == []
    hits = json.loads(tools["search_memory"](query="Lisbon"))
    assert hits["episodes"] and hits["semantic"]
    assert json.loads(tools["answer_from_memory"](question="Where do I live?"))["answer"] == "7 May 2023"
    sem_id = hits["semantic"][0]["id"]
    out = json.loads(tools["forget"](entry_id=sem_id))                  # a fact: its conversation goes too
    assert out["deleted"] == "semantic" and out["id"] == sem_id and sem_id in out["semantic"]
    assert out["messages"] == ["x1"] and out["episodes"] == [hits["episodes"][0]["id"]]
    assert "error" in json.loads(tools["forget"](entry_id=sem_id))      # already gone: an error the LM can read
    assert MemoryOps(memory).search("u1", "Lisbon") == {"episodes": [], "semantic": []}
    json.loads(tools["remember"](messages=[{"content": "I moved to Porto", "id": "x2"}]))
    out = json.loads(tools["forget"](entry_id="x2"))                    # a message id: derived memory goes too
    assert out["deleted"] == "message" and out["episodes"]
    assert MemoryOps(memory).search("u1", "Porto") == {"episodes": [], "semantic": []}
    err = json.loads(tools["remember"](messages=[{"content": "  "}]))
    assert "messages[0].content" in err["error"]
    store.close()
