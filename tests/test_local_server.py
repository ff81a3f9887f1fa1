"""Local llama.cpp server: GGUF resolution errors, and (opt-in, ``-m live``) a real completion."""

from __future__ import annotations


import pytest

from nemori_dspy.config import NemoriSettings
from nemori_dspy.errors import ConfigError
from nemori_dspy.local_server import LlamaServer, default_gguf_name, offline_models_dirs, resolve_gguf, server_alias


def test_resolve_gguf_missing_path_names_it(tmp_path):
    missing = tmp_path / "no-such-model.gguf"
    with pytest.raises(ConfigError) as ei:
        resolve_gguf(NemoriSettings(gguf=str(missing), _env_file=None))
    msg = str(ei.value)
    assert str(missing) in msg
    assert "gguf" in msg.lower()


def test_resolve_gguf_malformed_hf_spec():
    with pytest.raises(ConfigError, match="hf:"):
        resolve_gguf(NemoriSettings(gguf="hf:only-a-repo", _env_file=None))


def test_resolve_gguf_from_models_dir(tmp_path, monkeypatch):
    f = tmp_path / default_gguf_name("1.5b")
    f.write_bytes(b"GGUF")
    s = NemoriSettings(models_dir=tmp_path, local_model_size="1.5b", _env_file=None)
    assert resolve_gguf(s) == f.resolve()
    assert offline_models_dirs(s)[0] == tmp_path


def test_resolve_gguf_download_failure_says_how_to_fix(tmp_path, monkeypatch):
    import nemori_dspy.local_server as ls

    monkeypatch.setenv("NEMORI_OFFLINE_MODELS", str(tmp_path / "env"))
    monkeypatch.setattr(ls.Path, "home", classmethod(lambda cls: tmp_path / "home"))

    import huggingface_hub

    def fail(**kw):
        raise OSError("no internet")

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", fail)
    with pytest.raises(ConfigError) as ei:
        resolve_gguf(NemoriSettings(models_dir=tmp_path / "md", _env_file=None))
    msg = str(ei.value)
    assert "NEMORI_GGUF" in msg and "NEMORI_MODELS_DIR" in msg and "offline-models" in msg


def test_server_command_and_flags(tmp_path):
    f = tmp_path / "m.gguf"
    f.write_bytes(b"GGUF")
    srv = LlamaServer(f, port=12345, n_ctx=4096, n_threads=3, seed=7)
    cmd = srv.command()
    assert cmd[1:3] == ["-m", "llama_cpp.server"]
    assert cmd[cmd.index("--port") + 1] == "12345" and cmd[cmd.index("--n_ctx") + 1] == "4096"
    assert srv.api_base == "http://127.0.0.1:12345/v1" and srv.model == "openai/local-m"
    assert cmd[cmd.index("--model_alias") + 1] == "local-m"
    assert srv.flags["n_threads"] == 3 and srv.flags["seed"] == 7
    assert cmd[cmd.index("--flash_attn") + 1] == "True"  # the same default as NemoriSettings.flash_attn
    srv.stop()  # never started: no-op


def test_prompt_cache_setting_turns_on_the_servers_ram_cache(tmp_path):
    f = tmp_path / "m.gguf"
    f.write_bytes(b"GGUF")
    assert "--cache" not in LlamaServer(f, port=1).command()
    srv = LlamaServer.from_settings(NemoriSettings(gguf=str(f), local_prompt_cache=True, server_port=1))
    cmd = srv.command()
    assert cmd[cmd.index("--cache") + 1] == "True" and cmd[cmd.index("--cache_type") + 1] == "ram"
    assert srv.flags["prompt_cache"] is True


def test_flash_attention_is_on_by_default_from_settings_and_off_when_asked(tmp_path):
    f = tmp_path / "m.gguf"
    f.write_bytes(b"GGUF")
    on = LlamaServer.from_settings(NemoriSettings(gguf=str(f), server_port=1))
    assert on.command()[on.command().index("--flash_attn") + 1] == "True" and on.flags["flash_attn"] is True
    off = LlamaServer.from_settings(NemoriSettings(gguf=str(f), flash_attn=False, server_port=1))
    assert off.command()[off.command().index("--flash_attn") + 1] == "False"


def test_server_exit_raises_with_log(tmp_path):
    from nemori_dspy.errors import ModelServerError

    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf")
    with pytest.raises(ModelServerError, match="exited"):
        LlamaServer(bad, startup_timeout_s=60, log_dir=tmp_path).start()


@pytest.mark.live
def test_live_completion():
    import litellm

    s = NemoriSettings(local_model_size="0.5b", n_ctx=2048, _env_file=None)
    try:
        path = resolve_gguf(s)
    except ConfigError as e:
        pytest.skip(str(e))
    with LlamaServer(path, n_ctx=2048, n_threads=s.n_threads, seed=0) as srv:
        r = litellm.completion(
            model=srv.model, api_base=srv.api_base, api_key="sk-local",
            messages=[{"role": "user", "content": "Say hello."}], max_tokens=8, temperature=0,
        )
        text = r.choices[0].message.content
        assert isinstance(text, str) and text.strip()
        assert r.usage.completion_tokens <= 8
    assert not srv.running


def test_each_gguf_gets_its_own_model_name(tmp_path):
    """DSPy's response cache ignores api_base: two local sizes under one name would replay each other's replies."""
    small = LlamaServer(tmp_path / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", port=1)
    big = LlamaServer(tmp_path / "Qwen2.5-Coder-1.5B-Instruct-Q4_K_M.gguf", port=2)
    assert small.model == "openai/local-qwen2.5-coder-0.5b-instruct-q4_k_m"
    assert big.model == "openai/local-qwen2.5-coder-1.5b-instruct-q4_k_m" != small.model
    assert server_alias("/x/my model!.gguf") == "local-my-model"
