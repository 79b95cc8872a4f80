"""The person's settings, how they persist, and the dialog that edits them."""
