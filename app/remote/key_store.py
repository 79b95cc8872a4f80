"""API keys in the system keyring (the `keyring` package: Secret Service, macOS Keychain,
Windows Credential Locker), never in the settings file, the conversation store, a log
or an export.

Headless Linux often has no keyring backend; then a key lives in this process only, and
`note` says so, to be shown once: the person types it again after a restart.
"""

from __future__ import annotations

import contextlib

import keyring
from keyring.errors import KeyringError, PasswordDeleteError

SERVICE = "branchchat"


class KeyStore:
    def __init__(self, service: str = SERVICE) -> None:
        self.service = service
        self._session: dict[str, str] = {}  # keys the keyring could not take
        self.note = ""  # why keys are kept for this session only ("": the keyring has them)

    @property
    def backend_name(self) -> str:
        backend = keyring.get_keyring()
        return f"{type(backend).__module__}.{type(backend).__name__}"

    def save(self, url: str, key: str) -> None:
        """Keep `key` for `url` ("" forgets it)."""
        self._session.pop(url, None)
        try:
            if key:
                keyring.set_password(self.service, url, key)
            else:
                self._forget(url)
            self.note = ""
        except KeyringError as exc:
            if key:
                self._session[url] = key
            self.note = (
                f"No system keyring is available ({exc}). The API key is kept for this "
                "session only; you will be asked for it again after a restart."
            )

    def load(self, url: str) -> str:
        if url in self._session:
            return self._session[url]
        try:
            return keyring.get_password(self.service, url) or ""
        except KeyringError:
            return ""

    def _forget(self, url: str) -> None:
        with contextlib.suppress(PasswordDeleteError):  # there was none
            keyring.delete_password(self.service, url)
