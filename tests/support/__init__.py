"""What the tests share: stand-in upstreams, gateway processes, tiny models, client libraries."""
