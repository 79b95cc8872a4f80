"""One llama-cpp-python server for the remote engine tests (started once a session)."""

from __future__ import annotations

import pytest

from tests.engine.remote.server import SilentServer, start_server


@pytest.fixture(scope="session")
def llama_server(tmp_path_factory):
    server = start_server(tmp_path_factory)
    yield server
    server.stop()


@pytest.fixture
def silent_server():
    server = SilentServer()
    yield server
    server.close()
