"""The memory commands: ``add``, ``flush``, ``search``, ``answer``, ``list``, ``status``, ``history``, ``update``,
``delete``, ``forget``, ``export``, ``import``.

Each opens the store the settings name through the run context (``serve.open_memory``); only ``add`` (unless
``--no-process``), ``flush`` and ``answer`` start an LM. Every command that reads (and ``add``, ``flush``,
``update``) prints lines for a person, or one JSON object with ``--json`` (``export`` always writes JSON lines).
Errors print one line (``error: ...``) and exit 2.
"""

from __future__ import annotations

import json
import re
import sys
from contextlib import ExitStack
from typing import Any, Iterator, TextIO

import click

from nemori_dspy.apps.cli.serve import memory_options, open_memory

__all__ = ["MEMORY_COMMANDS", "add", "flush", "search", "answer", "list_", "status", "history", "update", "delete",
           "forget", "export", "import_", "json_records", "parse_metadata", "json_option"]


def json_option() -> Any:
    """``--json``: print the command's result as one JSON object instead of lines."""
    return click.option("--json", "as_json", is_flag=True, help="print the result as one JSON object")


def _print_json(obj: Any) -> None:
    print(json.dumps(obj, ensure_ascii=False, default=str))


def _public(model: Any) -> dict[str, Any]:
    """A record as JSON without its embedding vector."""
    return model.model_dump(mode="json", exclude={"vector"})


def _status_line(user: str, st: dict[str, Any]) -> str:
    health = "healthy" if st["healthy"] else "NOT healthy" + (f" (parked: {'; '.join(st['parked'])})" if st["parked"]
                                                             else f" ({st['to_distill']} to distill)")
    return (f"{user}: {st['messages']} messages, {st['pending']} pending, {st['episodes']} episodes "
            f"({st['superseded_episodes']} superseded), {st['semantic']} semantic entries; {health}")


def _lines(path: str) -> Iterator[tuple[int, str]]:
    from nemori_dspy.errors import InvalidInputError

    with ExitStack() as stack:
        try:
            stream: TextIO = sys.stdin if path == "-" else stack.enter_context(open(path, encoding="utf-8"))
        except OSError as exc:
            raise InvalidInputError("file", f"cannot read {path}: {exc.strerror}",
                                    "pass a readable JSON-lines file or -") from None
        for n, line in enumerate(stream, 1):
            if line.strip():
                yield n, line


def json_records(path: str) -> tuple[list[int], list[dict]]:
    """(line numbers, objects) of a JSON-lines file (``-`` = stdin); blank lines are skipped.

    Raises:
        InvalidInputError: the file cannot be read, or a line is not a JSON object (the error names the line).
    """
    from nemori_dspy.errors import InvalidInputError

    numbers, rows = [], []
    for n, line in _lines(path):
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InvalidInputError(f"{path} line {n}", f"not JSON ({exc.msg})", "write one JSON object per line")
        if not isinstance(obj, dict):
            raise InvalidInputError(f"{path} line {n}", "not a JSON object", "write one JSON object per line")
        numbers.append(n)
        rows.append(obj)
    return numbers, rows


def parse_metadata(items: tuple[str, ...] | list[str]) -> dict[str, Any] | None:
    """``--metadata KEY=VALUE`` items → ``{key: value}`` (VALUE parsed as JSON if it can be); None if none.

    Raises:
        InvalidInputError: an item is not KEY=VALUE.
    """
    from nemori_dspy.errors import InvalidInputError

    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise InvalidInputError("--metadata", f"{item!r} is not KEY=VALUE", "write e.g. --metadata session=s1")
        try:
            out[key] = json.loads(raw)
        except json.JSONDecodeError:
            out[key] = raw
    return out or None


