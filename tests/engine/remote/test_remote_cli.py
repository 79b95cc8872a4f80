"""`python -m engine generate|chat --remote URL` against the loopback server."""

from __future__ import annotations

import json
import os
import subprocess
import sys

ENGINE = [sys.executable, "-m", "engine"]


def test_generate_json_has_the_local_shape_and_says_whose_figures(llama_server):
    out = subprocess.run(
        [*ENGINE, "generate", "--remote", llama_server.url, "--prompt", "Name three colours.",
         "--max-tokens", "12", "--json"],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    result = json.loads(out.stdout)
    assert set(result) == {"text", "token_ids", "finish_reason", "stats"}
    assert result["text"] and result["finish_reason"] == "length"
    assert result["token_ids"] == []  # the server sends text, not ids
    stats = result["stats"]
    assert stats["generated_tokens"] == 12
    assert stats["server"] == f"127.0.0.1:{llama_server.port}"
    assert stats["server_reported"] == [] and stats["prompt_tokens"] is None
    assert stats["ttft_s"] > 0 and stats["decode_tok_s"] > 0


def test_chat_holds_a_conversation(llama_server):
    out = subprocess.run(
        [*ENGINE, "chat", "--remote", llama_server.url, "--max-tokens", "8"],
        input="Hi\nWhat did I just say?\n/quit\n", capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert out.stderr.count(f"[server 127.0.0.1:{llama_server.port}") == 2


def test_api_key_env_must_be_set(llama_server):
    env = {k: v for k, v in os.environ.items() if k != "BRANCHCHAT_TEST_KEY"}
    out = subprocess.run(
        [*ENGINE, "generate", "--remote", llama_server.url, "--prompt", "Hi",
         "--api-key-env", "BRANCHCHAT_TEST_KEY"],
        capture_output=True, text=True, timeout=60, env=env,
    )  # fmt: skip
    assert out.returncode == 2
    assert "--api-key-env BRANCHCHAT_TEST_KEY: that variable is empty or unset" in out.stderr
