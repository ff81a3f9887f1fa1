"""LM construction from settings: litellm engine, local-call policy, and the API key kept secret."""

from __future__ import annotations

import litellm
import pytest
from pydantic import SecretStr

from nemori_dspy.config import NemoriSettings
from nemori_dspy.modules.pipeline import NemoriPipeline, stage_factory
from nemori_dspy.modules.resources import Resources
from nemori_dspy.embedders import HashingEmbedder
from nemori_dspy.runtime import make_lm
from nemori_dspy.store.sqlite import SQLiteStore

CANARY = "sk-canary-runtime-42"


def test_make_lm_uses_litellm_and_passes_the_key(monkeypatch):
    lm = make_lm(NemoriSettings(api_key=SecretStr(CANARY), cache=False), "openai/gpt-4o-mini", max_tokens=77)
    assert lm.kwargs["api_key"] == CANARY and lm.kwargs["max_tokens"] == 77
    # dspy 3.4: LM.engine is the configured selection; the default "auto" would send openai/* models
    # through lm15, which writes max_completion_tokens (ignored by llama.cpp)
    assert lm.engine == "litellm"
    # ...and a call really goes through litellm.completion, with max_tokens (litellm's mock reply: no network)
    sent: list[dict] = []
    real = litellm.completion

    def spy(**kwargs):
        sent.append(kwargs)
        return real(**kwargs, mock_response="hello")

    monkeypatch.setattr(litellm, "completion", spy)
    assert lm("Say hello.") == ["hello"]
    assert len(sent) == 1 and sent[0]["model"] == "openai/gpt-4o-mini"
    assert sent[0]["max_tokens"] == 77 and "max_completion_tokens" not in sent[0] and sent[0]["api_key"] == CANARY


def test_local_calls_never_time_out_or_retry():
    lm = make_lm(NemoriSettings(), "openai/local", "http://127.0.0.1:1/v1", "sk-local")
    assert lm.num_retries == 0 and lm.kwargs["timeout"] >= 3600


def test_key_not_in_settings_repr_dump_or_saved_program(tmp_path):
    settings = NemoriSettings(api_key=SecretStr(CANARY))
    assert CANARY not in repr(settings) and CANARY not in str(settings.public_dict())
    lm = make_lm(settings, "openai/gpt-4o-mini")
    store = SQLiteStore(tmp_path / "m.db")
    pipeline = NemoriPipeline(Resources(store=store, embedder=HashingEmbedder(16), settings=settings),
                              stage_factory(settings, {"answer": lm, "narrate": lm}))
    path = tmp_path / "program.json"
    pipeline.save(str(path))
    text = path.read_text()
    assert "gpt-4o-mini" in text  # the stage LM state is saved with the program...
    assert CANARY not in text  # ...without its key
    store.close()


class _FakeServer:
    def __init__(self, size: str) -> None:
        from pathlib import Path

        self.model, self.api_base = "openai/local", "http://127.0.0.1:1/v1"
        self.model_path = Path(f"qwen-{size}.gguf")

    def stop(self) -> None:
        pass


def _count_servers(monkeypatch) -> list[str]:
    import nemori_dspy.runtime as runtime

    started: list[str] = []

    def fake_start(settings):
        started.append(settings.local_model_size)
        return _FakeServer(settings.local_model_size)

    monkeypatch.setattr(runtime, "_start_local", fake_start)
    return started


def test_a_local_judge_of_the_answer_models_size_shares_its_server(monkeypatch):
    from nemori_dspy.runtime import build_runtime

    started = _count_servers(monkeypatch)
    rt = build_runtime(NemoriSettings(model="local", local_model_size="1.5b", judge_model="local:1.5b",
                                      _env_file=None), configure=False)
    assert started == ["1.5b"] and rt.judge_lm is rt.lm and rt.judge_server is None
    assert rt.judge_label == "local:qwen-1.5b.gguf"


def test_a_local_judge_of_another_size_gets_its_own_server(monkeypatch):
    from nemori_dspy.runtime import build_runtime

    started = _count_servers(monkeypatch)
    rt = build_runtime(NemoriSettings(model="local", local_model_size="0.5b", judge_model="local:1.5b",
                                      _env_file=None), configure=False)
    assert started == ["0.5b", "1.5b"] and rt.judge_lm is not rt.lm
    assert rt.judge_label == "local:qwen-1.5b.gguf"


