"""The engine's commands and events: frozen dataclasses crossing the thread boundary.

Commands go in through `Engine.submit`; events come out to the listener the engine
was given. No MLX array ever crosses: events carry plain Python values.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from engine.sampling import SamplingSettings

# -- vocabularies ---------------------------------------------------------------------
# StrEnums, so each member is the very string it names: a field holding one compares
# equal to the literal, prints and serialises as it, and the fields below keep plain
# `str` values (what crosses the thread boundary stays plain Python).


class DrafterKind(StrEnum):
    """What proposes draft tokens for speculative decoding."""

    # every drafter the session has, pooled (engine.drafter_pool): a loaded draft model,
    # on the CPU the block drafter where one fits the model (not yet measured paying on a
    # GPU: docs/BENCHMARKS.md, "The block drafter"), and prompt lookup, which proposes
    # alone where there is nothing else
    AUTO = "auto"
    OFF = "off"
    LOOKUP = "lookup"  # prompt lookup over everything seen (engine.drafters.SuffixDrafter)
    DRAFT_MODEL = "draft_model"
    # the trained block drafter (engine.block_drafter.BlockDrafter), pooled with prompt
    # lookup: each round the one promising more proposes (engine.drafter_pool)
    BLOCK = "block"


class FinishReason(StrEnum):
    """Why a request ended."""

    EOS = "eos"  # the model ended its reply
    LENGTH = "length"  # max_tokens was reached
    CONTEXT_FULL = "context_full"  # the reply filled the context length
    STOPPED = "stopped"  # a Stop command


class ReplyPart(StrEnum):
    """Which part of a reply text belongs to (engine.thinking splits them)."""

    ANSWER = "answer"
    THINKING = "thinking"  # a reasoning model's <think> block, tags and edge space removed


DRAFTER_KINDS = tuple(kind.value for kind in DrafterKind)

# -- commands -------------------------------------------------------------------------


@dataclass(frozen=True)
class Message:
    role: str  # "system" | "user" | "assistant"
    content: str


@dataclass(frozen=True)
class GenerationSettings:
    sampling: SamplingSettings = field(default_factory=SamplingSettings)
    max_tokens: int = 512
    drafter: str = DrafterKind.AUTO.value  # a DrafterKind
    continue_last: bool = False  # continue the last assistant message instead of a new one
    drop_oldest_turns: bool = False  # opt-in policy when the branch exceeds the context
    context_length: int | None = None  # a chat's own limit; the model's when None or larger
    enable_thinking: bool | None = None  # for the chat template (Qwen3); None: its default
    # plain text completion: the messages' texts joined as they are, no chat template (a
    # base model ships none); the reply continues the text
    raw: bool = False

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ValueError("max_tokens must be >= 1")
        if self.context_length is not None and self.context_length < 2:
            raise ValueError("context_length must be >= 2 (or None: the model's)")
        if self.drafter not in DRAFTER_KINDS:
            raise ValueError(f"unknown drafter {self.drafter!r}")
        object.__setattr__(self, "drafter", DrafterKind(self.drafter).value)

    def context_limit(self, model_context: int) -> int:
        """The tokens this request may hold: the chat's limit, never more than the model's."""
        return min(model_context, self.context_length or model_context)


@dataclass(frozen=True)
class LoadModel:
    path: str
    draft_model_path: str | None = None


@dataclass(frozen=True)
class Generate:
    request_id: str
    messages: tuple[Message, ...]
    settings: GenerationSettings = field(default_factory=GenerationSettings)
    conversation_id: str = ""  # names the persistent prompt-cache entry


@dataclass(frozen=True)
class Stop:
    request_id: str


@dataclass(frozen=True)
class SaveState:
    conversation_id: str


@dataclass(frozen=True)
class SetMemoryBudget:
    """The one byte budget over the computed state (engine/memory.py); None: the default,
    a quarter of the machine's memory."""

    max_bytes: int | None

    def __post_init__(self) -> None:
        if self.max_bytes is not None and self.max_bytes < 0:
            raise ValueError(f"a memory budget must be >= 0 bytes, not {self.max_bytes}")