@click.command("add", help="add messages from a JSON-lines file (one message per line; - = stdin)")
@memory_options()
@click.option("--user", required=True)
@click.argument("file")
@click.option("--flush", is_flag=True, help="also process a partial last window (end of conversation)")
@click.option("--no-process", is_flag=True, help="only store (no LLM calls)")
@json_option()
def add(**flags: Any) -> int:
    """``add``: store the file's messages (FILE.jsonl or -; each line {speaker, content, timestamp, id?,
    metadata?}) and process every full window, unless ``--no-process``.

    Raises:
        click.UsageError: ``--flush`` with ``--no-process``.
        InvalidInputError: a bad line (named by its line number in the file).
    """
    from nemori_dspy.errors import InvalidInputError

    if flags["flush"] and flags["no_process"]:
        raise click.UsageError("--flush is not allowed with --no-process")
    user, path = flags["user"], flags["file"]
    numbers, rows = json_records(path)
    with ExitStack() as stack:
        memory = open_memory(flags, stack, llm=not flags["no_process"])
        try:
            res = memory.add_messages(user, rows, process=not flags["no_process"])
        except InvalidInputError as exc:  # messages[i].field → FILE line n: field
            m = re.match(r"messages\[(\d+)\]\.?(.*)", exc.field)
            if not m:
                raise
            raise InvalidInputError(f"{path} line {numbers[int(m.group(1))]}: {m.group(2) or 'message'}",
                                    exc.problem, exc.fix) from None
        if flags["flush"]:
            memory.flush(user)
        st = memory.status(user)
    if flags["as_json"]:
        _print_json({**res.model_dump(mode="json", exclude={"report"}), "status": st.model_dump(exclude={"counters"})})
        return 0
    print(f"stored {res.accepted}, duplicates {res.duplicates}; {st.episodes} episodes, "
          f"{st.semantic} semantic entries, {st.pending} pending")
    return 0


@click.command("flush", help="process every buffered message of a user now, even a partial window")
@memory_options()
@click.option("--user", required=True)
@json_option()
def flush(**flags: Any) -> int:
    """``flush``: ``Memory.flush`` (the end of a conversation: a partial window is processed too), then the status.

    Raises:
        UnknownUserError: nothing was ever added for the user.
    """
    from dataclasses import asdict

    user = flags["user"]
    with ExitStack() as stack:
        memory = open_memory(flags, stack, llm=True)
        report = memory.flush(user)
        st = memory.status(user).model_dump(exclude={"counters"})
    if flags["as_json"]:
        _print_json({"user_id": user, "report": asdict(report), "status": st})
        return 0
    print(f"flushed {report.windows} windows: {report.episodes} episodes, {report.semantic_inserts} semantic entries "
          f"written, {report.semantic_deletes} retired")
    print(_status_line(user, st))
    return 0


@click.command("search", help="search a user's memory (no LLM call)")
@memory_options()
@click.option("--user", required=True)
@click.argument("query")
@click.option("--top-k", type=int, default=5)
@click.option("--metadata", multiple=True, metavar="KEY=VALUE",
              help="only episodes with a message tagged so (repeatable; VALUE parsed as JSON if it can be)")
@json_option()
def search(**flags: Any) -> int:
    """``search``: the top ``--top-k`` episodes and semantic entries for the query, as lines or JSON."""
    from nemori_dspy.tools import search_payload

    top_k = flags["top_k"]
    with ExitStack() as stack:
        memory = open_memory(flags, stack, llm=False)
        res = search_payload(memory.search(flags["user"], flags["query"], top_k=top_k, semantic_top_k=top_k,
                                           metadata=parse_metadata(flags["metadata"])))
        if flags["as_json"]:
            print(json.dumps(res, ensure_ascii=False))
            return 0
        pending = memory.status(flags["user"]).pending
    for e in res["episodes"]:
        print(f"episode {e['id']}  {e['score']:.3f}  [{e['start'][:16]}]  {e['cue']}")
    for s in res["semantic"]:
        print(f"semantic {s['id']}  {s['score']:.3f}  {s['text']}")
    if not res["episodes"] and not res["semantic"]:
        print("(nothing found)")
    if pending:
        print(f"({pending} message(s) not yet in memory: run `nemori-dspy flush --user {flags['user']}` to build it)")
    return 0


