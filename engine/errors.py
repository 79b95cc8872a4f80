"""Errors a person can act on. Each names what went wrong and, where it helps, the file."""

from __future__ import annotations


class EngineError(Exception):
    """Base class: every message is meant to be shown to a person as it is."""


class ModelLoadError(EngineError):
    """A model file or directory cannot be loaded (missing, corrupt, unsupported)."""

    def __init__(self, path: object, problem: str) -> None:
        super().__init__(f"{path}: {problem}")
        self.path = str(path)
        self.problem = problem


class UnsupportedArchitecture(ModelLoadError):
    """The file is readable but describes a model family we do not implement."""


class ModelFetchError(EngineError):
    """The default model could not be fetched or verified."""


class StateError(EngineError):
    """A state operation that cannot be served exactly; the state is unchanged."""


class ContextOverflow(EngineError):
    """A request needs more positions than the model's context holds."""
