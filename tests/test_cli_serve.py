"""Memory commands of the CLI (``add``, ``search``, ``answer``, ``list``, ``delete``, ``export``,
``import``, ``serve token``) through ``nemori_dspy.apps.cli.main`` with a scripted runtime, HashingEmbedder, SQLite."""

from __future__ import annotations

import io
import json
from pathlib import Path

import dspy
import pytest

import nemori_dspy.runtime as runtime
from nemori_dspy.apps.cli import main
from nemori_dspy.runtime import Runtime
from nemori_dspy.apps.serving.http import user_token
from tests.fakes import ScriptedLM, default_responders
from tests.fakes import messages


@pytest.fixture
def env(monkeypatch, tmp_path):
    lm = ScriptedLM(default_responders())

    def fake_build(settings):
        dspy.configure(lm=lm, adapter=dspy.ChatAdapter())
        return Runtime(settings=settings, lm=lm, judge_lm=lm, model_label="scripted")

    monkeypatch.setattr(runtime, "build_runtime", fake_build)
    monkeypatch.setenv("NEMORI_EMBEDDER", "hashing-64")
    monkeypatch.setenv("NEMORI_WINDOW_SIZE", "4")
    monkeypatch.setenv("NEMORI_DB_PATH", str(tmp_path / "cli.db"))
    monkeypatch.setenv("NEMORI_CACHE_DIR", str(tmp_path / "cache"))
    return lm


def jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_add_search_answer_list_delete(env, tmp_path, capsys):
    f = jsonl(tmp_path / "conv.jsonl", messages(6))
    code, out, _ = run(capsys, "add", "--user", "alice", str(f), "--flush")
    assert code == 0 and out.startswith("stored 6, duplicates 0;") and "0 pending" in out
    assert run(capsys, "add", "--user", "alice", str(f))[1].startswith("stored 0, duplicates 6;")

    code, out, _ = run(capsys, "search", "--user", "alice", "puppy called Rex", "--json")
    hits = json.loads(out)
    assert code == 0 and hits["episodes"] and hits["semantic"]
    code, out, _ = run(capsys, "search", "--user", "alice", "puppy")
    assert out.splitlines()[0].startswith("episode ep_")
    assert run(capsys, "answer", "--user", "alice", "When did Alice talk about the puppy?")[1].strip() == "7 May 2023"

    assert run(capsys, "list")[1].split() == ["alice"]
    eps = run(capsys, "list", "--user", "alice")[1].splitlines()
    assert len(eps) == len(hits["episodes"]) and all(l.startswith("ep_") for l in eps)
    sem = run(capsys, "list", "--user", "alice", "--kind", "semantic")[1].splitlines()
    sid = sem[0].split()[0]
    assert run(capsys, "delete", "--user", "alice", sid)[1].strip() == f"deleted semantic {sid}"
    assert run(capsys, "delete", "--user", "alice", "d0")[1].strip() == "deleted message d0"
    left = run(capsys, "list", "--user", "alice", "--kind", "semantic")[1].splitlines()
    assert left  # a fact of a later episode: forgetting it removes that episode's messages too
    fid = left[0].split()[0]
    out = run(capsys, "forget", "--user", "alice", fid)[1].strip()
    assert out.startswith(f"forgot semantic {fid}, ") and " messages" in out
    assert fid not in run(capsys, "list", "--user", "alice", "--kind", "semantic")[1]
    assert run(capsys, "delete", "--user", "alice", "--all")[1].strip() == "deleted user alice"
    assert run(capsys, "list")[1] == ""


def test_add_from_stdin_with_metadata_and_no_process(env, monkeypatch, capsys):
    rows = [{**m, "metadata": {"session": "s1"}} for m in messages(3)]
    monkeypatch.setattr("sys.stdin", io.StringIO("".join(json.dumps(r) + "\n\n" for r in rows)))
    code, out, _ = run(capsys, "add", "--user", "bo", "-", "--no-process")
    assert code == 0 and "stored 3" in out and "3 pending" in out
    assert env.calls == {}  # store only: no LLM call


