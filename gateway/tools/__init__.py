"""The tools on top, beside the CLI: conformance runs, the vendors' documents as validators, and
the code generator. Nothing the gateway runs imports them."""
