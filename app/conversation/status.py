"""A message's status, as the store keeps it: streaming while tokens arrive, then how it
ended. A StrEnum, so the stored text and comparisons with plain strings are unchanged."""

from __future__ import annotations

from enum import StrEnum

from engine.events import FinishReason


class MessageStatus(StrEnum):
    DONE = "done"
    STREAMING = "streaming"
    STOPPED = "stopped"  # by a Stop, a failure, or the app closing mid-reply
    LENGTH = "length"  # cut off at max tokens
    CONTEXT_FULL = "context_full"  # cut off where the context length ran out
    FAILED = "failed"
    EDITED = "edited"  # a person's edit of a reply, kept as a sibling of it


STATUSES = frozenset(status.value for status in MessageStatus)
# A reply that did not end on its own: the model can be asked to go on (after a full
# context, by dropping the oldest turns: the engine says so when they may not be dropped).
CONTINUABLE = frozenset(
    (
        MessageStatus.STOPPED,
        MessageStatus.LENGTH,
        MessageStatus.CONTEXT_FULL,
        MessageStatus.EDITED,
    )
)

_AFTER_FINISH: dict[str, MessageStatus] = {
    FinishReason.EOS: MessageStatus.DONE,
    FinishReason.LENGTH: MessageStatus.LENGTH,
    FinishReason.CONTEXT_FULL: MessageStatus.CONTEXT_FULL,
    FinishReason.STOPPED: MessageStatus.STOPPED,
}


def status_after(reason: str) -> MessageStatus:
    """The status a reply keeps once the engine finished it for `reason`."""
    return _AFTER_FINISH.get(reason, MessageStatus.DONE)