@pytest.mark.parametrize("content, needle", [
    ('{"speaker": "A", "content": "ok", "timestamp": "2023-01-01"}\nnot json\n', "line 2: not JSON"),
    ('{"speaker": "A", "content": "ok", "timestamp": "2023-01-01"}\n\n{"speaker": "A", "content": "", '
     '"timestamp": "2023-01-01"}\n', "line 3: content"),
    ('{"speaker": "A", "content": "x", "timestamp": "yesterday-ish?"}\n', "line 1: timestamp"),
    ('[1, 2]\n', "line 1: not a JSON object"),
], ids=["not-json", "empty-content", "bad-timestamp", "not-object"])
def test_bad_input_is_one_line_error_and_nothing_stored(env, tmp_path, capsys, content, needle):
    f = tmp_path / "bad.jsonl"
    f.write_text(content)
    code, out, err = run(capsys, "add", "--user", "carl", str(f))
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and needle in err and "Fix:" in err
    assert run(capsys, "list")[1] == ""


@pytest.mark.parametrize("argv, needle", [
    (["add", "--user", "x", "/no/such/file.jsonl"], "cannot read"),
    (["search", "--user", "bad\nid", "q"], "user_id"),
    (["search", "--user", "x", "q", "--metadata", "novalue"], "--metadata"),
    (["delete", "--user", "ghost", "sem_x"], "unknown user"),
    (["delete", "--user", "x"], "either an entry id or --all"),
    (["serve", "http", "--host", "0.0.0.0"], "NEMORI_API_TOKEN"),
    (["serve", "token", "--user", "x"], "NEMORI_API_TOKEN"),
])
def test_errors_are_one_line(env, capsys, argv, needle):
    code, _, err = run(capsys, *argv)
    assert code == 2 and len(err.strip().splitlines()) == 1 and needle in err, err


def test_export_import_round_trip(env, tmp_path, capsys, monkeypatch):
    rows = [{**m, "metadata": {"turn": i}} for i, m in enumerate(messages(10))]
    run(capsys, "add", "--user", "dora", str(jsonl(tmp_path / "c.jsonl", rows)))   # 2 windows + 2 pending
    run(capsys, "delete", "--user", "dora", "d1")                                  # re-buffers part of a window
    code, dump, _ = run(capsys, "export", "--user", "dora")
    assert code == 0
    recs = [json.loads(line) for line in dump.splitlines()]
    kinds = [r["type"] for r in recs]
    assert kinds[0] == "header" and {"message", "episode", "semantic"} <= set(kinds)
    assert sum(k == "message" for k in kinds) == 9

    monkeypatch.setenv("NEMORI_DB_PATH", str(tmp_path / "other.db"))
    f = tmp_path / "dump.jsonl"
    f.write_text(dump)
    code, out, _ = run(capsys, "import", str(f))
    assert code == 0 and out.startswith("imported 9 messages")
    assert run(capsys, "export", "--user", "dora")[1] == dump                      # round trip, byte for byte
    a = run(capsys, "search", "--user", "dora", "puppy", "--json")[1]
    monkeypatch.setenv("NEMORI_DB_PATH", str(tmp_path / "cli.db"))
    assert run(capsys, "search", "--user", "dora", "puppy", "--json")[1] == a

    monkeypatch.setenv("NEMORI_DB_PATH", str(tmp_path / "other.db"))
    code, _, err = run(capsys, "import", str(f))                                   # already there
    assert code == 2 and "already has memory" in err
    assert run(capsys, "import", str(f), "--user", "dora2")[0] == 0
    renamed = run(capsys, "export", "--user", "dora2")[1]
    assert renamed.replace('"user_id": "dora2"', '"user_id": "dora"') == dump
    # the imported memory keeps working: the pending messages are processed by the next flush
    run(capsys, "add", "--user", "dora2", str(jsonl(tmp_path / "more.jsonl", messages(2, "n"))), "--flush")
    assert run(capsys, "search", "--user", "dora2", "puppy", "--json")[0] == 0


def test_import_refuses_another_embedder(env, tmp_path, capsys, monkeypatch):
    run(capsys, "add", "--user", "eli", str(jsonl(tmp_path / "c.jsonl", messages(4))))
    f = tmp_path / "dump.jsonl"
    f.write_text(run(capsys, "export", "--user", "eli")[1])
    monkeypatch.setenv("NEMORI_DB_PATH", str(tmp_path / "other.db"))
    monkeypatch.setenv("NEMORI_EMBEDDER", "hashing-32")
    code, _, err = run(capsys, "import", str(f))
    assert code == 2 and "hashing-64" in err and "Fix:" in err


def test_serve_token_prints_the_user_token(env, capsys, monkeypatch):
    monkeypatch.setenv("NEMORI_API_TOKEN", "server-secret")
    code, out, _ = run(capsys, "serve", "token", "--user", "amy")
    assert code == 0 and out.strip() == user_token("server-secret", "amy")


