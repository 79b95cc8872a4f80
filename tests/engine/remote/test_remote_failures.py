"""Each way a server can fail a person, as the Failed message they read."""

from __future__ import annotations

import pytest

from engine import events as ev
from engine.remote.connection import RemoteConnection
from tests.engine.remote.remote_runner import RemoteRunner
from tests.engine.remote.server import free_port, start_server

KEY = "s3cret-test-key"


@pytest.fixture(scope="module")
def keyed_server(tmp_path_factory):
    server = start_server(tmp_path_factory, api_key=KEY)
    yield server
    server.stop()


@pytest.fixture
def runner():
    r = RemoteRunner()
    yield r
    r.close()


def test_wrong_api_key_is_named(keyed_server, runner):
    failed = runner.connect(RemoteConnection(keyed_server.url, api_key="wrong"))
    assert isinstance(failed, ev.Failed)
    assert failed.message.startswith(f"The server at {keyed_server.url} refused the API key")
    assert failed.request_id == "" and failed.load_path == keyed_server.url
    loaded = runner.connect(RemoteConnection(keyed_server.url, api_key=KEY))
    assert isinstance(loaded, ev.ModelLoaded)
    finished, _ = runner.generate([("user", "Hi")])
    assert isinstance(finished, ev.Finished) and finished.text


def test_missing_api_key_is_named(keyed_server, runner):
    failed = runner.connect(RemoteConnection(keyed_server.url))
    assert isinstance(failed, ev.Failed) and "refused the API key (401)" in failed.message


def test_wrong_model_name_lists_what_the_server_serves(llama_server, runner):
    failed = runner.connect(RemoteConnection(llama_server.url, model="no-such-model"))
    assert isinstance(failed, ev.Failed)
    assert "has no model named 'no-such-model'" in failed.message
    assert "SmolLM2-135M-Instruct.Q4_1.gguf" in failed.message


def test_unreachable_server(runner):
    url = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens there
    failed = runner.connect(RemoteConnection(url))
    assert isinstance(failed, ev.Failed)
    assert failed.message.startswith(f"Could not reach the server at {url}")
    assert "Connection refused" in failed.message


def test_server_that_never_answers_times_out(silent_server, runner):
    connection = RemoteConnection(silent_server.url, read_timeout_s=1.0)
    failed = runner.connect(connection, timeout=10)
    assert isinstance(failed, ev.Failed)
    assert failed.message == (
        f"The server at {silent_server.url} did not answer within 1 s (read timeout). It "
        "may be busy or stuck; retry, or raise the read timeout in the connection."
    )


def test_generate_before_connecting_says_so(runner):
    runner.engine.submit(ev.Generate("r", (ev.Message("user", "Hi"),)))
    failed = runner.next_of(ev.Failed)
    assert failed.request_id == "r" and "No server is connected" in failed.message


def test_continue_is_refused_with_a_reason(llama_server, runner):
    runner.connect(RemoteConnection(llama_server.url))
    settings = ev.GenerationSettings(continue_last=True)
    failed, tokens = runner.generate([("user", "Hi"), ("assistant", "Hello")], settings)
    assert isinstance(failed, ev.Failed) and tokens == []
    assert failed.message.startswith("Continue is not available on a remote server")
