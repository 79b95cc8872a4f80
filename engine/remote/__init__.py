"""A remote OpenAI-compatible server (llama-server, vLLM, SGLang, LM Studio, Ollama)
behind the same commands and events as the local engine (engine/events.py).

`RemoteEngine` runs one worker thread over the official `openai` client: it connects
(`ConnectRemote`: the server's /v1/models), streams chat completions of the branch the
window sends, and emits `ModelLoaded`, `Tokens`, `Finished(stats)` and `Failed` as the
local engine does. `EngineRouter` holds the local engine and the remote one and sends
each command to the one in use, so the window never asks which it talks to.
"""
