"""What a Generate becomes on the wire, and what servers' figures mean (the shapes
llama-server and vLLM send, as their docs give them)."""

from __future__ import annotations

import pytest

from engine import events as ev
from engine.remote.connection import RemoteConnection
from engine.remote.request import chat_request
from engine.remote.server_figures import read_figures
from engine.sampling import SamplingSettings


def test_sampling_settings_map_to_the_fields_servers_read():
    sampling = SamplingSettings(temperature=0.7, top_p=0.9, top_k=40, min_p=0.05,
                                repetition_penalty=1.1, seed=3)  # fmt: skip
    settings = ev.GenerationSettings(sampling, max_tokens=64, enable_thinking=False)
    body, extra = chat_request("m", (ev.Message("user", "Hi"),), settings, stop=("\n\n",))
    assert body == {
        "model": "m", "messages": [{"role": "user", "content": "Hi"}], "stream": True,
        "stream_options": {"include_usage": True}, "temperature": 0.7, "top_p": 0.9,
        "max_tokens": 64, "seed": 3, "stop": ["\n\n"],
    }  # fmt: skip
    assert extra == {
        "cache_prompt": True, "return_progress": True, "top_k": 40, "min_p": 0.05,
        "repeat_penalty": 1.1, "repetition_penalty": 1.1, "repeat_last_n": 64,
        "chat_template_kwargs": {"enable_thinking": False},
    }  # fmt: skip


def test_neutral_settings_send_no_extra_fields_but_llama_servers_cache_and_progress():
    _, extra = chat_request("m", (), ev.GenerationSettings())
    assert extra == {"cache_prompt": True, "return_progress": True}


def test_llama_server_timings_give_the_prompt_and_its_cached_part():
    figures = read_figures(
        {"prompt_tokens": 60, "completion_tokens": 9},
        {"cache_n": 52, "prompt_n": 8, "prompt_per_second": 400.0, "predicted_n": 9},
    )
    assert (figures.prompt_tokens, figures.cached_tokens) == (60, 52)
    assert figures.completion_tokens == 9 and figures.prefill_tok_s == 400.0


def test_vllm_usage_details_give_the_cached_tokens():
    usage = {"prompt_tokens": 1260, "completion_tokens": 41,
             "prompt_tokens_details": {"cached_tokens": 1204}}  # fmt: skip
    figures = read_figures(usage, None)
    assert (figures.prompt_tokens, figures.cached_tokens, figures.prefill_tok_s) == (
        1260,
        1204,
        None,
    )
    assert figures.reported() == ("prompt_tokens", "cached_tokens", "completion_tokens")


def test_nothing_reported_is_nothing_claimed():
    assert read_figures(None, None).reported() == ()


@pytest.mark.parametrize(
    ("url", "api_base"),
    [("http://127.0.0.1:8080", "http://127.0.0.1:8080/v1"),
     ("http://localhost:11434/v1/", "http://localhost:11434/v1"),
     ("https://gpu.example.org/openai/v1", "https://gpu.example.org/openai/v1")],
)  # fmt: skip
def test_a_bare_host_gets_v1(url, api_base):
    assert RemoteConnection(url).api_base == api_base


@pytest.mark.parametrize("url", ["127.0.0.1:8080", "ftp://host/v1", "http://"])
def test_a_url_without_scheme_or_host_is_refused(url):
    with pytest.raises(ValueError, match="starts with http:// or https://"):
        RemoteConnection(url)


def test_the_key_is_not_in_the_repr():
    assert "s3cret" not in repr(RemoteConnection("http://h:1/v1", api_key="s3cret"))
