"""The message list: its item model, the view, the delegate that paints each bubble, and
how a message's Markdown is rendered and laid out."""
