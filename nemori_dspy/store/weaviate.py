"""Weaviate backend of ``MemoryStore`` (weaviate-client v4, Weaviate server 1.27 or newer).

Layout. Four collections named after ``prefix`` (default ``"Nemori"``):

- ``<prefix>Message``, ``<prefix>Episode``, ``<prefix>Semantic``: multi-tenant, one tenant per user.
  A tenant name is ``tenant_name(user_id)`` = ``"u"`` + base32(sha256(user_id)) (53 characters of
  ``[a-z2-7]``): deterministic, collision-free as far as sha256 is, and never the raw user id, which
  is kept as the ``user_id`` property.
- ``<prefix>Meta``: one ``config`` object (embedder name/dim, schema version) and one ``user``
  object per user (its tenant, committed step, pending step and next window).

Vectors are ours (self-provided, named vector ``"default"``, L2-normalised on write) in a **flat**
index with cosine distance, so search is brute force and exact; score = 1 - distance, ties are
broken by id as in ``SQLiteStore`` (the query is widened until the k-th distance is not tied).

Atomicity without transactions. Every write that must be all-or-nothing (``commit_window``,
``commit_distillation``, ``delete_episode``, ``delete_semantic``) is a numbered *step* of its user:

1. everything is computed first (a bad input raises before anything is written);
2. the user object records ``pending = k`` (k = committed + 1);
3. new episode/semantic versions are inserted with ``born = k`` under uuid5(user, kind, id, k);
   superseded/deleted versions get ``died = k`` (and ``gone = k`` when removed, not superseded);
   messages get ``ep``/``ep_step = k`` (the previous assignment kept in ``prev_ep``) and
   ``processed_step = k``; an episode marked distilled gets ``distilled_step = k``;
4. the commit record is written last: one replace of the user object with ``committed = k``,
   ``pending = 0`` (and ``next_window``). A single-object write is atomic, so this is the commit point.

Reads use the committed step N only: a version is live iff ``born <= N < died``, a message is pending
iff ``processed_step > N`` and belongs to ``ep`` if ``ep_step <= N`` else ``prev_ep``. A step that
crashed before its commit record is therefore invisible, and the next write step of that user rolls
it back first (deletes versions born after N, resets markers set after N). Objects with
``gone <= N`` are purged after the commit (best effort; they are invisible either way).

Deleting one message (``delete_message``) is a step too: the episode versions holding it get
``gone = k`` (``died = k`` if live), so do the semantic versions sourced only from those; the
deleted message gets ``deleted_step = k`` and is physically removed after the commit (a reader
skips a message with ``deleted_step <= N`` should a crash leave it behind); the live episode's
other messages are re-buffered with ``requeue_step = k``. A message is therefore pending iff
``processed_step > N`` or ``requeue_step <= N < reprocessed_step`` (re-processing it sets
``reprocessed_step``). ``metadata`` is the message's JSON-encoded metadata object.

Lexical retrieval: episodes and semantic entries carry a ``lexical`` property (cue,
narrative and raw messages; or the fact's text) with ``Tokenization.TRIGRAM`` (works for CJK without
word segmentation). A search given a ``query`` text with ``lexical_weight`` w > 0 is a hybrid search
(BM25 on ``lexical`` + our vector, ``alpha = 1 - w``, ``HybridFusion.RELATIVE_SCORE``; the closest
server-side match of ``SQLiteStore``'s weighted fusion, see ``store.lexical``), whose fused value in
[0, 1] is the result's ``score``. Trigram BM25
cannot match a query of 1–2 CJK characters: such a search is ranked by the vector alone.

Schema versions: 1 (first release); 2 adds the message properties ``metadata``,
``requeue_step``, ``reprocessed_step`` and ``deleted_step``. Opening version-1 collections adds
the missing properties in place (objects written by version 1 read as ``{}`` metadata, never
re-buffered, not deleted), so old data stays readable. 3 adds ``event_start``/``event_end`` of
semantic entries; 4 adds ``lexical`` to episodes and semantic entries, filled in for the stored
objects of every tenant when older collections are opened; 5 adds the semantic entries' ``origin`` and what
retired a superseded version (``retired_at``, ``retired_by``, ``retired_decision``: set with its ``died`` mark;
read only while ``died <= N``, so a rolled-back step leaves none behind). Objects stored before read them as
absent.

``add_messages`` is idempotent on (user_id, message id) through uuid5(user_id, message id); arrival
numbers continue from the largest stored ``seq``. A batch cut by a crash keeps the messages written
so far, and re-adding the batch stores the rest.

Limits: one writer process per user at a time. ``Memory`` serialises a user's writes within its process;
this store has no ``user_lock`` (``SQLiteStore`` has: a file lock), so two processes committing the same user
concurrently are not serialised: the second one's step would roll the first one's pending step back, and
concurrent adds may share arrival numbers. Run one API replica, or route every request of a user to the same
replica (docs/serving.md, "Scaling out"). Not run against a live server on the machine it was written on:
``tests/store/test_contract.py`` runs it when ``NEMORI_WEAVIATE_URL`` is set.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import json
import re
import uuid as uuid_lib
from dataclasses import dataclass, replace
from datetime import datetime
from types import SimpleNamespace
from typing import Any, Callable, Collection, Iterable, Mapping, Sequence, TypeVar
from urllib.parse import urlsplit

import numpy as np

from ..errors import (ConfigError, EmbedderMismatchError, MissingExtraError, NemoriError, NotFoundError,
                      StoreError)
from ..types import (Episode, Message, ScoredEpisode, ScoredSemantic, SearchResult, SemanticEntry, SemanticVersion,
                     StoredMessage, instant, metadata_matches, utcnow)
from .base import replacements, retired_decision
from .lexical import DEFAULT_LEXICAL_WEIGHT, lexical_text
from .sqlite import message_key

__all__ = ["WeaviateStore", "tenant_name", "collection_names", "SCHEMA_VERSION", "DEFAULT_PREFIX"]

#: 1: first release; 2: ``<prefix>Message`` has ``metadata``; 3: ``<prefix>Semantic`` has ``event_start``/
#: ``event_end`` (ISO text, "" when unknown); 4: ``lexical`` (trigram-tokenised text of episodes and entries);
#: 5: ``<prefix>Semantic`` has ``origin``, ``retired_at``, ``retired_by``, ``retired_decision``.
#: Opening older collections adds the missing properties.
SCHEMA_VERSION = 5
DEFAULT_PREFIX = "Nemori"
_SERVER_HINT = ("start a server (docker run -d -p 8080:8080 -p 50051:50051 semitechnologies/weaviate, "
               "version 1.27 or newer) or set NEMORI_STORE=sqlite")

_NEVER = 2**31 - 1          # "not yet" step; below 2**53 so it survives JSON/protobuf doubles
_VEC = "default"            # name of the self-provided vector
_CHUNK = 200                # ids per filter / objects per insert_many call
_PAGE = 1000                # objects per page of a filtered fetch
_TIE_EPS = 1e-6             # distances this close to the k-th are re-ranked by id
_NS = uuid_lib.UUID("5b0e7f3c-9d3a-4c55-8e2f-6a1d2b7c9e41")  # uuid5 namespace of this store
_PREFIX_RE = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,180}")

T = TypeVar("T")


# --------------------------------------------------------------------------- pure helpers
def tenant_name(user_id: str) -> str:
    """Tenant of a user: ``"u"`` + lowercase base32 of sha256(user_id), 53 chars of ``[a-z2-7]``.

    Deterministic and collision-free (a collision would be a sha256 collision); any string, however
    hostile or long, maps into Weaviate's tenant alphabet ``[A-Za-z0-9_-]{1,64}``.
    """
    digest = hashlib.sha256(user_id.encode("utf-8", "surrogatepass")).digest()
    return "u" + base64.b32encode(digest).decode("ascii").rstrip("=").lower()


def collection_names(prefix: str = DEFAULT_PREFIX) -> dict[str, str]:
    """Collection names for ``prefix``: keys ``message``, ``episode``, ``semantic``, ``meta``.

    Raises:
        ConfigError: ``prefix`` is not a letter followed by letters, digits or ``_``.
    """
    if not isinstance(prefix, str) or not _PREFIX_RE.fullmatch(prefix):
        raise ConfigError(f"invalid Weaviate collection prefix {prefix!r}. Fix: use a letter followed by "
                          "letters, digits or '_' (e.g. 'Nemori').")
    p = prefix[0].upper() + prefix[1:]  # Weaviate capitalises collection names
    return {k: p + k.capitalize() for k in ("message", "episode", "semantic", "meta")}


def _uid(*parts: Any) -> str:
    """Deterministic object uuid of a tuple of parts (JSON-encoded, so parts never run together)."""
    return str(uuid_lib.uuid5(_NS, json.dumps(parts)))  # ASCII JSON: lone surrogates are escaped too


def _unit(vector: Sequence[float]) -> list[float]:
    v = np.asarray(vector, dtype=np.float32)
    n = float(np.linalg.norm(v))
    return (v / n if n > 0 else v).tolist()


def _step(p: Mapping[str, Any], name: str) -> int:
    """An int step property; a property missing on an object written by schema version 1 is "not yet"."""
    v = p.get(name)
    return _NEVER if v is None else int(v)


def _pending(p: Mapping[str, Any], n: int) -> bool:
    """Is a message (its properties) pending at committed step ``n``? Deleted ones never are."""
    if _step(p, "deleted_step") <= n:
        return False
    return _step(p, "processed_step") > n or _step(p, "requeue_step") <= n < _step(p, "reprocessed_step")


def _score(distance: float | None) -> float:
    return max(-1.0, min(1.0, 1.0 - float(distance if distance is not None else 1.0)))


def _chunks(items: Sequence[T], size: int = _CHUNK) -> Iterable[Sequence[T]]:
    for i in range(0, len(items), size):
        yield items[i:i + size]


def _parse_url(url: str) -> tuple[str, int, bool]:
    """``http(s)://host[:port]`` → (host, port, secure). Raises ``ConfigError`` on anything else."""
    parts = urlsplit(url or "")
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"Weaviate URL {url!r} is not an http(s) URL. Fix: set NEMORI_WEAVIATE_URL to e.g. "
                          "http://localhost:8080.")
    secure = parts.scheme == "https"
    return parts.hostname, parts.port or (443 if secure else 8080), secure


