"""TypedDicts generated from openapi/ by `python -m gateway.tools.codegen`. Do not edit."""
