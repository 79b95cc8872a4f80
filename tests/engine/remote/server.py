"""A real OpenAI-compatible server on loopback for the remote tests: llama-cpp-python's
(`python -m llama_cpp.server`) serving the default model. No mock: the client meets the
same HTTP, SSE and error bodies a person's server sends."""

from __future__ import annotations

import importlib.util
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from engine.default_model import default_model_path

HAS_SERVER = importlib.util.find_spec("llama_cpp") is not None
SKIP_REASON = (
    "llama-cpp-python[server] is not installed (make test installs it: pip install "
    "-e '.[server]' with CMAKE_ARGS=-DGGML_NATIVE=off)"
)
START_TIMEOUT_S = 90.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class LlamaServer:
    """One server process; `stop()` kills it (a server gone mid-reply), `start()` brings
    it back on the same port."""

    def __init__(self, log_dir: Path, *, api_key: str = "", tls: tuple[Path, Path] | None = None):
        """`tls`: (key file, certificate file) to serve https."""
        self.port = free_port()
        self.api_key = api_key
        self.tls = tls
        self.log_path = log_dir / f"llama-server-{self.port}.log"
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}/v1"

    def start(self) -> None:
        command = [
            sys.executable, "-m", "llama_cpp.server", "--model", str(default_model_path()),
            "--host", "127.0.0.1", "--port", str(self.port), "--n_ctx", "2048",
            "--n_threads", "2",
        ]  # fmt: skip
        if self.api_key:
            command += ["--api_key", self.api_key]
        if self.tls:
            command += ["--ssl_keyfile", str(self.tls[0]), "--ssl_certfile", str(self.tls[1])]
        log = self.log_path.open("ab")
        self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        self._wait_ready()

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                raise RuntimeError(f"llama_cpp.server exited: {self.log_tail()}")
            try:
                context = ssl._create_unverified_context() if self.tls else None
                urllib.request.urlopen(f"{self.url}/models", timeout=2, context=context).close()
                return
            except urllib.error.HTTPError:  # 401 with an API key: it is up
                return
            except OSError:
                time.sleep(0.25)
        raise RuntimeError(f"llama_cpp.server did not come up: {self.log_tail()}")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)
        self.process = None

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def log_tail(self, n: int = 2000) -> str:
        return self.log_text()[-n:]


class SilentServer:
    """A loopback socket that accepts connections and never answers: a stuck server."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.port = int(self.sock.getsockname()[1])
        self._held: list[socket.socket] = []
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self._held.append(conn)  # read nothing, answer nothing

    def close(self) -> None:
        self.sock.close()
        for conn in self._held:
            conn.close()


def start_server(tmp_path_factory, *, api_key: str = "", tls=None) -> LlamaServer:
    if not HAS_SERVER:
        pytest.skip(SKIP_REASON)
    if not default_model_path().exists():
        pytest.skip("the default model is missing: python -m engine fetch")
    server = LlamaServer(tmp_path_factory.mktemp("llama-server"), api_key=api_key, tls=tls)
    server.start()
    return server
