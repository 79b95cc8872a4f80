"""The sidebar: new chat, search and the conversation list."""
