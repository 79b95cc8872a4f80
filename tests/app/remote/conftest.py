"""The window against a real llama-cpp-python server: one server a session, the local
side a FakeEngine behind the same router the app uses, and a keyring of the test's."""

from __future__ import annotations

import keyring
import pytest
from keyring.backend import KeyringBackend
from keyring.backends import fail

from engine.remote.router import EngineRouter
from tests.app.fake_engine import FakeEngine
from tests.engine.remote.server import start_server

KEY = "sk-remote-test-0123456789"


class MemoryKeyring(KeyringBackend):
    """A keyring backend holding its passwords in a dict (keyring's plug-in API)."""

    priority = 1  # type: ignore[assignment]

    def __init__(self) -> None:
        super().__init__()
        self.passwords: dict[tuple[str, str], str] = {}

    def get_password(self, service, username):
        return self.passwords.get((service, username))

    def set_password(self, service, username, password):
        self.passwords[(service, username)] = password

    def delete_password(self, service, username):
        self.passwords.pop((service, username), None)


@pytest.fixture(scope="session")
def llama_server(tmp_path_factory):
    server = start_server(tmp_path_factory)
    yield server
    server.stop()


@pytest.fixture(scope="session")
def keyed_llama_server(tmp_path_factory):
    server = start_server(tmp_path_factory, api_key=KEY)
    yield server
    server.stop()


@pytest.fixture
def memory_keyring():
    before = keyring.get_keyring()
    backend = MemoryKeyring()
    keyring.set_keyring(backend)
    yield backend
    keyring.set_keyring(before)


@pytest.fixture
def no_keyring():
    before = keyring.get_keyring()
    keyring.set_keyring(fail.Keyring())
    yield
    keyring.set_keyring(before)


@pytest.fixture
def routed(harness):
    """A factory of the app's router: the local side a FakeEngine (kept as harness.engine)."""

    def local(listener):
        harness.engine = FakeEngine(listener)
        return harness.engine

    return lambda listener: EngineRouter(listener, local=local)
