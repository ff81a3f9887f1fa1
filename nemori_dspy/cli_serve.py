"""CLI for serving and using memory: ``serve http|mcp|token`` and ``add``, ``search``, ``answer``,
``list``, ``delete``, ``forget``, ``export``, ``import``.

Kept apart from ``cli.py``: ``cli.build_parser`` calls ``add_parsers(sub)`` and ``cli.main`` calls
``dispatch(args)``, which returns None for commands that are not this module's. Settings flow one
way: flags → ``load_settings`` → ``build_runtime`` (LM, only for commands that call it) →
``dspy.configure``. Errors print one line (``error: ...``) and exit 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from contextlib import ExitStack
from typing import Any, Iterator, TextIO


__all__ = ["add_parsers", "dispatch", "MEMORY_COMMANDS"]

MEMORY_COMMANDS = ("add", "search", "answer", "list", "delete", "forget", "export", "import")
_FLAGS = ("model", "api_base", "embedder", "window_size", "store", "weaviate_url")


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--db", help="SQLite store file (default: $NEMORI_DB_PATH, else ~/.cache/nemori-dspy/memory.sqlite3)")
    for name in _FLAGS:
        p.add_argument("--" + name.replace("_", "-"), dest=name, default=None,
                       help=f"override setting {name} (env NEMORI_{name.upper()})")
    p.add_argument("-v", "--verbose", action="store_true", help="log INFO")


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """Add ``serve`` and the memory commands to the top-level subparsers."""
    serve = sub.add_parser("serve", help="serve memory to agents over HTTP (REST) or MCP")
    kinds = serve.add_subparsers(dest="serve_kind", required=True)
    http = kinds.add_parser("http", help="REST API with OpenAPI docs at /docs (FastAPI + uvicorn)")
    _common(http)
    http.add_argument("--host", default="127.0.0.1", help="bind address (non-loopback needs NEMORI_API_TOKEN)")
    http.add_argument("--port", type=int, default=8765)
    http.add_argument("--threads", type=int, default=2, help="users processed at once in the background (0 = store only)")
    http.add_argument("--max-body-bytes", type=int, default=None, help="largest request body (default 8 MiB)")
    http.add_argument("--max-messages", type=int, default=None, help="messages per request (default 10000)")
    http.add_argument("--max-message-chars", type=int, default=None, help="characters per message (default 32000)")
    mcp = kinds.add_parser("mcp", help="MCP server (stdio; --http for streamable HTTP)")
    _common(mcp)
    mcp.add_argument("--user", help="act for this user only (tools then take no user_id)")
    mcp.add_argument("--http", action="store_true", help="streamable HTTP at http://HOST:PORT/mcp instead of stdio")
    mcp.add_argument("--host", default="127.0.0.1")
    mcp.add_argument("--port", type=int, default=8766)
    tok = kinds.add_parser("token", help="print the bearer token that opens only one user's HTTP routes")
    tok.add_argument("--user", required=True)

    add = sub.add_parser("add", help="add messages from a JSON-lines file (one message per line; - = stdin)")
    _common(add)
    add.add_argument("--user", required=True)
    add.add_argument("file", help="FILE.jsonl or - for stdin; each line {speaker, content, timestamp, id?, metadata?}")
    mode = add.add_mutually_exclusive_group()
    mode.add_argument("--flush", action="store_true", help="also process a partial last window (end of conversation)")
    mode.add_argument("--no-process", action="store_true", help="only store (no LLM calls)")
    se = sub.add_parser("search", help="search a user's memory (no LLM call)")
    _common(se)
    se.add_argument("--user", required=True)
    se.add_argument("query")
    se.add_argument("--top-k", type=int, default=5)
    se.add_argument("--metadata", action="append", default=[], metavar="KEY=VALUE",
                    help="only episodes with a message tagged so (repeatable; VALUE parsed as JSON if it can be)")
    se.add_argument("--json", action="store_true", help="print the result as JSON")
    an = sub.add_parser("answer", help="answer a question from a user's memory")
    _common(an)
    an.add_argument("--user", required=True)
    an.add_argument("question")
    ls = sub.add_parser("list", help="list users, or a user's episodes / semantic entries")
    _common(ls)
    ls.add_argument("--user", help="without it: list the users")
    ls.add_argument("--kind", choices=("episodes", "semantic"), default="episodes")
    de = sub.add_parser("delete", help="delete one entry (semantic, episode or message id) or a whole user")
    _common(de)
    de.add_argument("--user", required=True)
    de.add_argument("id", nargs="?", help="entry id (sem_..., ep_... or a message id)")
    de.add_argument("--all", action="store_true", help="delete everything stored for the user")
    fo = sub.add_parser("forget", help="forget a fact everywhere: the semantic entry, the raw messages of its "
                        "source episodes and the episodes holding them (delete removes the entry only)")
    _common(fo)
    fo.add_argument("--user", required=True)
    fo.add_argument("id", help="semantic entry id (sem_...); an episode or message id is deleted as by delete")
    ex = sub.add_parser("export", help="write everything derived from a user as JSON lines to stdout")
    _common(ex)
    ex.add_argument("--user", required=True)
    im = sub.add_parser("import", help="load an export (JSON lines file or -) into the store")
    _common(im)
    im.add_argument("file")
    im.add_argument("--user", help="import under this id (default: the exported one)")


def dispatch(args: argparse.Namespace) -> int | None:
    """Run this module's command; None if ``args.command`` is not one of them. NemoriError propagates
    (``cli.main`` prints it on one line)."""
    if args.command == "serve":
        return {"http": _serve_http, "mcp": _serve_mcp, "token": _serve_token}[args.serve_kind](args)
    if args.command in MEMORY_COMMANDS:
        return _COMMANDS[args.command](args)
    return None


# --------------------------------------------------------------------------- plumbing
def build_runtime(settings: Any) -> Any:
    """``runtime.build_runtime`` (imported late: ``--help`` and LLM-free commands stay fast)."""
    from .runtime import build_runtime as build

    return build(settings)


def _settings(args: argparse.Namespace) -> Any:
    from .config import load_settings

    overrides = {k: getattr(args, k) for k in _FLAGS if getattr(args, k, None) is not None}
    if getattr(args, "db", None):
        overrides["db_path"] = args.db
    return load_settings(**overrides)


def _memory(settings: Any, stage_lms: dict | None = None) -> Any:
    from .embedders import resolve_embedder
    from .memory import Memory
    from .store import open_store

    return Memory(open_store(settings), resolve_embedder(settings), settings, stage_lms=stage_lms)


def _open(args: argparse.Namespace, stack: ExitStack, llm: bool) -> Any:
    """Settings → (runtime, if ``llm``) → Memory; everything closed with ``stack``."""
    settings = _settings(args)
    stage_lms = None
    if llm:
        rt = stack.enter_context(build_runtime(settings))
        stage_lms = rt.stage_lms
    memory = _memory(settings, stage_lms)
    stack.callback(memory.store.close)
    return memory


def _token(settings: Any) -> str | None:
    return settings.api_token.get_secret_value() if settings.api_token else None


# --------------------------------------------------------------------------- serve
def _serve_http(args: argparse.Namespace) -> int:
    import uvicorn

    from .serving.http import Limits, check_bind, create_app
    from .serving.worker import BackgroundProcessor

    settings = _settings(args)
    token = _token(settings)
    check_bind(args.host, token)  # before any model starts
    limits = Limits(**{k: v for k, v in (("max_body_bytes", args.max_body_bytes), ("max_messages", args.max_messages),
                                        ("max_message_chars", args.max_message_chars)) if v is not None})
    with ExitStack() as stack:
        memory = _open(args, stack, llm=True)
        app = create_app(memory, BackgroundProcessor(memory, threads=args.threads), token=token, limits=limits)
        auth = "bearer token required" if token else "NO AUTH (loopback only)"
        print(f"nemori-dspy HTTP API on http://{args.host}:{args.port} (docs /docs; {auth})", file=sys.stderr, flush=True)
        uvicorn.run(app, host=args.host, port=args.port, log_level="info" if args.verbose else "warning")
    return 0


def _serve_mcp(args: argparse.Namespace) -> int:
    from .serving.http import check_bind
    from .serving.mcp import bearer_guard, build_mcp_server

    settings = _settings(args)
    token = _token(settings)
    if args.http:
        check_bind(args.host, token)
    with ExitStack() as stack:
        memory = _open(args, stack, llm=True)
        server = build_mcp_server(memory, user=args.user)
        if not args.http:
            server.run("stdio")
            return 0
        import uvicorn

        app = server.streamable_http_app(host=args.host)
        print(f"nemori-dspy MCP (streamable HTTP) on http://{args.host}:{args.port}/mcp", file=sys.stderr, flush=True)
        uvicorn.run(bearer_guard(app, token) if token else app, host=args.host, port=args.port,
                    log_level="info" if args.verbose else "warning")
    return 0


def _serve_token(args: argparse.Namespace) -> int:
    from .config import load_settings
    from .errors import ConfigError
    from .memory import validate_user_id
    from .serving.http import user_token

    token = _token(load_settings())
    if not token:
        raise ConfigError("no server token to derive from. Fix: export NEMORI_API_TOKEN=<the server's token>.")
    print(user_token(token, validate_user_id(args.user)))
    return 0


# --------------------------------------------------------------------------- memory commands
def _lines(path: str) -> Iterator[tuple[int, str]]:
    from .errors import InvalidInputError

    with ExitStack() as stack:
        try:
            stream: TextIO = sys.stdin if path == "-" else stack.enter_context(open(path, encoding="utf-8"))
        except OSError as exc:
            raise InvalidInputError("file", f"cannot read {path}: {exc.strerror}",
                                    "pass a readable JSON-lines file or -") from None
        for n, line in enumerate(stream, 1):
            if line.strip():
                yield n, line


def _json_records(path: str) -> tuple[list[int], list[dict]]:
    """(line numbers, objects) of a JSON-lines file; a bad line is an error naming it."""
    from .errors import InvalidInputError

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


def _add(args: argparse.Namespace) -> int:
    import re

    from .errors import InvalidInputError

    numbers, rows = _json_records(args.file)
    with ExitStack() as stack:
        memory = _open(args, stack, llm=not args.no_process)
        try:
            res = memory.add_messages(args.user, rows, process=not args.no_process)
        except InvalidInputError as exc:  # messages[i].field → FILE line n: field
            m = re.match(r"messages\[(\d+)\]\.?(.*)", exc.field)
            if not m:
                raise
            raise InvalidInputError(f"{args.file} line {numbers[int(m.group(1))]}: {m.group(2) or 'message'}",
                                    exc.problem, exc.fix) from None
        if args.flush:
            memory.flush(args.user)
        st = memory.status(args.user)
    print(f"stored {res.accepted}, duplicates {res.duplicates}; {st['episodes']} episodes, "
          f"{st['semantic']} semantic entries, {st['pending']} pending")
    return 0


def _metadata_arg(items: list[str]) -> dict[str, Any] | None:
    from .errors import InvalidInputError

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


def _search(args: argparse.Namespace) -> int:
    from .tools import search_payload

    with ExitStack() as stack:
        memory = _open(args, stack, llm=False)
        res = search_payload(memory.search(args.user, args.query, top_k=args.top_k, semantic_top_k=args.top_k,
                                           metadata=_metadata_arg(args.metadata)))
    if args.json:
        print(json.dumps(res, ensure_ascii=False))
        return 0
    for e in res["episodes"]:
        print(f"episode {e['id']}  {e['score']:.3f}  [{e['start'][:16]}]  {e['cue']}")
    for s in res["semantic"]:
        print(f"semantic {s['id']}  {s['score']:.3f}  {s['text']}")
    if not res["episodes"] and not res["semantic"]:
        print("(nothing found)")
    return 0


def _answer(args: argparse.Namespace) -> int:
    with ExitStack() as stack:
        memory = _open(args, stack, llm=True)
        print(memory.answer(args.user, args.question).answer)
    return 0


def _list(args: argparse.Namespace) -> int:
    with ExitStack() as stack:
        memory = _open(args, stack, llm=False)
        if not args.user:
            for u in memory.store.list_users():
                print(u)
        elif args.kind == "episodes":
            for e in memory.list_episodes(args.user):
                print(f"{e.id}  [{e.start:%Y-%m-%d %H:%M} – {e.end:%Y-%m-%d %H:%M}]  {len(e.message_ids)} messages  {e.cue}")
        else:
            for s in memory.list_semantic(args.user):
                print(f"{s.id}  {s.text}")
    return 0


def _delete(args: argparse.Namespace) -> int:
    from .errors import InvalidInputError
    from .tools import MemoryOps

    if bool(args.id) == bool(args.all):
        raise InvalidInputError("id", "give either an entry id or --all", "e.g. `delete --user U sem_…` or `--all`")
    with ExitStack() as stack:
        memory = _open(args, stack, llm=False)
        if args.all:
            memory.delete_user(args.user)
            print(f"deleted user {args.user}")
        else:
            out = MemoryOps(memory).delete(args.user, args.id)
            print(f"deleted {out['deleted']} {args.id}")
    return 0


def _forget(args: argparse.Namespace) -> int:
    from .tools import MemoryOps

    with ExitStack() as stack:
        memory = _open(args, stack, llm=False)
        out = MemoryOps(memory).forget(args.user, args.id)
        extra = "".join(f", {len(out[k])} {k}" for k in ("episodes", "messages", "requeued") if out.get(k))
        print(f"forgot {out['deleted']} {args.id}{extra}")
    return 0


def _export(args: argparse.Namespace) -> int:
    from .portability import export_user

    with ExitStack() as stack:
        memory = _open(args, stack, llm=False)
        for rec in export_user(memory, args.user):
            sys.stdout.write(json.dumps(rec, ensure_ascii=False) + "\n")
    return 0


def _import(args: argparse.Namespace) -> int:
    from .portability import import_user

    _, rows = _json_records(args.file)
    with ExitStack() as stack:
        memory = _open(args, stack, llm=False)
        counts = import_user(memory, rows, user_id=args.user)
    print(f"imported {counts['messages']} messages, {counts['episodes']} episodes, {counts['semantic']} semantic entries")
    return 0


_COMMANDS = {"add": _add, "search": _search, "answer": _answer, "list": _list, "delete": _delete,
             "forget": _forget, "export": _export, "import": _import}