def test_version_status_flush_history_update_and_json_output(env, tmp_path, capsys):
    from importlib.metadata import version

    assert run(capsys, "--version")[1].strip() == f"nemori-dspy {version('nemori-dspy')}"
    f = jsonl(tmp_path / "conv.jsonl", messages(6))
    code, out, _ = run(capsys, "add", "--user", "alice", str(f), "--no-process", "--json")
    added = json.loads(out)
    assert code == 0 and added["accepted"] == 6 and added["status"]["pending"] == 6
    st = json.loads(run(capsys, "status", "--user", "alice", "--json")[1])
    assert st["user_id"] == "alice" and st["pending"] == 6 and st["episodes"] == 0 and "counters" not in st
    assert run(capsys, "status", "--user", "nobody")[1].strip() == "nobody: nothing stored"

    code, out, _ = run(capsys, "flush", "--user", "alice", "--json")
    flushed = json.loads(out)
    assert code == 0 and flushed["report"]["windows"] >= 1 and flushed["status"]["pending"] == 0
    line = run(capsys, "status")[1].strip()
    assert line.startswith("alice: 6 messages, 0 pending, ") and line.endswith("; healthy")
    assert json.loads(run(capsys, "status", "--json")[1])["users"][0]["user_id"] == "alice"
    code, out, _ = run(capsys, "flush", "--user", "ghost")
    assert code == 2 and out == ""

    assert json.loads(run(capsys, "list", "--json")[1]) == {"users": ["alice"]}
    eps = json.loads(run(capsys, "list", "--user", "alice", "--json")[1])
    assert eps["kind"] == "episodes" and eps["items"] and "vector" not in eps["items"][0]
    facts = json.loads(run(capsys, "list", "--user", "alice", "--kind", "semantic", "--json")[1])["items"]
    ans = json.loads(run(capsys, "answer", "--user", "alice", "When did Alice talk about the puppy?", "--json")[1])
    assert ans["answer"] == "7 May 2023" and ans["retrieved"]["episodes"] and ans["usage"]["calls"] >= 1

    old = facts[0]["id"]
    code, out, _ = run(capsys, "update", "--user", "alice", old, "Alice's puppy is called Rex.", "--json")
    new = json.loads(out)
    assert code == 0 and new["retired"] == old and new["entry"]["origin"] == "user_update"
    assert new["entry"]["event_start"] == facts[0]["event_start"]               # the old event span is kept
    hist = json.loads(run(capsys, "history", "--user", "alice", new["entry"]["id"], "--json")[1])["versions"]
    assert [v["id"] for v in hist] == [old, new["entry"]["id"]]
    assert (hist[0]["live"], hist[0]["retired_by"], hist[0]["retired_decision"]) == \
        (False, new["entry"]["id"], "user_update")
    text = run(capsys, "history", "--user", "alice", old)[1].splitlines()
    assert "retired (user_update) by " + new["entry"]["id"] in text[0] and text[1].split("; ")[1].startswith("live")
    code, _, err = run(capsys, "update", "--user", "alice", old, "again")              # a retired version
    assert code == 2 and "no live semantic entry" in err


def test_every_read_command_takes_json():
    from nemori_dspy.apps.cli.memory import MEMORY_COMMANDS

    reads = {"search", "answer", "list", "status", "history", "flush", "add", "update"}
    have = {c.name for c in MEMORY_COMMANDS if any(p.name == "as_json" for p in c.params)}
    assert reads <= have and {c.name for c in MEMORY_COMMANDS} - have == {"delete", "forget", "export", "import"}


@pytest.mark.parametrize("flag, traced", [(None, False), ("--trace", True)])
def test_serve_http_traces_only_with_trace(env, capsys, monkeypatch, mlflow_db, flag, traced):
    """``serve http`` hands its background processor a tracer only with ``--trace`` (setting ``serve_tracing``);
    uvicorn is not started."""
    import uvicorn

    seen = {}
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: seen.update(tracer=app.state.served.processor.tracer))
    monkeypatch.setenv("NEMORI_MLFLOW_TRACKING_URI", mlflow_db)
    code, _, _ = run(capsys, "serve", "http", *([flag] if flag else []))
    assert code == 0 and (seen["tracer"] is not None) is traced
    if traced:
        assert seen["tracer"].experiment == "nemori-dspy-serve" and seen["tracer"].uri == mlflow_db
