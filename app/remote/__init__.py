"""Connecting the window to a remote OpenAI-compatible server: the connection dialog,
the saved connection (URL, model, timeouts in the settings; the API key in the system
keyring) and the switch between it and the local engine."""