@click.command("answer", help="answer a question from a user's memory")
@memory_options()
@click.option("--user", required=True)
@click.argument("question")
@json_option()
def answer(**flags: Any) -> int:
    """``answer``: ``Memory.answer`` for the question; prints the answer (with ``--json``: the answer, the context
    it was given, what was retrieved and the LLM usage)."""
    from nemori_dspy.tools import search_payload

    with ExitStack() as stack:
        memory = open_memory(flags, stack, llm=True)
        res = memory.answer(flags["user"], flags["question"])
    if flags["as_json"]:
        _print_json({"answer": res.answer, "context": res.context, "retrieved": search_payload(res.retrieved),
                     "usage": res.usage.model_dump()})
    else:
        print(res.answer)
    return 0


@click.command("list", help="list users, or a user's episodes / semantic entries")
@memory_options()
@click.option("--user", default=None, help="without it: list the users")
@click.option("--kind", type=click.Choice(("episodes", "semantic")), default="episodes")
@json_option()
def list_(**flags: Any) -> int:
    """``list``: the users, or one user's episodes (``--kind episodes``) or semantic entries; with ``--json``
    ``{"users": [...]}`` or ``{"user_id", "kind", "items": [records without vectors]}``."""
    user = flags["user"]
    with ExitStack() as stack:
        memory = open_memory(flags, stack, llm=False)
        if not user:
            users = memory.store.list_users()
            rows: list[Any] = []
        elif flags["kind"] == "episodes":
            rows = memory.list_episodes(user)
        else:
            rows = memory.list_semantic(user)
    if flags["as_json"]:
        _print_json({"users": users} if not user else
                    {"user_id": user, "kind": flags["kind"], "items": [_public(r) for r in rows]})
    elif not user:
        for u in users:
            print(u)
    elif flags["kind"] == "episodes":
        for e in rows:
            print(f"{e.id}  [{e.start:%Y-%m-%d %H:%M} – {e.end:%Y-%m-%d %H:%M}]  {len(e.message_ids)} messages  {e.cue}")
    else:
        for s in rows:
            print(f"{s.id}  {s.text}")
    return 0


@click.command("status", help="what is stored for a user (or every user) and what still waits")
@memory_options()
@click.option("--user", default=None, help="without it: one line per user")
@json_option()
def status(**flags: Any) -> int:
    """``status``: ``Memory.status`` of the user (counts read from the store: messages, pending, episodes,
    superseded episodes, semantic entries, episodes left to distill), or of every user."""
    user = flags["user"]
    with ExitStack() as stack:
        memory = open_memory(flags, stack, llm=False)
        users = [user] if user else memory.store.list_users()
        found = {u: memory.status(u).model_dump(exclude={"counters"}) for u in users}
    if flags["as_json"]:
        _print_json({"user_id": user, **found[user]} if user else
                    {"users": [{"user_id": u, **st} for u, st in found.items()]})
        return 0
    for u, st in found.items():
        print(_status_line(u, st) if st["known"] else f"{u}: nothing stored")
    return 0


@click.command("history", help="every version of a semantic entry, with the decision that retired each")
@memory_options()
@click.option("--user", required=True)
@click.argument("id")
@json_option()
def history(**flags: Any) -> int:
    """``history``: ``Memory.semantic_history`` of the entry (live or retired), oldest first."""
    with ExitStack() as stack:
        memory = open_memory(flags, stack, llm=False)
        versions = memory.semantic_history(flags["user"], flags["id"])
    if flags["as_json"]:
        _print_json({"entry_id": flags["id"], "versions": [_public(v) for v in versions]})
        return 0
    for v in versions:
        when = f"{v.event_start:%Y-%m-%d}" if v.event_start else "undated"
        if v.event_end and v.event_start and v.event_end.date() != v.event_start.date():
            when += f" – {v.event_end:%Y-%m-%d}"
        fate = "live"
        if not v.live:
            fate = f"retired ({v.retired_decision or 'decision not recorded'})"
            fate += f" by {v.retired_by}" if v.retired_by else ""
            fate += f" at {v.retired_at:%Y-%m-%d %H:%M}" if v.retired_at else ""
        print(f"{v.id}  [{when}]  made by {v.origin or '?'}; {fate}  {v.text}")
    return 0


@click.command("update", help="correct a semantic entry: the text becomes its new version (the old one is kept "
                              "in its history, retired as user_update)")
