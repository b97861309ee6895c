"""The local backend: a transformers model in this process."""
