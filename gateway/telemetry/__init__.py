"""What the gateway tells about its requests: the per-request record, the access log, metrics and traces."""