@memory_options()
@click.option("--user", required=True)
@click.argument("id")
@click.argument("text")
@click.option("--event-start", default=None, help="when what it states began (ISO 8601); default: the old span")
@click.option("--event-end", default=None, help="when it ended (ISO 8601)")
@json_option()
def update(**flags: Any) -> int:
    """``update``: ``Memory.update_semantic``; prints the new version's id."""
    with ExitStack() as stack:
        memory = open_memory(flags, stack, llm=False)
        new = memory.update_semantic(flags["user"], flags["id"], flags["text"], flags["event_start"],
                                     flags["event_end"])
    if flags["as_json"]:
        _print_json({"entry": _public(new), "retired": flags["id"], "decision": "user_update"})
    else:
        print(f"updated {flags['id']} → {new.id}  {new.text}")
    return 0


@click.command("delete", help="delete one entry (semantic, episode or message id) or a whole user")
@memory_options()
@click.option("--user", required=True)
@click.argument("id", required=False)
@click.option("--all", "everything", is_flag=True, help="delete everything stored for the user")
def delete(**flags: Any) -> int:
    """``delete``: one entry id (sem_..., ep_... or a message id), or ``--all`` of the user.

    Raises:
        InvalidInputError: neither or both of an id and ``--all``.
    """
    from nemori_dspy.errors import InvalidInputError
    from nemori_dspy.tools import MemoryOps

    user, entry = flags["user"], flags["id"]
    if bool(entry) == bool(flags["everything"]):
        raise InvalidInputError("id", "give either an entry id or --all", "e.g. `delete --user U sem_…` or `--all`")
    with ExitStack() as stack:
        memory = open_memory(flags, stack, llm=False)
        if flags["everything"]:
            memory.delete_user(user)
            print(f"deleted user {user}")
        else:
            out = MemoryOps(memory).delete(user, entry)
            print(f"deleted {out['deleted']} {entry}")
    return 0


@click.command("forget", help="forget a fact everywhere: the semantic entry, the raw messages of its source "
                              "episodes and the episodes holding them (delete removes the entry only)")
@memory_options()
@click.option("--user", required=True)
@click.argument("id")
def forget(**flags: Any) -> int:
    """``forget``: a semantic entry id (sem_...) everywhere; an episode or message id is deleted as by delete."""
    from nemori_dspy.tools import MemoryOps

    with ExitStack() as stack:
        memory = open_memory(flags, stack, llm=False)
        out = MemoryOps(memory).forget(flags["user"], flags["id"])
        extra = "".join(f", {len(out[k])} {k}" for k in ("episodes", "messages", "requeued") if out.get(k))
        print(f"forgot {out['deleted']} {flags['id']}{extra}")
    return 0


@click.command("export", help="write everything derived from a user as JSON lines to stdout")
@memory_options()
@click.option("--user", required=True)
def export(**flags: Any) -> int:
    """``export``: the user's records (``portability.export_user``), one JSON object per line."""
    from nemori_dspy.portability import export_user

    with ExitStack() as stack:
        memory = open_memory(flags, stack, llm=False)
        for rec in export_user(memory, flags["user"]):
            sys.stdout.write(json.dumps(rec, ensure_ascii=False) + "\n")
    return 0


@click.command("import", help="load an export (JSON lines file or -) into the store")
@memory_options()
@click.argument("file")
@click.option("--user", default=None, help="import under this id (default: the exported one)")
def import_(**flags: Any) -> int:
    """``import``: an ``export`` file into the store, under ``--user`` or the exported id."""
    from nemori_dspy.portability import import_user

    _, rows = json_records(flags["file"])
    with ExitStack() as stack:
        memory = open_memory(flags, stack, llm=False)
        counts = import_user(memory, rows, user_id=flags["user"])
    print(f"imported {counts['messages']} messages, {counts['episodes']} episodes, {counts['semantic']} semantic entries")
    return 0


#: the memory commands, in the order ``--help`` lists them.
MEMORY_COMMANDS = (add, flush, search, answer, list_, status, history, update, delete, forget, export, import_)
