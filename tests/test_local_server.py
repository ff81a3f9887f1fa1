"""Local llama.cpp server: GGUF resolution and its errors, the F16 copy, and (opt-in, ``-m live``) a real completion."""

from __future__ import annotations

from pathlib import Path

import pytest

from nemori_dspy.config import NemoriSettings
from nemori_dspy.errors import ConfigError, ModelServerError
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


def _fake_quantizer(monkeypatch, rc: int = 0):
    """A stand-in for llama_cpp's quantizer: records its calls and writes 'F16' to the output path."""
    import types

    import nemori_dspy.extras as extras

    calls = []

    def quantize(src, dst, params):
        calls.append((src.decode(), dst.decode(), params.ftype, params.allow_requantize))
        if rc == 0:
            Path(dst.decode()).write_bytes(b"F16")
        return rc

    fake = types.SimpleNamespace(llama_model_quantize_default_params=lambda: types.SimpleNamespace(),
                                 llama_model_quantize=quantize, LLAMA_FTYPE_MOSTLY_F16=1)
    monkeypatch.setattr(extras, "require", lambda module, *a, **kw: fake)
    return calls


def test_resolve_gguf_serves_the_f16_copy_of_a_local_f16_size_written_once(tmp_path, monkeypatch):
    f = tmp_path / default_gguf_name("0.5b")
    f.write_bytes(b"GGUF")
    calls = _fake_quantizer(monkeypatch)
    s = NemoriSettings(models_dir=tmp_path, local_model_size="0.5b", _env_file=None)
    assert s.local_f16 == ["0.5b"]
    out = resolve_gguf(s)
    assert out == tmp_path / "qwen2.5-coder-0.5b-instruct-q4_k_m-f16.gguf" and out.read_bytes() == b"F16"
    assert calls == [(str(f.resolve()), calls[0][1], 1, True)] and calls[0][1].endswith(".part")
    assert resolve_gguf(s) == out and len(calls) == 1  # reused, not written again
    import os

    os.utime(f, (out.stat().st_mtime + 10, out.stat().st_mtime + 10))  # the source replaced by a newer file
    assert resolve_gguf(s) == out and len(calls) == 2  # written anew
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([f.name, out.name])  # no temporary file left
    assert server_alias(out) == "local-qwen2.5-coder-0.5b-instruct-q4_k_m-f16"


def test_resolve_gguf_without_local_f16_serves_the_file_as_it_is(tmp_path, monkeypatch):
    f = tmp_path / default_gguf_name("0.5b")
    f.write_bytes(b"GGUF")
    calls = _fake_quantizer(monkeypatch)
    assert resolve_gguf(NemoriSettings(models_dir=tmp_path, local_f16=[], _env_file=None)) == f.resolve()
    monkeypatch.setenv("NEMORI_LOCAL_F16", "[]")
    assert resolve_gguf(NemoriSettings(models_dir=tmp_path, _env_file=None)) == f.resolve()
    assert calls == []


def test_f16_copy_failure_says_how_to_serve_the_file_and_leaves_nothing(tmp_path, monkeypatch):
    from nemori_dspy.local_server import f16_copy

    f = tmp_path / default_gguf_name("0.5b")
    f.write_bytes(b"GGUF")
    _fake_quantizer(monkeypatch, rc=1)
    with pytest.raises(ModelServerError, match="NEMORI_LOCAL_F16='\\[\\]'"):
        f16_copy(f)
    assert [p.name for p in tmp_path.iterdir()] == [f.name]


def test_f16_copy_goes_to_the_fallback_folder_when_the_model_folder_is_read_only(tmp_path, monkeypatch):
    import nemori_dspy.local_server as ls

    f = tmp_path / "ro" / default_gguf_name("0.5b")
    f.parent.mkdir()
    f.write_bytes(b"GGUF")
    _fake_quantizer(monkeypatch)
    monkeypatch.setattr(ls.os, "access", lambda path, mode: Path(path) != f.parent)
    out = ls.f16_copy(f, fallback_dir=tmp_path / "cache" / "models")
    assert out == tmp_path / "cache" / "models" / "qwen2.5-coder-0.5b-instruct-q4_k_m-f16.gguf" and out.is_file()
    with pytest.raises(ModelServerError, match="not writable"):
        ls.f16_copy(f)
