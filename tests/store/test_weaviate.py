"""WeaviateStore checks that need no Weaviate server.

The full ``MemoryStore`` contract runs against Weaviate in ``test_contract.py`` when
``NEMORI_WEAVIATE_URL`` points at a live server; here: tenant naming, collection/uuid naming,
configuration errors, the unreachable-server error and importing without the optional package.
"""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import time
import uuid
from datetime import datetime
from types import SimpleNamespace

import pytest

from nemori_dspy.config import NemoriSettings, load_settings
from nemori_dspy.errors import ConfigError, StoreError
from nemori_dspy.store import SQLiteStore, open_store
from nemori_dspy.store import weaviate as wv
from nemori_dspy.store.weaviate import WeaviateStore, collection_names, tenant_name

#: Weaviate's tenant-name rule (server side): 1-64 of letters, digits, '-' and '_'.
WEAVIATE_TENANT_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")

HOSTILE = ["../../etc/passwd", "a b/c", "DROP TABLE", "x" * 10_000, "", " ", "a", "A", "a ", "a\x00",
           "a\nb", "tenant-1", "u" + "a" * 52, "\u00e9", "e\u0301", "\u202eevil", "\ud800", "💥" * 40,
           "Robert'); DROP TABLE users;--", "%2e%2e%2f", "con", "*", "x" * 9_999 + "y"]


def _unused_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --------------------------------------------------------------------------- tenant names
@pytest.mark.parametrize("user_id", HOSTILE, ids=lambda u: repr(u[:20]))
def test_tenant_name_is_safe_for_hostile_ids(user_id):
    name = tenant_name(user_id)
    assert WEAVIATE_TENANT_RE.fullmatch(name)
    assert re.fullmatch(r"u[a-z2-7]{52}", name)  # the raw id never reaches the name
    assert tenant_name(user_id) == name  # deterministic within a process


