"""OpenAI's Responses API, served under the OpenAI mount beside chat completions (one document,
openapi/openai.yaml, as OpenAI's own holds both): `POST /responses` is a chat operation with a
translator of its own (`answers`, reading the body with `reading`), and the stored responses'
operations and the chat flow's hook are in `keeping`."""

from gateway.dialects.responses.answers import ResponsesTranslator
from gateway.dialects.responses.keeping import ResponseKeeping, operations

__all__ = ["ResponseKeeping", "ResponsesTranslator", "operations"]