def _incompatible_client(exc: ImportError) -> ConfigError:
    """The error for an installed weaviate-client that lacks what this module imports (an older major version)."""
    return ConfigError(f"the Weaviate store needs weaviate-client v4 ({exc}). Fix: pip install -U "
                       "'weaviate-client>=4.24', or set NEMORI_STORE=sqlite.")


def _import_weaviate() -> SimpleNamespace:
    """The weaviate-client pieces this module uses, imported on first use (the extra is optional)."""
    try:
        import weaviate
        from weaviate import exceptions
        from weaviate.classes.config import Configure, DataType, Property, Tokenization, VectorDistances
        from weaviate.classes.data import DataObject
        from weaviate.classes.init import AdditionalConfig, Timeout
        from weaviate.classes.query import Filter, HybridFusion, MetadataQuery, Sort
    except ModuleNotFoundError as exc:
        if exc.name != "weaviate":  # the package is there, a module of the v4 client is not: too old
            raise _incompatible_client(exc) from exc
        raise MissingExtraError("weaviate", "weaviate", "the Weaviate store",
                                alternative="set NEMORI_STORE=sqlite") from exc
    except ImportError as exc:
        raise _incompatible_client(exc) from exc
    return SimpleNamespace(weaviate=weaviate, exc=exceptions, Error=exceptions.WeaviateBaseError,
                           Configure=Configure, DataType=DataType, Property=Property, Tokenization=Tokenization,
                           VectorDistances=VectorDistances, DataObject=DataObject,
                           AdditionalConfig=AdditionalConfig, Timeout=Timeout, Filter=Filter,
                           MetadataQuery=MetadataQuery, Sort=Sort, HybridFusion=HybridFusion)


# --------------------------------------------------------------------------- schema
#: property name → kind: "key" (exact-match filterable text), "text" (stored only), "int", "lexical"
#: (BM25-searchable, trigram-tokenised text).
_SCHEMA: dict[str, dict[str, str]] = {
    "message": {"user_id": "key", "mid": "key", "seq": "int", "speaker": "text", "content": "text",
                "ts": "text", "ep": "key", "prev_ep": "key", "ep_step": "int", "processed_step": "int",
                "metadata": "text", "requeue_step": "int", "reprocessed_step": "int", "deleted_step": "int"},
    "episode": {"user_id": "key", "eid": "key", "cue": "text", "narrative": "text", "message_ids": "text",
                "start_ts": "text", "end_ts": "text", "supersedes": "text", "created_at": "text",
                "window_idx": "int", "born": "int", "died": "int", "gone": "int", "distilled_step": "int",
                "lexical": "lexical"},
    "semantic": {"user_id": "key", "eid": "key", "text": "text", "sources": "text", "supersedes": "text",
                 "created_at": "text", "born": "int", "died": "int", "gone": "int", "event_start": "text",
                 "event_end": "text", "lexical": "lexical", "origin": "text", "retired_at": "text",
                 "retired_by": "text", "retired_decision": "text"},
    "meta": {"kind": "key", "user_id": "key", "tenant": "key", "embedder": "text", "dim": "int",
             "schema_version": "int", "committed": "int", "pending": "int", "next_window": "int"},
}


def _properties(w: SimpleNamespace, spec: dict[str, str]) -> list:
    out = []
    for name, kind in spec.items():
        if kind == "int":
            out.append(w.Property(name=name, data_type=w.DataType.INT))
        elif kind == "lexical":
            out.append(w.Property(name=name, data_type=w.DataType.TEXT, tokenization=w.Tokenization.TRIGRAM,
                                  index_filterable=False, index_searchable=True))
        elif kind == "key":
            out.append(w.Property(name=name, data_type=w.DataType.TEXT, tokenization=w.Tokenization.FIELD,
                                  index_filterable=True, index_searchable=False))
        else:
            out.append(w.Property(name=name, data_type=w.DataType.TEXT, index_filterable=False,
                                  index_searchable=False))
    return out


def _missing_properties(kind: str, existing: Iterable[str]) -> dict[str, str]:
    """Properties of ``_SCHEMA[kind]`` a collection created by an older version lacks (name → kind).

    Weaviate may report names with a lower-cased first letter, so names are compared case-insensitively."""
    have = {n.lower() for n in existing}
    return {name: k for name, k in _SCHEMA[kind].items() if name.lower() not in have}


def _iso(ts: datetime | None) -> str:
    return "" if ts is None else ts.isoformat()


def _from_iso(text: Any) -> datetime | None:
    return datetime.fromisoformat(text) if isinstance(text, str) and text else None


@dataclass(frozen=True)
class _User:
    """A user's commit record (the ``user`` object of ``<prefix>Meta``)."""

    user_id: str
    tenant: str
    committed: int = 0
    pending: int = 0
    next_window: int = 0

    def props(self) -> dict[str, Any]:
        return {"kind": "user", "user_id": self.user_id, "tenant": self.tenant, "committed": self.committed,
                "pending": self.pending, "next_window": self.next_window}


def _guarded(fn: Callable[..., T]) -> Callable[..., T]:
    """Turn weaviate-client errors of a public method into ``StoreError`` naming the URL and a fix."""

    @functools.wraps(fn)
    def wrapper(self: "WeaviateStore", *args: Any, **kwargs: Any) -> T:
        try:
            return fn(self, *args, **kwargs)
        except NemoriError:
            raise
        except self._w.Error as exc:
            raise StoreError(f"Weaviate at {self.url} failed in {fn.__name__}: {exc}. Fix: check the server "
                             f"(curl {self.url}/v1/.well-known/ready) and retry; or {_SERVER_HINT}.") from exc

    return wrapper