@dataclass(frozen=True)
class Close:
    pass


Command = LoadModel | Generate | Stop | SaveState | SetMemoryBudget | Close

# -- events ---------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelLoading:
    path: str
    stage: str
    fraction: float


@dataclass(frozen=True)
class ModelLoaded:
    path: str
    name: str
    family: str
    num_parameters: int
    quantization: str
    context_length: int
    backend: str
    draft_model: str | None = None
    draft_error: str = ""  # why the draft model asked for is not loaded ("": it is, or none)
    has_chat_template: bool = True  # False: only plain text completion (GenerationSettings.raw)


@dataclass(frozen=True)
class PrefillProgress:
    request_id: str
    done: int
    total: int
    reused: int


@dataclass(frozen=True)
class Tokens:
    request_id: str
    text: str
    token_ids: tuple[int, ...]
    from_draft: tuple[bool, ...]
    # each token's share of `text` ("" while a multi-byte character is incomplete)
    pieces: tuple[str, ...] = ()
    part: str = ReplyPart.ANSWER.value  # a ReplyPart: thinking text is not the answer's


@dataclass(frozen=True)
class Stats:
    """A request's figures, carried by its Finished event (never sent on its own)."""

    request_id: str
    prompt_tokens: int
    generated_tokens: int
    reused_tokens: int
    prefilled_tokens: int
    ttft_s: float
    prefill_tok_s: float
    decode_tok_s: float
    drafted: int
    accepted: int
    context_tokens: int
    context_length: int
    thinking_tokens: int = 0  # of generated_tokens, those in the <think> block
    verifies: int = 0  # forwards that verified a draft (`drafted` tokens in all)
    # of prefilled_tokens, those recomputed to bring the state back to an edit point (a
    # replay from the nearest snapshot before it); the rest are the prompt's new tokens
    replayed_tokens: int = 0
    # bytes held after the request (engine/memory.py): the live state (KV and recurrent),
    # snapshots beyond it, the branch cache, the lookup index; their total (an array two
    # parts share counted once) and the budget over them (0: not measured)
    kv_bytes: int = 0
    snapshot_bytes: int = 0
    branch_cache_bytes: int = 0
    drafter_bytes: int = 0
    memory_bytes: int = 0
    memory_budget_bytes: int = 0
    # a remote server's request (engine/remote): which server answered ("": this
    # machine's engine) and which ServerFigures it reported (prompt_tokens, cached_tokens,
    # completion_tokens, prefill_tok_s); every other figure was measured by the client
    server: str = ""
    server_reported: tuple[str, ...] = ()

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def acceptance_length(self) -> float:
        """Tokens a verify yields: its accepted drafts and the target's own token."""
        return (self.accepted + self.verifies) / self.verifies if self.verifies else 0.0


@dataclass(frozen=True)
class Finished:
    request_id: str
    reason: str  # a FinishReason
    text: str  # what this request generated (with continue_last: the continuation only)
    token_ids: tuple[int, ...]
    stats: Stats | None = None
    thinking: str = ""  # the reply's <think> block, apart from the answer in `text`

    def __post_init__(self) -> None:
        object.__setattr__(self, "reason", FinishReason(self.reason).value)


@dataclass(frozen=True)
class Failed:
    request_id: str  # "" when not about a request (e.g. model loading)
    message: str
    details: str = ""
    load_path: str = ""  # the model (or draft model) that failed to load; "": not a load
    active_model: str = ""  # after a failed load: the path of the model answering; "": none


@dataclass(frozen=True)
class StateSaved:
    conversation_id: str
    path: str
    num_bytes: int


Event = ModelLoading | ModelLoaded | PrefillProgress | Tokens | Finished | Failed | StateSaved
