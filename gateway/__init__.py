"""chatgate: a spec-driven chat-completions gateway."""
