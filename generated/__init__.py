"""Pydantic models generated from openapi/ by `python -m gateway.codegen`. Do not edit."""