def test_tenant_name_is_stable_across_processes():
    # Pinned value: changing the encoding would orphan every stored tenant.
    assert tenant_name("alice") == "ufpmansl7byak6gq7ymzi7j3dvetjoi6i3oh2yt4tv5y5wgdnn2ia"
    out = subprocess.run([sys.executable, "-c", "from nemori_dspy.store.weaviate import tenant_name as t;"
                          "print(t('../../etc/passwd'), t('x' * 10000))"],
                         capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.split() == [tenant_name("../../etc/passwd"), tenant_name("x" * 10_000)]


def test_tenant_names_are_collision_free():
    ids = HOSTILE + [f"user-{i}" for i in range(5_000)] + [uuid.uuid4().hex for _ in range(5_000)]
    assert len(set(ids)) == len(ids)
    assert len({tenant_name(u) for u in ids}) == len(ids)


# --------------------------------------------------------------------------- other names
def test_collection_names_use_the_prefix():
    assert collection_names() == {"message": "NemoriMessage", "episode": "NemoriEpisode",
                                  "semantic": "NemoriSemantic", "meta": "NemoriMeta"}
    assert collection_names("nemoriTest_1")["meta"] == "NemoriTest_1Meta"


@pytest.mark.parametrize("prefix", ["", "1abc", "../x", "a b", "Nemori-x", "_x", "x" * 500, None])
def test_bad_prefix_is_a_config_error(prefix):
    with pytest.raises(ConfigError, match="prefix"):
        collection_names(prefix)


def test_object_uuids_are_deterministic_and_unambiguous():
    assert wv._uid("msg", "u1", "m1") == wv._uid("msg", "u1", "m1")
    # parts never run together: ("a", "b/c") and ("a/b", "c") are different objects
    assert wv._uid("msg", "a", "b/c") != wv._uid("msg", "a/b", "c")
    assert wv._uid("msg", "ab", "c") != wv._uid("msg", "a", "bc")
    assert wv._uid("episode", "u", "e", 1) != wv._uid("episode", "u", "e", 2)
    uuid.UUID(wv._uid("msg", "x" * 10_000, "\ud800"))  # a valid uuid even for hostile ids


# --------------------------------------------------------------------------- errors
@pytest.mark.parametrize("url", ["localhost:8080", "ftp://localhost:8080", "http://", ""])
def test_malformed_url_is_a_config_error(url):
    with pytest.raises(ConfigError, match="NEMORI_WEAVIATE_URL"):
        WeaviateStore(url)


def test_unreachable_server_is_a_store_error_with_the_fix():
    url = f"http://127.0.0.1:{_unused_port()}"
    t0 = time.monotonic()
    with pytest.raises(StoreError) as exc:
        WeaviateStore(url, grpc_port=_unused_port(), timeout_s=2, init_timeout_s=2)
    assert time.monotonic() - t0 < 15
    msg = str(exc.value)
    assert url in msg
    assert "docker run" in msg and "semitechnologies/weaviate" in msg
    assert "NEMORI_STORE=sqlite" in msg


def _store_error(weaviate_module: str) -> str:
    """What ``WeaviateStore(...)`` prints in a fresh interpreter whose ``weaviate`` module is ``weaviate_module``
    (None = not installed): the ConfigError's class (``MissingExtraError`` or ``ConfigError``) and message."""
    code = (f"import sys, types; sys.modules['weaviate'] = {weaviate_module}\n"
            "import nemori_dspy.store\n"
            "from nemori_dspy.store.weaviate import WeaviateStore, tenant_name\n"
            "assert tenant_name('a')\n"
            "from nemori_dspy.errors import ConfigError\n"
            "try:\n    WeaviateStore('http://127.0.0.1:9')\n"
            "except ConfigError as e:\n    print(type(e).__name__, e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_module_imports_without_the_weaviate_package():
    out = _store_error("None")
    assert 'pip install "nemori-dspy[weaviate]"' in out and "NEMORI_STORE=sqlite" in out


def test_an_installed_client_without_the_v4_api_is_named_too_old_not_missing():
    out = _store_error("types.ModuleType('weaviate')")
    assert out.startswith("ConfigError ") and "weaviate-client>=4.24" in out
    assert "not installed" not in out


# --------------------------------------------------------------------------- wiring
def test_open_store_builds_the_configured_backend(tmp_path, monkeypatch):
    s = open_store(NemoriSettings(store="sqlite"), tmp_path / "m.db")
    assert isinstance(s, SQLiteStore)
    s.close()
    with pytest.raises(ConfigError, match="NEMORI_WEAVIATE_URL"):  # caught when the settings load
        load_settings(store="weaviate")
    with pytest.raises(ConfigError, match="NEMORI_WEAVIATE_URL"):  # and by open_store for a hand-built copy
        open_store(NemoriSettings(store="sqlite").model_copy(update={"store": "weaviate"}))

    made = {}

    class Recorder:
        def __init__(self, url, prefix, naive_timezone, lexical_weight):
            made.update(url=url, prefix=prefix, naive_timezone=naive_timezone, lexical_weight=lexical_weight)

    monkeypatch.setattr("nemori_dspy.store.WeaviateStore", Recorder)
    settings = NemoriSettings(store="weaviate", weaviate_url="http://localhost:8080", naive_timezone="Europe/Berlin")
    open_store(settings, tmp_path / "memory" / "3fa9c1 ..;x.sqlite3")
    assert made["url"] == "http://localhost:8080" and made["naive_timezone"] == "Europe/Berlin"
    assert made["lexical_weight"] == settings.lexical_weight
    assert made["prefix"] == "Nemori_3fa9c1____x"
    collection_names(made["prefix"])  # a valid prefix
    open_store(settings)
    assert made["prefix"] == "Nemori"


def test_open_store_unreachable_weaviate_is_a_store_error():
    url = f"http://127.0.0.1:{_unused_port()}"
    with pytest.raises(StoreError, match=re.escape(url)):
        open_store(NemoriSettings(store="weaviate", weaviate_url=url))


def test_weaviate_store_has_every_protocol_method_with_the_same_parameters():
    import inspect

    from nemori_dspy.store.base import MemoryStore

    for name, proto in inspect.getmembers(MemoryStore, inspect.isfunction):
        if name.startswith("_"):
            continue
        for cls in (WeaviateStore, SQLiteStore):
            impl = getattr(cls, name, None)
            assert impl is not None, f"{cls.__name__}.{name} is missing"
            assert list(inspect.signature(impl).parameters) == list(inspect.signature(proto).parameters), \
                f"{cls.__name__}.{name}"


def test_pending_rule_of_rebuffered_and_deleted_messages():
    never = wv._NEVER
    old = {"processed_step": 3}                                   # schema-1 object: no new properties
    assert not wv._pending(old, 3) and wv._pending(old, 2)
    requeued = {"processed_step": 3, "requeue_step": 5, "reprocessed_step": never, "deleted_step": never}
    assert not wv._pending(requeued, 4) and wv._pending(requeued, 5)   # visible from its commit on
    assert not wv._pending({**requeued, "reprocessed_step": 7}, 7) and wv._pending({**requeued, "reprocessed_step": 7}, 6)
    assert not wv._pending({"processed_step": never, "deleted_step": 2}, 2)


# --------------------------------------------------------------------------- event time (schema version 2)
T_START = datetime(2023, 5, 8, 13, 56)
def _bare_store() -> WeaviateStore:
    """A WeaviateStore with no connection: enough for its object <-> record mapping."""
    s = WeaviateStore.__new__(WeaviateStore)
    s._w = wv._import_weaviate()
    return s


def test_semantic_objects_carry_event_times_apart_from_created_at():
    from nemori_dspy.types import SemanticEntry

    start, end = datetime(2023, 5, 8, 13, 56), datetime.fromisoformat("2023-06-02T09:00:00+08:00")
    e = SemanticEntry(id="s1", user_id="u", text="Caroline adopted a dog.", vector=[1.0, 0.0],
                      event_start=start, event_end=end)
    obj = _bare_store()._entry_object("u", e, 3)
    assert obj.properties["event_start"] == start.isoformat() and obj.properties["event_end"] == end.isoformat()
    assert obj.properties["created_at"] == e.created_at.isoformat()
    back = WeaviateStore._entry("u", SimpleNamespace(properties=obj.properties, vector={"default": [1.0, 0.0]}))
    assert (back.event_start, back.event_end, back.created_at) == (start, end, e.created_at)
    undated = _bare_store()._entry_object("u", SemanticEntry(id="s2", user_id="u", text="x", vector=[1.0]), 3)
    assert undated.properties["event_start"] == "" == undated.properties["event_end"]
    # an object written by schema version 1 has no such properties: no event time
    v1 = {k: v for k, v in obj.properties.items() if not k.startswith("event_")}
    old = WeaviateStore._entry("u", SimpleNamespace(properties=v1, vector=None))
    assert old.event_start is None and old.event_end is None


def test_opening_version_1_collections_adds_the_event_and_lexical_properties():
    assert wv.SCHEMA_VERSION == 5
    later = ("lexical", "origin", "retired_at", "retired_by", "retired_decision")
    v1_semantic = [n for n in wv._SCHEMA["semantic"] if not n.startswith("event_") and n not in later]
    assert wv._missing_properties("semantic", v1_semantic) == {
        "event_start": "text", "event_end": "text", "lexical": "lexical", "origin": "text", "retired_at": "text",
        "retired_by": "text", "retired_decision": "text"}
    assert wv._missing_properties("semantic", [n[0].lower() + n[1:] for n in wv._SCHEMA["semantic"]]) == {}
    added = []
    props = [SimpleNamespace(name=n) for n in v1_semantic]
    coll = SimpleNamespace(config=SimpleNamespace(get=lambda: SimpleNamespace(properties=props),
                                                  add_property=added.append))
    _bare_store()._add_missing_properties("semantic", coll)
    assert [(p.name, p.dataType.value) for p in added] == [("event_start", "text"), ("event_end", "text"),
                                                            ("lexical", "text"), ("origin", "text"),
                                                            ("retired_at", "text"), ("retired_by", "text"),
                                                            ("retired_decision", "text")]
    assert added[2].tokenization.value == "trigram" and added[2].indexSearchable


def test_semantic_versions_record_what_retired_them():
    from nemori_dspy.types import SemanticEntry

    merged = SemanticEntry(id="s9", user_id="u", text="x", vector=[1.0], supersedes=["s1", "s2"], origin="merge")
    props = WeaviateStore._retired_props(["s1", "s2", "s3"], {"s1": merged, "s2": merged})
    assert props["s1"]["retired_by"] == "s9" and props["s1"]["retired_decision"] == "merge"
    assert props["s3"] == {**props["s3"], "retired_by": "", "retired_decision": "superseded"}   # no replacement named
    obj = _bare_store()._entry_object("u", SemanticEntry(id="s1", user_id="u", text="y", vector=[1.0], origin="new"), 2)
    assert obj.properties["origin"] == "new" and obj.properties["retired_decision"] == ""
    dead = SimpleNamespace(properties={**obj.properties, **props["s1"], "died": 5}, vector=None)
    v = WeaviateStore._version("u", dead, 5)
    assert (v.live, v.retired_by, v.retired_decision, v.origin) == (False, "s9", "merge", "new") and v.retired_at
    # a step that retired it and then crashed is rolled back (died reset): its leftover marks are not read
    back = SimpleNamespace(properties={**obj.properties, **props["s1"], "died": wv._NEVER}, vector=None)
    v = WeaviateStore._version("u", back, 5)
    assert v.live and v.retired_by is v.retired_decision is v.retired_at is None
    # an object written before schema 5 has none of the properties
    old = {k: v for k, v in obj.properties.items() if k not in ("origin", "retired_at", "retired_by", "retired_decision")}
    v = WeaviateStore._version("u", SimpleNamespace(properties={**old, "died": 3}, vector=None), 5)
    assert not v.live and v.origin is None and v.retired_decision is None


def test_episode_and_entry_objects_carry_their_lexical_text():
    from nemori_dspy.types import Episode, SemanticEntry

    ep = Episode(id="e1", user_id="u", cue="支持小组", narrative="卡罗琳去了支持小组。", message_ids=["m1", "m2"],
                 start=T_START, end=T_START, vector=[1.0, 0.0])
    obj = _bare_store()._episode_object("u", ep, 1, {"m1": "我昨天去了支持小组", "m2": "真棒"})
    assert obj.properties["lexical"] == "支持小组\n卡罗琳去了支持小组。\n我昨天去了支持小组\n真棒"
    entry = _bare_store()._entry_object("u", SemanticEntry(id="s1", user_id="u", text="卡罗琳喜欢画画", vector=[1.0]), 1)
    assert entry.properties["lexical"] == "卡罗琳喜欢画画"
