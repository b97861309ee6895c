"""The bottom layer, which backends and the rest of the gateway both build on: the canonical
request and events, the errors, the parameter catalogue and the config primitives. It imports
nothing of chatgate outside itself (tests/integration/test_layers.py holds it to that)."""