# --------------------------------------------------------------------------- the store
class WeaviateStore:
    """``MemoryStore`` on a Weaviate server: one tenant per user, exact flat cosine search.

    Args:
        url: Weaviate HTTP URL, e.g. ``http://localhost:8080`` (``https://`` for TLS).
        prefix: collection name prefix (``<prefix>Message`` ...); separate prefixes are separate stores.
        grpc_port: the server's gRPC port (default 50051; the same host as ``url``).
        api_key: optional Weaviate API key.
        timeout_s: per-request timeout for queries and writes.
        init_timeout_s: timeout of the connection checks at start-up.
        naive_timezone: zone naive timestamps are read in when episodes are ordered by time.
    Raises:
        ConfigError: weaviate-client is not installed (``MissingExtraError``, naming the pip command) or too old
            for the v4 API, or ``url``/``prefix`` is malformed.
        StoreError: the server cannot be reached (names the URL and how to start one), or the
            collections were written by a newer schema version.
    """

    def __init__(self, url: str, prefix: str = DEFAULT_PREFIX, *, grpc_port: int = 50051,
                 api_key: str | None = None, timeout_s: float = 30.0, init_timeout_s: float = 5.0,
                 naive_timezone: str = "UTC", lexical_weight: float = DEFAULT_LEXICAL_WEIGHT) -> None:
        self.url = url
        self.naive_timezone = naive_timezone
        if not 0.0 <= float(lexical_weight) <= 1.0:
            raise ConfigError(f"lexical_weight={lexical_weight!r} is outside [0, 1]. Fix: pass 0 (vector only) to 1.")
        self.lexical_weight = float(lexical_weight)
        self._dim_settled = False
        self.prefix = prefix
        self._names = collection_names(prefix)
        host, port, secure = _parse_url(url)
        self._w = _import_weaviate()
        self._client = self._connect(host, port, secure, grpc_port, api_key, timeout_s, init_timeout_s)
        try:
            self._cols = self._ensure_collections()
            self._ensure_config()
        except BaseException as exc:
            self._client.close()
            if isinstance(exc, self._w.Error):
                raise StoreError(f"Weaviate at {url} refused the schema setup: {exc}. Fix: check the server "
                                 f"version (1.27 or newer) and its logs, or {_SERVER_HINT}.") from exc
            raise

    # ------------------------------------------------------------------ plumbing
    def _connect(self, host: str, port: int, secure: bool, grpc_port: int, api_key: str | None,
                 timeout_s: float, init_timeout_s: float) -> Any:
        w = self._w
        config = w.AdditionalConfig(timeout=w.Timeout(init=init_timeout_s, query=timeout_s, insert=timeout_s))
        try:
            return w.weaviate.connect_to_custom(
                http_host=host, http_port=port, http_secure=secure, grpc_host=host, grpc_port=grpc_port,
                grpc_secure=secure, auth_credentials=api_key, additional_config=config)
        except (w.Error, OSError) as exc:
            raise StoreError(f"cannot reach Weaviate at {self.url} (gRPC port {grpc_port}): {exc}. "
                             f"Fix: {_SERVER_HINT}.") from exc

    def _ensure_collections(self) -> dict[str, Any]:
        cols = {}
        for kind, name in self._names.items():
            if not self._client.collections.exists(name):
                self._create_collection(kind, name)
                cols[kind] = self._client.collections.use(name)
            else:
                cols[kind] = self._client.collections.use(name)
                self._add_missing_properties(kind, cols[kind])
        return cols

    def _add_missing_properties(self, kind: str, coll: Any) -> None:
        """Schema migration: add the properties an older version's collection lacks (objects stored
        before read them as absent, e.g. a semantic entry without event time)."""
        existing = [p.name for p in coll.config.get().properties]
        for name, spec in _missing_properties(kind, existing).items():
            try:
                coll.config.add_property(_properties(self._w, {name: spec})[0])
            except self._w.exc.UnexpectedStatusCodeError:
                if name.lower() not in {p.name.lower() for p in coll.config.get().properties}:
                    raise  # not a concurrent opener that added it first

    def _create_collection(self, kind: str, name: str) -> None:
        w = self._w
        vectors = w.Configure.Vectors.self_provided(
            name=_VEC, vector_index_config=w.Configure.VectorIndex.flat(distance_metric=w.VectorDistances.COSINE))
        mt = None if kind == "meta" else w.Configure.multi_tenancy(enabled=True)
        try:
            self._client.collections.create(name, properties=_properties(w, _SCHEMA[kind]), vector_config=vectors,
                                            multi_tenancy_config=mt)
        except w.exc.UnexpectedStatusCodeError:
            if not self._client.collections.exists(name):  # lost a creation race: fine; else re-raise
                raise

    def _config(self) -> dict[str, Any] | None:
        obj = self._cols["meta"].query.fetch_object_by_id(_uid("config"))
        return dict(obj.properties) if obj is not None else None

    def _ensure_config(self) -> None:
        cfg = self._config()
        if cfg is None:
            try:
                props = {"kind": "config", "schema_version": SCHEMA_VERSION}
                self._cols["meta"].data.insert(props, uuid=_uid("config"))
            except self._w.Error:
                if self._config() is None:
                    raise
            return
        if int(cfg.get("schema_version") or 0) > SCHEMA_VERSION:
            raise StoreError(f"Weaviate collections {self._names['meta']} at {self.url} have schema version "
                             f"{cfg['schema_version']}, newer than this nemori-dspy ({SCHEMA_VERSION}). Fix: upgrade "
                             "nemori-dspy or use another collection prefix.")
        if int(cfg.get("schema_version") or 0) < SCHEMA_VERSION:  # properties were added by _ensure_collections
            if int(cfg.get("schema_version") or 0) < 4:
                self._backfill_lexical()
            self._cols["meta"].data.update(uuid=_uid("config"), properties={"schema_version": SCHEMA_VERSION})

    def _backfill_lexical(self) -> None:
        """Schema 4: give every stored episode / semantic object of every tenant its ``lexical`` text."""
        for tenant in sorted(self._cols["episode"].tenants.get()):
            eps = self._cols["episode"].with_tenant(tenant)
            objs = [o for o in eps.iterator(cache_size=1000) if not o.properties.get("lexical")]
            mids = list({m for o in objs for m in json.loads(o.properties["message_ids"])})
            msgs = self._cols["message"].with_tenant(tenant)
            content = {o.properties["mid"]: o.properties["content"]
                       for o in self._by_uuids(msgs, [_uid("msg", objs[0].properties["user_id"], m) for m in mids])
                       } if objs else {}
            self._patch(eps, {str(o.uuid): {"lexical": lexical_text(
                o.properties["cue"], o.properties["narrative"],
                *[content.get(m, "") for m in json.loads(o.properties["message_ids"])])} for o in objs})
        for tenant in sorted(self._cols["semantic"].tenants.get()):
            sem = self._cols["semantic"].with_tenant(tenant)
            self._patch(sem, {str(o.uuid): {"lexical": lexical_text(o.properties["text"])}
                              for o in sem.iterator(cache_size=1000) if not o.properties.get("lexical")})

    def close(self) -> None:
        """Close the client's HTTP and gRPC connections."""
        self._client.close()

    def _tc(self, kind: str, user: _User) -> Any:
        """Tenant-scoped handle of a collection."""
        return self._cols[kind].with_tenant(user.tenant)

    def _f(self, name: str) -> Any:
        return self._w.Filter.by_property(name)

    def _live(self, n: int) -> Any:
        """Filter: versions live at committed step ``n``."""
        return self._f("born").less_or_equal(n) & self._f("died").greater_than(n)

    def _by_uuids(self, coll: Any, uuids: Sequence[str], filters: Any = None, vectors: bool = False) -> list:
        out = []
        for chunk in _chunks(list(dict.fromkeys(uuids))):
            f = self._w.Filter.by_id().contains_any(list(chunk))
            res = coll.query.fetch_objects(filters=f if filters is None else f & filters, limit=len(chunk),
                                           include_vector=vectors)
            out.extend(res.objects)
        return out

    def _by_key(self, coll: Any, key: str, values: Sequence[str], filters: Any, vectors: bool = False) -> list:
        """Objects whose ``key`` property is one of ``values`` and that pass ``filters`` (paged)."""
        out = []
        for chunk in _chunks(list(dict.fromkeys(values))):
            f, offset = self._f(key).contains_any(list(chunk)) & filters, 0
            while True:
                res = coll.query.fetch_objects(filters=f, limit=_PAGE, offset=offset, include_vector=vectors)
                out.extend(res.objects)
                if len(res.objects) < _PAGE:
                    break
                offset += _PAGE
        return out

    def _scan(self, coll: Any, keep: Callable[[dict], bool], vectors: bool = False) -> list:
        """Every object of a (tenant) collection whose properties pass ``keep`` (cursor API, no size cap)."""
        return [o for o in coll.iterator(include_vector=vectors, cache_size=1000) if keep(o.properties)]

    def _count(self, coll: Any, filters: Any = None) -> int:
        return int(coll.aggregate.over_all(filters=filters, total_count=True).total_count or 0)

    def _insert(self, coll: Any, objects: list) -> None:
        for chunk in _chunks(objects):
            res = coll.data.insert_many(list(chunk))
            if res.has_errors:
                first = next(iter(res.errors.values()))
                raise StoreError(f"Weaviate at {self.url} rejected {len(res.errors)} of {len(chunk)} objects: "
                                 f"{getattr(first, 'message', first)}. Fix: check the server logs and retry.")

    def _patch(self, coll: Any, patches: dict[str, dict[str, Any]]) -> None:
        for obj_uuid, props in patches.items():
            coll.data.update(uuid=obj_uuid, properties=props)

    # ------------------------------------------------------------------ users and steps
    def _user(self, user_id: str) -> _User | None:
        obj = self._cols["meta"].query.fetch_object_by_id(_uid("user", user_id))
        if obj is None:
            return None
        p = obj.properties
        return _User(user_id=user_id, tenant=p["tenant"], committed=int(p.get("committed") or 0),
                     pending=int(p.get("pending") or 0), next_window=int(p.get("next_window") or 0))

    def _put_user(self, user: _User) -> None:
        """Replace the user object: one atomic single-object write (the commit point of a step)."""
        self._cols["meta"].data.replace(uuid=_uid("user", user.user_id), properties=user.props())

    def _ensure_user(self, user_id: str) -> _User:
        user = self._user(user_id)
        if user is not None:
            return user
        user = _User(user_id=user_id, tenant=tenant_name(user_id))
        self._drop_tenants(user.tenant)  # leftovers of a delete_user cut short: start from scratch
        for kind in ("message", "episode", "semantic"):
            self._cols[kind].tenants.create(user.tenant)
        self._cols["meta"].data.insert(user.props(), uuid=_uid("user", user_id))
        return user

    def _drop_tenants(self, tenant: str) -> None:
        for kind in ("message", "episode", "semantic"):
            if self._cols[kind].tenants.exists(tenant):
                self._cols[kind].tenants.remove(tenant)

    def _writable_user(self, user_id: str) -> _User:
        """The user, created if new, with any uncommitted (crashed) step rolled back."""
        user = self._ensure_user(user_id)
        if user.pending:
            self._rollback(user)
            user = replace(user, pending=0)
            self._put_user(user)
        return user

    def _rollback(self, user: _User) -> None:
        """Undo every trace of steps after ``user.committed`` (invisible to readers already)."""
        n = user.committed
        for kind in ("episode", "semantic"):
            coll = self._tc(kind, user)
            coll.data.delete_many(where=self._f("born").greater_than(n))
            marks = ("died", "gone", "distilled_step") if kind == "episode" else ("died", "gone")
            patches = {}
            for o in self._scan(coll, lambda p: any(n < int(p.get(m) or 0) < _NEVER for m in marks)):
                patches[str(o.uuid)] = {m: _NEVER for m in marks if n < int(o.properties.get(m) or 0) < _NEVER}
            self._patch(coll, patches)
        self._patch(self._tc("message", user), self._message_rollbacks(user))

    def _message_rollbacks(self, user: _User) -> dict[str, dict[str, Any]]:
        n, patches = user.committed, {}
        coll = self._tc("message", user)
        marks = ("processed_step", "requeue_step", "reprocessed_step", "deleted_step")
        touched = lambda p: int(p["ep_step"]) > n or any(n < _step(p, m) < _NEVER for m in marks)  # noqa: E731
        for o in self._scan(coll, touched):
            p, patch = o.properties, {}
            if int(p["ep_step"]) > n:
                patch.update(ep=p.get("prev_ep") or "", ep_step=0)
            for m in marks:  # each marker set by the crashed step goes back to "not yet"
                if n < _step(p, m) < _NEVER:
                    patch[m] = _NEVER
            patches[str(o.uuid)] = patch
        return patches

    def _begin(self, user: _User) -> int:
        k = user.committed + 1
        self._put_user(replace(user, pending=k))
        return k

    def _commit(self, user: _User, k: int, purge: bool = False, **changes: Any) -> None:
        self._put_user(replace(user, committed=k, pending=0, **changes))
        if purge:
            self._purge(user, k)

    def _purge(self, user: _User, k: int) -> None:
        """Physically delete versions removed at or before step ``k`` (best effort)."""
        for kind in ("episode", "semantic"):
            try:
                self._tc(kind, user).data.delete_many(where=self._f("gone").less_or_equal(k))
            except self._w.Error:  # pragma: no cover - invisible leftovers, purged by a later step
                pass

    # ------------------------------------------------------------------ embedder
    @_guarded
    def check_embedder(self, name: str, dim: int | None) -> None:
        """Record (name, dim) on first use; raise ``EmbedderMismatchError`` naming both if it differs later.

        ``dim`` may be None (a litellm embedder learns it from its first reply): it is recorded as 0
        (unknown) and filled in from the first stored vector or the first check that knows it.
        """
        cfg = self._config() or {}
        if not cfg.get("embedder"):
            self._cols["meta"].data.update(uuid=_uid("config"), properties={"embedder": name, "dim": int(dim or 0)})
            return
        known = int(cfg.get("dim") or 0) or None
        if cfg["embedder"] == name and known is None and dim is not None:
            self._cols["meta"].data.update(uuid=_uid("config"), properties={"dim": int(dim)})
            return
        if cfg["embedder"] != name or (dim is not None and known is not None and known != dim):
            raise EmbedderMismatchError(
                f"Weaviate collections '{self._names['meta'][:-4]}*' at {self.url} were built with embedder "
                f"{cfg['embedder']!r} ({known or 'unknown'}-d) but are opened with {name!r} ({dim or 'unknown'}-d). "
                "Fix: configure the original embedder, or use another collection prefix and re-ingest (vectors "
                "of different models are not comparable).")

    def _settle_dim(self, vectors: Sequence[Sequence[float]]) -> None:
        """Record the dimension of the first stored vectors if the embedder's was unknown (read once)."""
        if not vectors or self._dim_settled:
            return
        cfg = self._config() or {}
        if cfg.get("embedder") and not int(cfg.get("dim") or 0):
            self._cols["meta"].data.update(uuid=_uid("config"), properties={"dim": len(vectors[0])})
        self._dim_settled = bool(cfg.get("embedder"))

    # ------------------------------------------------------------------ messages
    @_guarded
    def add_messages(self, user_id: str, messages: Sequence[Message]) -> list[StoredMessage]:
        """Persist messages idempotently (same (user, id) → ignored); returns the newly stored ones."""
        keyed: dict[str, Message] = {}
        for m in messages:
            keyed.setdefault(message_key(m), m)  # a repeated id inside the batch: the first one wins
        user = self._ensure_user(user_id)  # as SQLite: even an empty batch makes the user known
        if not keyed:
            return []
        coll = self._tc("message", user)
        known = {o.properties["mid"] for o in self._by_uuids(coll, [_uid("msg", user_id, k) for k in keyed])
                 if _step(o.properties, "deleted_step") > user.committed}  # a deleted leftover is overwritten
        fresh = [(key, m) for key, m in keyed.items() if key not in known]
        if not fresh:
            return []
        seq = self._max_seq(coll) + 1
        objects, added = [], []
        for key, m in fresh:
            props = {"user_id": user_id, "mid": key, "seq": seq, "speaker": m.speaker, "content": m.content,
                     "ts": m.timestamp.isoformat(), "ep": "", "prev_ep": "", "ep_step": 0, "processed_step": _NEVER,
                     "metadata": json.dumps(m.metadata), "requeue_step": _NEVER, "reprocessed_step": _NEVER,
                     "deleted_step": _NEVER}
            objects.append(self._w.DataObject(properties=props, uuid=_uid("msg", user_id, key)))
            added.append(StoredMessage(user_id=user_id, id=key, seq=seq, speaker=m.speaker, content=m.content,
                                       timestamp=m.timestamp, metadata=m.metadata))
            seq += 1
        self._insert(coll, objects)
        return added

    def _max_seq(self, coll: Any) -> int:
        res = coll.query.fetch_objects(limit=1, sort=self._w.Sort.by_property("seq", ascending=False),
                                       return_properties=["seq"])
        return int(res.objects[0].properties["seq"]) if res.objects else 0

    @staticmethod
    def _message(user_id: str, p: dict, n: int) -> StoredMessage:
        ep = p.get("ep") if int(p.get("ep_step") or 0) <= n else p.get("prev_ep")
        return StoredMessage(user_id=user_id, id=p["mid"], seq=int(p["seq"]), speaker=p["speaker"],
                             content=p["content"], timestamp=datetime.fromisoformat(p["ts"]), episode_id=ep or None,
                             metadata=json.loads(p.get("metadata") or "{}"))

    def _pending_filter(self, n: int) -> Any:
        """Filter: messages pending at committed step ``n`` (see ``_pending``; deleted leftovers are
        skipped in Python)."""
        f = self._f
        return f("processed_step").greater_than(n) | (f("requeue_step").less_or_equal(n)
                                                      & f("reprocessed_step").greater_than(n))

    @_guarded
    def pending_messages(self, user_id: str, limit: int | None = None) -> list[StoredMessage]:
        """Messages not yet processed into an episode, in arrival order (at most ``limit``)."""
        user = self._user(user_id)
        if user is None or limit == 0:
            return []
        n, coll = user.committed, self._tc("message", user)
        if limit is not None and limit > 0:
            res = coll.query.fetch_objects(filters=self._pending_filter(n), limit=int(limit),
                                           sort=self._w.Sort.by_property("seq", ascending=True))
            objs = [o for o in res.objects if _pending(o.properties, n)]
        else:
            objs = self._scan(coll, lambda p: _pending(p, n))
        return sorted((self._message(user_id, o.properties, n) for o in objs), key=lambda m: m.seq)

    @_guarded
    def get_messages(self, user_id: str, ids: Sequence[str]) -> list[StoredMessage]:
        """Messages by id in the given order; unknown ids are skipped."""
        user = self._user(user_id)
        return [] if user is None or not ids else self._get_messages(user, ids)

    def _get_messages(self, user: _User, ids: Sequence[str]) -> list[StoredMessage]:
        objs = self._by_uuids(self._tc("message", user), [_uid("msg", user.user_id, i) for i in ids])
        found = {o.properties["mid"]: self._message(user.user_id, o.properties, user.committed) for o in objs
                 if _step(o.properties, "deleted_step") > user.committed}
        return [found[i] for i in ids if i in found]

    # ------------------------------------------------------------------ episodes
    def _episode_object(self, user_id: str, ep: Episode, k: int, contents: Mapping[str, str]) -> Any:
        """The object of one episode version; ``contents`` = message id → text (for ``lexical``)."""
        props = {"lexical": lexical_text(ep.cue, ep.narrative, *[contents.get(m, "") for m in ep.message_ids]),"user_id": user_id, "eid": ep.id, "cue": ep.cue, "narrative": ep.narrative,
                 "message_ids": json.dumps(list(ep.message_ids)), "start_ts": ep.start.isoformat(),
                 "end_ts": ep.end.isoformat(), "supersedes": json.dumps(list(ep.supersedes)),
                 "created_at": ep.created_at.isoformat(), "window_idx": int(ep.window), "born": k, "died": _NEVER,
                 "gone": _NEVER, "distilled_step": k if ep.distilled else _NEVER}
        vector = {_VEC: _unit(ep.vector)} if len(ep.vector) else None
        return self._w.DataObject(properties=props, uuid=_uid("episode", user_id, ep.id, k), vector=vector)

    def _episodes(self, user: _User, objs: Sequence[Any]) -> list[Episode]:
        """Episodes of live versions, with their raw messages (one message fetch for all)."""
        mids = {o.uuid: json.loads(o.properties["message_ids"]) for o in objs}
        msgs = {m.id: m for m in self._get_messages(user, [i for ids in mids.values() for i in ids])}
        out = []
        for o in objs:
            p, ids = o.properties, mids[o.uuid]
            out.append(Episode(
                id=p["eid"], user_id=user.user_id, cue=p["cue"], narrative=p["narrative"], message_ids=ids,
                messages=[msgs[i] for i in ids if i in msgs], start=datetime.fromisoformat(p["start_ts"]),
                end=datetime.fromisoformat(p["end_ts"]), vector=list((o.vector or {}).get(_VEC, [])),
                supersedes=json.loads(p["supersedes"]), created_at=datetime.fromisoformat(p["created_at"]),
                window=int(p["window_idx"]), distilled=int(p["distilled_step"]) <= user.committed))
        return out

    def _live_versions(self, user: _User, kind: str, ids: Sequence[str], vectors: bool = False) -> list:
        return self._by_key(self._tc(kind, user), "eid", ids, self._live(user.committed), vectors) if ids else []

    @_guarded
    def next_window(self, user_id: str) -> int:
        """The window index the next ``commit_window`` should use (0 for a new user)."""
        user = self._user(user_id)
        return user.next_window if user else 0

    @_guarded
    def commit_window(self, user_id: str, window: int, episodes: Sequence[Episode],
                      superseded: Sequence[str]) -> None:
        """Atomically (one step): supersede old episodes, insert ``episodes``, assign + process their messages.

        Raises:
            StoreError: ``window`` was already committed (a replay after a crash must recompute it).
        """
        existing = self._user(user_id)
        expected = existing.next_window if existing else 0
        if window != expected:
            raise StoreError(f"window {window} of user {user_id!r} is stale (next is {expected}); "
                             "Fix: re-read pending messages and recompute the window.")
        user = self._writable_user(user_id)
        self._settle_dim([ep.vector for ep in episodes if ep.vector])
        k = user.committed + 1
        unique = list({ep.id: ep for ep in episodes}.values())  # a repeated id: the last one wins, as in SQLite
        contents = {m.id: m.content for m in self._get_messages(user, [i for ep in unique for i in ep.message_ids])}
        new = [self._episode_object(user_id, ep, k, contents) for ep in unique]
        kills = self._kills(user, "episode", k, superseded, [ep.id for ep in unique])
        assigns = self._assignments(user, episodes, k)
        self._begin(user)
        self._patch(self._tc("episode", user), kills)
        self._insert(self._tc("episode", user), new)
        self._patch(self._tc("message", user), assigns)
        self._commit(user, k, purge=any("gone" in p for p in kills.values()), next_window=window + 1)

    def _kills(self, user: _User, kind: str, k: int, dead: Sequence[str], replaced: Sequence[str],
               retired: Mapping[str, Mapping[str, Any]] | None = None) -> dict:
        """Patches ending the live versions of ``dead`` ids (superseded; ``retired`` adds properties to an id's
        patch: what retired it) and every kept version of ``replaced`` ids (overwritten, as SQLite's INSERT OR
        REPLACE does)."""
        n, patches = user.committed, {}
        for o in self._live_versions(user, kind, list(dead)):
            patches[str(o.uuid)] = {"died": k, **(retired or {}).get(o.properties["eid"], {})}
        kept = self._by_key(self._tc(kind, user), "eid", replaced, self._f("gone").greater_than(n)) if replaced else []
        for o in kept:
            patches[str(o.uuid)] = {"gone": k, **({"died": k} if int(o.properties["died"]) > n else {})}
        return patches

    def _assignments(self, user: _User, episodes: Sequence[Episode], k: int) -> dict[str, dict[str, Any]]:
        """Patches assigning each message to its (last) new episode and marking it processed at step k."""
        target = {mid: ep.id for ep in episodes for mid in ep.message_ids}
        objs = self._by_uuids(self._tc("message", user), [_uid("msg", user.user_id, m) for m in target])
        patches = {}
        for o in objs:
            p = o.properties
            patch = {"prev_ep": p.get("ep") or "", "ep": target[p["mid"]], "ep_step": k}
            if int(p["processed_step"]) > user.committed:
                patch["processed_step"] = k
            elif _pending(p, user.committed):  # re-buffered by delete_message
                patch["reprocessed_step"] = k
            patches[str(o.uuid)] = patch
        return patches

    @_guarded
    def get_episode(self, user_id: str, episode_id: str) -> Episode:
        """One live episode with raw messages. Raises ``NotFoundError``."""
        user = self._user(user_id)
        objs = self._live_versions(user, "episode", [episode_id], vectors=True) if user else []
        if not objs:
            raise NotFoundError(f"no live episode {episode_id!r} for user {user_id!r}. "
                                "Fix: list ids with Memory.list_episodes(user_id).")
        return self._episodes(user, objs[:1])[0]

    def _scan_live(self, user: _User, kind: str, extra: Callable[[dict], bool] = lambda p: True) -> list:
        n = user.committed
        return self._scan(self._tc(kind, user), lambda p: int(p["born"]) <= n < int(p["died"]) and extra(p),
                          vectors=True)

    @_guarded
    def list_episodes(self, user_id: str) -> list[Episode]:
        """All live episodes, by start time then id, with raw messages."""
        user = self._user(user_id)
        if user is None:
            return []
        eps = self._episodes(user, self._scan_live(user, "episode"))
        return sorted(eps, key=lambda e: (instant(e.start, self.naive_timezone), e.id))

    @_guarded
    def delete_episode(self, user_id: str, episode_id: str) -> None:
        """Delete one live episode (its messages stay processed, unassigned). Raises ``NotFoundError``."""
        user = self._user(user_id)
        if user is not None:
            user = self._writable_user(user_id)
        objs = self._live_versions(user, "episode", [episode_id]) if user else []
        if not objs:
            raise NotFoundError(f"no live episode {episode_id!r} for user {user_id!r}.")
        k = user.committed + 1
        mids = json.loads(objs[0].properties["message_ids"])
        msgs = self._by_uuids(self._tc("message", user), [_uid("msg", user_id, m) for m in mids],
                              filters=self._f("ep").equal(episode_id))
        self._begin(user)
        self._patch(self._tc("episode", user), {str(o.uuid): {"died": k, "gone": k} for o in objs})
        self._patch(self._tc("message", user),
                    {str(o.uuid): {"prev_ep": episode_id, "ep": "", "ep_step": k} for o in msgs})
        self._commit(user, k, purge=True)

    @_guarded
    def episodes_to_distill(self, user_id: str) -> list[Episode]:
        """Live, not-yet-distilled episodes, in window then start order."""
        user = self._user(user_id)
        if user is None:
            return []
        n = user.committed
        eps = self._episodes(user, self._scan_live(user, "episode", lambda p: int(p["distilled_step"]) > n))
        return sorted(eps, key=lambda e: (e.window, instant(e.start, self.naive_timezone), e.id))

    # ------------------------------------------------------------------ search
    def _nearest(self, coll: Any, vector: Sequence[float], top_k: int, filters: Any) -> list[tuple[Any, float]]:
        """Exact top-k (object, score) by cosine, ties at the k-th distance resolved by id."""
        if top_k <= 0:
            return []
        query, limit = _unit(vector), top_k + 1
        while True:
            objs = coll.query.near_vector(near_vector=query, target_vector=_VEC, limit=limit, filters=filters,
                                          include_vector=True,
                                          return_metadata=self._w.MetadataQuery(distance=True)).objects
            if len(objs) < limit or objs[-1].metadata.distance > objs[top_k - 1].metadata.distance + _TIE_EPS:
                break
            limit *= 2  # the (k+1)-th is tied with the k-th: widen until the tie group is complete
        scored = [(o, _score(o.metadata.distance)) for o in objs]
        scored.sort(key=lambda t: (-t[1], t[0].properties["eid"]))
        return scored[:top_k]

    def _hybrid(self, coll: Any, vector: Sequence[float], query: str, top_k: int,
                filters: Any) -> list[tuple[Any, float]]:
        """Top-k (object, fused score in [0, 1]) of a hybrid search: BM25 on ``lexical`` fused with our
        vector by relative score fusion, ``alpha = 1 - lexical_weight``; ties by id."""
        w = self._w
        objs = coll.query.hybrid(query=query, vector=_unit(vector), target_vector=_VEC,
                                 alpha=1.0 - self.lexical_weight, fusion_type=w.HybridFusion.RELATIVE_SCORE,
                                 query_properties=["lexical"], limit=top_k, filters=filters, include_vector=True,
                                 return_metadata=w.MetadataQuery(score=True)).objects
        scored = [(o, float(o.metadata.score or 0.0)) for o in objs]
        return sorted(scored, key=lambda t: (-t[1], t[0].properties["eid"]))

    def _top(self, coll: Any, vector: Sequence[float], top_k: int, filters: Any,
             query: str | None) -> list[tuple[Any, float]]:
        if query and query.strip() and self.lexical_weight > 0 and top_k > 0:  # threshold searches pass no query
            return self._hybrid(coll, vector, query, top_k, filters)
        return self._nearest(coll, vector, top_k, filters)

    @_guarded
    def search_episodes(self, user_id: str, vector: Sequence[float], top_k: int,
                        before_window: int | None = None, only: Collection[str] | None = None,
                        query: str | None = None) -> list[ScoredEpisode]:
        """Exact cosine top-k live episodes of one user (windows < ``before_window`` only, and only
        ids in ``only``, if given); with ``query``, a hybrid search (module docstring)."""
        user = self._user(user_id)
        if user is None or top_k <= 0 or (only is not None and not only):
            return []
        filters = self._live(user.committed)
        if before_window is not None:
            filters = filters & self._f("window_idx").less_than(int(before_window))
        if only is not None:
            filters = filters & self._f("eid").contains_any(sorted(only))
        hits = self._top(self._tc("episode", user), vector, top_k, filters, query)
        episodes = self._episodes(user, [o for o, _ in hits])
        return [ScoredEpisode(episode=e, score=s) for e, (_, s) in zip(episodes, hits)]

    @_guarded
    def search_semantic(self, user_id: str, vector: Sequence[float], top_k: int,
                        threshold: float | None = None, sources: Collection[str] | None = None,
                        query: str | None = None) -> list[ScoredSemantic]:
        """Exact cosine top-k live semantic entries, score > ``threshold`` if given (τ, §3.3.1); with
        ``sources``, only entries with at least one source episode id in it; with ``query``, a hybrid
        search (module docstring)."""
        user = self._user(user_id)
        if user is None or top_k <= 0:
            return []
        filters = self._live(user.committed)
        if sources is not None:
            wanted = set(sources)
            ok = sorted({o.properties["eid"] for o in self._scan_live(user, "semantic")
                         if wanted.intersection(json.loads(o.properties["sources"]))})
            if not ok:
                return []
            filters = filters & self._f("eid").contains_any(ok)
        hits = self._top(self._tc("semantic", user), vector, top_k, filters, query)
        return [ScoredSemantic(entry=self._entry(user_id, o), score=s) for o, s in hits
                if threshold is None or s > threshold]

    # ------------------------------------------------------------------ semantic
    def _entry_object(self, user_id: str, e: SemanticEntry, k: int) -> Any:
        props = {"lexical": lexical_text(e.text), "user_id": user_id, "eid": e.id, "text": e.text,
                 "sources": json.dumps(list(e.source_episode_ids)), "supersedes": json.dumps(list(e.supersedes)),
                 "created_at": e.created_at.isoformat(), "born": k, "died": _NEVER, "gone": _NEVER,
                 "event_start": _iso(e.event_start), "event_end": _iso(e.event_end), "origin": e.origin or "",
                 "retired_at": "", "retired_by": "", "retired_decision": ""}
        vector = {_VEC: _unit(e.vector)} if len(e.vector) else None
        return self._w.DataObject(properties=props, uuid=_uid("semantic", user_id, e.id, k), vector=vector)

    @staticmethod
    def _entry(user_id: str, o: Any) -> SemanticEntry:
        p = o.properties
        return SemanticEntry(id=p["eid"], user_id=user_id, text=p["text"], vector=list((o.vector or {}).get(_VEC, [])),
                             source_episode_ids=json.loads(p["sources"]), supersedes=json.loads(p["supersedes"]),
                             created_at=datetime.fromisoformat(p["created_at"]),
                             event_start=_from_iso(p.get("event_start")), event_end=_from_iso(p.get("event_end")),
                             origin=p.get("origin") or None)

    @classmethod
    def _version(cls, user_id: str, o: Any, n: int) -> SemanticVersion:
        """A kept semantic version at committed step ``n``; what retired it is read only once it died."""
        p, live = o.properties, int(o.properties["died"]) > n
        return SemanticVersion(**dict(cls._entry(user_id, o)), live=live,
                               retired_at=None if live else _from_iso(p.get("retired_at")),
                               retired_by=None if live else p.get("retired_by") or None,
                               retired_decision=None if live else p.get("retired_decision") or None)

    @staticmethod
    def _retired_props(ids: Sequence[str], by: Mapping[str, SemanticEntry]) -> dict[str, dict[str, Any]]:
        """id → the properties recording what retired it: now, the replacing entry's id and its decision."""
        now, out = utcnow().isoformat(), {}
        for i in ids:
            new = by.get(i)
            out[i] = {"retired_at": now, "retired_by": new.id if new is not None else "",
                      "retired_decision": retired_decision(new)}
        return out

    @_guarded
    def commit_distillation(self, user_id: str, episode_id: str, inserts: Sequence[SemanticEntry],
                            deletes: Sequence[str]) -> None:
        """Atomically (one step) supersede ``deletes``, insert ``inserts`` and mark the episode distilled."""
        user = self._writable_user(user_id)
        self._settle_dim([e.vector for e in inserts if e.vector])
        k = user.committed + 1
        unique = list({e.id: e for e in inserts}.values())  # a repeated id: the last one wins, as in SQLite
        new = [self._entry_object(user_id, e, k) for e in unique]
        kills = self._kills(user, "semantic", k, deletes, [e.id for e in unique],
                            self._retired_props(list(deletes), replacements(inserts)))
        distilled = {str(o.uuid): {"distilled_step": k} for o in self._live_versions(user, "episode", [episode_id])
                     if int(o.properties["distilled_step"]) > user.committed}
        self._begin(user)
        self._patch(self._tc("semantic", user), kills)
        self._insert(self._tc("semantic", user), new)
        self._patch(self._tc("episode", user), distilled)
        self._commit(user, k, purge=any("gone" in p for p in kills.values()))

    @_guarded
    def replace_semantic(self, user_id: str, entry_id: str, replacement: SemanticEntry) -> None:
        """Atomically (one step) retire the live entry ``entry_id``, recorded as retired by ``replacement`` (its
        ``origin`` the decision), and insert ``replacement``.

        Raises:
            NotFoundError: no live entry ``entry_id`` for the user.
            StoreError: ``replacement.id`` is ``entry_id`` (a new version needs its own id).
        """
        if replacement.id == entry_id:
            raise StoreError(f"replacement of {entry_id!r} has the same id. Fix: give the new version its own id.")
        user = self._user(user_id)
        if user is not None:
            user = self._writable_user(user_id)
        if not user or not self._live_versions(user, "semantic", [entry_id]):
            raise NotFoundError(f"no live semantic entry {entry_id!r} for user {user_id!r}. "
                                "Fix: list ids with Memory.list_semantic(user_id).")
        self._settle_dim([replacement.vector] if replacement.vector else [])
        k = user.committed + 1
        kills = self._kills(user, "semantic", k, [entry_id], [replacement.id],
                            self._retired_props([entry_id], {entry_id: replacement}))
        new = [self._entry_object(user_id, replacement, k)]
        self._begin(user)
        self._patch(self._tc("semantic", user), kills)
        self._insert(self._tc("semantic", user), new)
        self._commit(user, k, purge=any("gone" in p for p in kills.values()))

    @_guarded
    def semantic_versions(self, user_id: str, ids: Sequence[str]) -> list[SemanticVersion]:
        """Semantic entries by id, live or retired (not deleted), in the order given; unknown ids are skipped."""
        user = self._user(user_id)
        if user is None or not ids:
            return []
        n = user.committed
        kept = self._f("born").less_or_equal(n) & self._f("gone").greater_than(n)
        objs = self._by_key(self._tc("semantic", user), "eid", list(ids), kept, vectors=True)
        found = {o.properties["eid"]: self._version(user_id, o, n) for o in objs}
        return [found[i] for i in dict.fromkeys(ids) if i in found]

    @_guarded
    def get_semantic(self, user_id: str, entry_id: str) -> SemanticEntry:
        """One live semantic entry. Raises ``NotFoundError``."""
        user = self._user(user_id)
        objs = self._live_versions(user, "semantic", [entry_id], vectors=True) if user else []
        if not objs:
            raise NotFoundError(f"no live semantic entry {entry_id!r} for user {user_id!r}. "
                                "Fix: list ids with Memory.list_semantic(user_id).")
        return self._entry(user_id, objs[0])

    @_guarded
    def list_semantic(self, user_id: str) -> list[SemanticEntry]:
        """All live semantic entries, oldest first (created_at, then id)."""
        user = self._user(user_id)
        if user is None:
            return []
        entries = [self._entry(user_id, o) for o in self._scan_live(user, "semantic")]
        return sorted(entries, key=lambda e: (e.created_at.isoformat(), e.id))

    def search(self, user_id: str, vector: Sequence[float], top_k: int, semantic_top_k: int,
               query: str | None = None, only: Collection[str] | None = None,
               sources: Collection[str] | None = None) -> SearchResult:
        """Both searches of the answer path (§3.4): two server queries (Weaviate has no joint top-k)."""
        ep_kw = {} if only is None else {"only": only}
        sem_kw = {} if sources is None else {"sources": sources}
        return SearchResult(
            episodes=self.search_episodes(user_id, vector, top_k, query=query, **ep_kw) if top_k > 0 else [],
            semantic=self.search_semantic(user_id, vector, semantic_top_k, query=query, **sem_kw)
            if semantic_top_k > 0 else [])

    @_guarded
    def delete_semantic(self, user_id: str, entry_id: str) -> list[str]:
        """Delete one live semantic entry; returns its source episode ids (still holding the fact).
        Raises ``NotFoundError``."""
        user = self._user(user_id)
        if user is not None:
            user = self._writable_user(user_id)
        objs = self._live_versions(user, "semantic", [entry_id]) if user else []
        if not objs:
            raise NotFoundError(f"no live semantic entry {entry_id!r} for user {user_id!r}.")
        k = self._begin(user)
        self._patch(self._tc("semantic", user), {str(o.uuid): {"died": k, "gone": k} for o in objs})
        self._commit(user, k, purge=True)
        return list(json.loads(objs[0].properties["sources"]))

    @_guarded
    def forget_semantic(self, user_id: str, entry_id: str) -> dict[str, list[str]]:
        """Forget a fact and where it came from (see ``MemoryStore.forget_semantic``).

        Not one step: ``delete_message`` for each raw message of the source episodes, then the entry
        (if a message's removal did not take it already). A crash part-way leaves the entry live, so
        running ``forget_semantic`` again completes it.

        Returns:
            ``{"semantic": [...], "episodes": [...], "messages": [...], "requeued": [...]}``.
        Raises:
            NotFoundError: no live entry ``entry_id`` for the user.
        """
        user = self._user(user_id)
        objs = self._live_versions(user, "semantic", [entry_id]) if user else []
        if not objs:
            raise NotFoundError(f"no live semantic entry {entry_id!r} for user {user_id!r}. "
                                "Fix: list ids with Memory.list_semantic(user_id).")
        sources = set(json.loads(objs[0].properties["sources"]))
        eps = self._kept_versions(user, "episode", lambda p: p["eid"] in sources)
        mids = list(dict.fromkeys(m for o in sorted(eps, key=lambda o: o.properties["eid"])
                                  for m in json.loads(o.properties["message_ids"])))
        gone_eps: set[str] = set()
        gone_sem: set[str] = set()
        requeued: list[str] = []
        for mid in mids:
            try:
                out = self.delete_message(user_id, mid)
            except NotFoundError:  # deleted before (e.g. an earlier, interrupted forget)
                continue
            gone_eps.update(out["episodes"])
            gone_sem.update(out["semantic"])
            requeued += [m for m in out["requeued"] if m not in requeued]
        if entry_id not in gone_sem:
            try:
                self.delete_semantic(user_id, entry_id)
            except NotFoundError:  # pragma: no cover - removed concurrently
                pass
            gone_sem.add(entry_id)
        doomed = set(mids)
        return {"semantic": sorted(gone_sem), "episodes": sorted(gone_eps), "messages": mids,
                "requeued": [m for m in requeued if m not in doomed]}

    # ------------------------------------------------------------------ metadata / delete one message
    def _kept_versions(self, user: _User, kind: str, keep: Callable[[dict], bool]) -> list:
        """Versions (live or superseded, not removed) at the committed step that pass ``keep``."""
        n = user.committed
        return self._scan(self._tc(kind, user), lambda p: int(p["born"]) <= n < int(p["gone"]) and keep(p))

    @_guarded
    def episodes_with_metadata(self, user_id: str, metadata: Mapping[str, Any]) -> set[str]:
        """Ids of the user's episodes (live or superseded) holding a message whose metadata has every
        key/value of ``metadata`` (JSON types kept apart: ``True`` is not ``1``)."""
        user = self._user(user_id)
        if user is None:
            return set()
        n = user.committed
        hits = {o.properties["mid"] for o in self._scan(
            self._tc("message", user), lambda p: _step(p, "deleted_step") > n
            and metadata_matches(json.loads(p.get("metadata") or "{}"), metadata))}
        if not hits:
            return set()
        eps = self._kept_versions(user, "episode", lambda p: bool(hits.intersection(json.loads(p["message_ids"]))))
        return {o.properties["eid"] for o in eps}

    @_guarded
    def delete_message(self, user_id: str, message_id: str) -> dict[str, list[str]]:
        """Delete one message and what was derived from it only, as one step (see the module docstring).

        Returns:
            ``{"episodes": [...], "semantic": [...], "requeued": [...]}`` (ids).
        Raises:
            NotFoundError: no such message for the user.
        """
        user = self._user(user_id)
        if user is not None:
            user = self._writable_user(user_id)
        uid = _uid("msg", user_id, message_id)
        found = self._by_uuids(self._tc("message", user), [uid]) if user else []
        if not found or _step(found[0].properties, "deleted_step") <= user.committed:
            raise NotFoundError(f"no message {message_id!r} for user {user_id!r}. Fix: use an id returned by "
                                "add_messages (ids) or shown in an episode's messages.")
        n, k = user.committed, user.committed + 1
        eps = self._kept_versions(user, "episode", lambda p: message_id in json.loads(p["message_ids"]))
        dead = {o.properties["eid"] for o in eps}
        requeue: list[str] = []
        for o in eps:
            if int(o.properties["died"]) > n:
                requeue += [m for m in json.loads(o.properties["message_ids"]) if m != message_id and m not in requeue]
        sems = self._kept_versions(user, "semantic", lambda p: bool(s := set(json.loads(p["sources"]))) and s <= dead)
        kill = lambda o: {"gone": k, **({"died": k} if int(o.properties["died"]) > n else {})}  # noqa: E731
        msgs = self._by_uuids(self._tc("message", user), [_uid("msg", user_id, m) for m in requeue])
        patches = {str(o.uuid): {"prev_ep": o.properties.get("ep") or "", "ep": "", "ep_step": k, "requeue_step": k,
                                 "reprocessed_step": _NEVER} for o in msgs}
        p0 = found[0].properties
        patches[str(found[0].uuid)] = {"prev_ep": p0.get("ep") or "", "ep": "", "ep_step": k, "deleted_step": k}
        self._begin(user)
        self._patch(self._tc("episode", user), {str(o.uuid): kill(o) for o in eps})
        self._patch(self._tc("semantic", user), {str(o.uuid): kill(o) for o in sems})
        self._patch(self._tc("message", user), patches)
        self._commit(user, k, purge=True)
        try:  # committed: the message is invisible already; removing the object is housekeeping
            self._tc("message", user).data.delete_by_id(uid)
        except self._w.Error:  # pragma: no cover - skipped by readers, overwritten by a re-add
            pass
        return {"episodes": sorted(dead), "semantic": sorted({o.properties["eid"] for o in sems}),
                "requeued": requeue}

    # ------------------------------------------------------------------ users
    @_guarded
    def user_exists(self, user_id: str) -> bool:
        """True if the user was ever written (and not deleted since)."""
        return self._user(user_id) is not None

    @_guarded
    def list_users(self) -> list[str]:
        """All user ids, sorted."""
        users = self._scan(self._cols["meta"], lambda p: p.get("kind") == "user")
        return sorted(o.properties["user_id"] for o in users)

    @_guarded
    def delete_user(self, user_id: str) -> None:
        """Remove everything stored for the user: its commit record first, then its tenants."""
        self._cols["meta"].data.delete_by_id(_uid("user", user_id))
        self._drop_tenants(tenant_name(user_id))

    @_guarded
    def stats(self, user_id: str) -> dict[str, int]:
        """Counts of messages, pending messages, live/superseded episodes, semantic entries, to-distill."""
        keys = ("messages", "pending", "episodes", "superseded_episodes", "semantic", "to_distill")
        user = self._user(user_id)
        if user is None:
            return dict.fromkeys(keys, 0)
        n, live = user.committed, self._live(user.committed)
        msg, ep, sem = (self._tc(k, user) for k in ("message", "episode", "semantic"))
        return {
            "messages": self._count(msg),
            "pending": self._count(msg, self._pending_filter(n)),
            "episodes": self._count(ep, live),
            "superseded_episodes": self._count(ep, self._f("died").less_or_equal(n) & self._f("gone").greater_than(n)),
            "semantic": self._count(sem, live),
            "to_distill": self._count(ep, live & self._f("distilled_step").greater_than(n)),
        }
