"""In-process tests: no process is started, no socket is opened beyond loopback inside the test."""
