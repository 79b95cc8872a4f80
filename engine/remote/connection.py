"""One connection to an OpenAI-compatible server, and the command that switches to it.

The API key travels in the connection (in memory) and nowhere else: its `repr` leaves it
out, and the app keeps it in the system keyring (app/remote/key_store.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from urllib.parse import urlsplit, urlunsplit

DEFAULT_CONNECT_TIMEOUT_S = 5.0
DEFAULT_READ_TIMEOUT_S = 120.0  # a long prompt on a busy server may take this before a token
REMOTE_FAMILY = "remote"  # ModelLoaded.family of a remote model: the window keeps no path


@dataclass(frozen=True)
class RemoteConnection:
    base_url: str  # "http://host:8080" or ".../v1": the OpenAI-compatible base
    model: str = ""  # a model id of the server's /v1/models; "": the first it lists
    api_key: str = field(default="", repr=False)
    connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S
    read_timeout_s: float = DEFAULT_READ_TIMEOUT_S  # between two bytes of an answer
    verify_tls: bool = True

    def __post_init__(self) -> None:
        parts = urlsplit(self.base_url.strip())
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(
                f"a server URL starts with http:// or https:// and names a host "
                f"(e.g. http://127.0.0.1:8080/v1), not {self.base_url!r}"
            )
        if self.connect_timeout_s <= 0 or self.read_timeout_s <= 0:
            raise ValueError("connect and read timeouts must be > 0 seconds")

    @property
    def api_base(self) -> str:
        """The base the client calls: a bare host gets /v1, the path servers share."""
        parts = urlsplit(self.base_url.strip())
        path = parts.path.rstrip("/")
        if not path:
            path = "/v1"
        return urlunsplit((parts.scheme, parts.netloc, path, "", ""))

    @property
    def label(self) -> str:
        """How the window names the server: its host and port."""
        return urlsplit(self.base_url.strip()).netloc


@dataclass(frozen=True)
class ConnectRemote:
    """Switch to a remote server: the engine lists its models and answers `ModelLoaded`
    (or `Failed`); later `Generate` commands go to it until a `LoadModel`."""

    connection: RemoteConnection