def test_missing_api_key_fails_before_anything_starts(monkeypatch):
    import pytest

    import nemori_dspy.runtime as runtime
    from nemori_dspy.errors import ConfigError
    from nemori_dspy.runtime import build_runtime, check_credentials

    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.setattr(runtime, "_start_local", lambda *a, **k: pytest.fail("server started before the key check"))
    with pytest.raises(ConfigError, match=r"model / NEMORI_MODEL = 'openai/gpt-4o-mini' needs OPENAI_API_KEY.*Fix:"):
        build_runtime(NemoriSettings(model="openai/gpt-4o-mini"))
    with pytest.raises(ConfigError, match="judge_model"):  # a hosted judge beside the local model
        build_runtime(NemoriSettings(model="local", judge_model="openai/gpt-4o-mini"))
    check_credentials(NemoriSettings(model="local"))  # nothing hosted: nothing to check
    check_credentials(NemoriSettings(model="openai/gpt-4o-mini", api_key="sk-test"))
    check_credentials(NemoriSettings(model="openai/served", api_base="http://127.0.0.1:8000/v1"))
    check_credentials(NemoriSettings(model="ollama_chat/llama3"))  # OLLAMA_API_BASE has a default
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    check_credentials(NemoriSettings(model="openai/gpt-4o-mini"))


def test_a_local_stage_lm_shares_the_judges_server_of_its_size(monkeypatch):
    from nemori_dspy.runtime import build_runtime

    started = _count_servers(monkeypatch)
    rt = build_runtime(NemoriSettings(model="local", local_model_size="0.5b", judge_model="local:1.5b",
                                      stage_lms={"narrate": {"model": "local:1.5b"}, "distill": {"model": "local:1.5b"}},
                                      _env_file=None), configure=False)
    assert started == ["0.5b", "1.5b"]  # one 1.5B server for the judge and both stages
    assert {"narrate", "distill"} <= set(rt.stage_lms) and rt.stage_servers == []


def test_a_local_stage_lm_without_a_local_judge_gets_its_own_server_and_stops_with_the_runtime(monkeypatch):
    from nemori_dspy.runtime import build_runtime

    started = _count_servers(monkeypatch)
    rt = build_runtime(NemoriSettings(model="local", local_model_size="0.5b", local_memory_model=None,
                                      stage_lms={"narrate": {"model": "local:1.5b"}}, _env_file=None), configure=False)
    assert started == ["0.5b", "1.5b"] and len(rt.stage_servers) == 1
    rt.close()
    assert rt.stage_servers == []


def test_an_unknown_local_stage_size_is_refused_naming_the_sizes():
    from nemori_dspy.config import load_settings
    from nemori_dspy.errors import ConfigError

    with pytest.raises(ConfigError, match="local:1.5b"):
        load_settings(stage_lms={"narrate": {"model": "local:7b"}}, _env_file=None)


def test_the_local_memory_model_writes_narratives_and_facts_and_only_those(monkeypatch):
    from nemori_dspy.config import MEMORY_WRITING_STAGES
    from nemori_dspy.runtime import build_runtime

    started = _count_servers(monkeypatch)
    rt = build_runtime(NemoriSettings(model="local", local_model_size="0.5b", _env_file=None), configure=False)
    assert started == ["0.5b", "1.5b"]  # default local_memory_model = 1.5b
    assert set(rt.stage_lms) == set(MEMORY_WRITING_STAGES) and "answer" not in rt.stage_lms
    started.clear()
    rt = build_runtime(NemoriSettings(model="local", local_memory_model=None, _env_file=None), configure=False)
    assert started == ["0.5b"] and rt.stage_lms == {}


def test_a_hosted_main_model_ignores_the_local_memory_model(monkeypatch):
    from nemori_dspy.runtime import build_runtime

    started = _count_servers(monkeypatch)
    rt = build_runtime(NemoriSettings(model="openai/gpt-4o-mini", api_key="k", _env_file=None), configure=False)
    assert started == [] and rt.stage_lms == {}
