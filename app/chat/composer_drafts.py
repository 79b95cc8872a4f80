"""One unsent draft per chat: switching chats puts the composer's text aside under the
chat it was typed in and brings back the one typed in the chat opened. A draft typed in
a new chat goes with it when its first message creates the chat. The window keeps them
across a restart (`snapshot` / `restore`); what was sent is no draft."""

from __future__ import annotations

from app.chat.composer import Composer


class ComposerDrafts:
    def __init__(self, composer: Composer) -> None:
        self.composer = composer
        self.conversation_id: str | None = None  # the chat the composer's text belongs to
        self._drafts: dict[str | None, str] = {}  # None: the new, not yet created chat

    def switch(self, conversation_id: str | None) -> None:
        if conversation_id == self.conversation_id:
            return
        text = self.composer.edit.toPlainText()
        if text:
            self._drafts[self.conversation_id] = text
        else:
            self._drafts.pop(self.conversation_id, None)
        self.conversation_id = conversation_id
        self.composer.edit.setPlainText(self._drafts.pop(conversation_id, ""))
        self.composer.edit.moveCursor(self.composer.edit.textCursor().MoveOperation.End)

    def snapshot(self) -> dict[str, str]:
        """Every unsent draft, the composer's own included; "" keys the new chat."""
        drafts = {key or "": text for key, text in self._drafts.items() if text}
        text = self.composer.edit.toPlainText()
        if text:
            drafts[self.conversation_id or ""] = text
        return drafts

    def restore(self, drafts: dict[str, str]) -> None:
        self._drafts = {key or None: text for key, text in drafts.items() if text}
        self.composer.edit.setPlainText(self._drafts.pop(self.conversation_id, ""))

    def adopt(self, conversation_id: str | None) -> None:
        """The new chat the text was typed in now exists under `conversation_id`."""
        self.conversation_id = conversation_id
