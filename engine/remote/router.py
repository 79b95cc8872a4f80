"""The engine the app and the CLI hold: the local engine and a remote server behind one
`submit`, each command sent to the one in use.

`LoadModel` switches to the local engine, `ConnectRemote` to the remote one; `Generate`
goes to whichever was chosen last. The memory budget and state saves are the local
engine's alone. Each backend is made on first use, so a session that only talks to a
server never starts the local engine (nor loads MLX).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from engine import events as ev
from engine.remote.connection import ConnectRemote

Listener = Callable[[Any], None]


class Backend(Protocol):
    def submit(self, command: Any) -> None: ...
    def close(self) -> None: ...


BackendFactory = Callable[[Listener], Backend]


def _remote_engine(listener: Listener) -> Backend:
    from engine.remote.engine import RemoteEngine

    return RemoteEngine(listener)


class EngineRouter:
    def __init__(
        self,
        listener: Listener,
        local: BackendFactory,
        remote: BackendFactory = _remote_engine,
    ) -> None:
        self._listener = listener
        self._factories = {"local": local, "remote": remote}
        self._backends: dict[str, Backend] = {}
        self.active = "local"  # where Generate goes: "local" | "remote"

    def submit(self, command: Any) -> None:
        if isinstance(command, ConnectRemote):
            self.active = "remote"
            self._backend("remote").submit(command)
        elif isinstance(command, ev.LoadModel):
            self.active = "local"
            self._backend("local").submit(command)
        elif isinstance(command, ev.Generate):
            self._backend(self.active).submit(command)
        elif isinstance(command, ev.Stop):
            for backend in list(self._backends.values()):  # the request's, wherever it runs
                backend.submit(command)
        elif isinstance(command, ev.Close):
            self.close()
        elif isinstance(command, ev.SaveState):
            if "local" in self._backends:  # nothing computed here to save otherwise
                self._backends["local"].submit(command)
        else:  # SetMemoryBudget: the local engine's, sent before its LoadModel
            self._backend("local").submit(command)

    def close(self) -> None:
        for backend in list(self._backends.values()):
            backend.close()
        self._backends.clear()

    def _backend(self, kind: str) -> Backend:
        if kind not in self._backends:
            self._backends[kind] = self._factories[kind](self._listener)
        return self._backends[kind]
