"""The process and its HTTP connections: uvicorn's workers, the edge that reads and writes sockets,
start and stop."""
