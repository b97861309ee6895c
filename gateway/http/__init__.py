"""The ASGI app compiled from openapi/: routing, keys, validation, the served documents and the
answer's HTTP framing."""
