"""LangChain's ChatAnthropic against a chatgate's Messages API (run by
tests/system/test_anthropic_clients.py from the agent clients' venv):
`python anthropic_langchain.py BASE_URL KEY MODEL PROMPT MAX_TOKENS` prints what invoke, stream and
a forced call of a bound tool gave back, as JSON."""

from __future__ import annotations

import json
import sys

from langchain_anthropic import ChatAnthropic
from pydantic import BaseModel, Field


class get_weather(BaseModel):  # the tool's name is the class's
    """The weather in a city."""

    city: str = Field(description="The city.")


def main(base_url: str, key: str, model: str, prompt: str, max_tokens: str) -> None:
    chat = ChatAnthropic(
        model=model,
        base_url=base_url,
        api_key=key,
        max_tokens=int(max_tokens),
        temperature=0,
        max_retries=0,
        timeout=60,
    )
    invoked = chat.invoke(prompt)
    pieces = list(chat.stream(prompt))
    streamed = pieces[0]
    for piece in pieces[1:]:
        streamed += piece
    called = chat.bind_tools([get_weather], tool_choice="get_weather").invoke(prompt)
    print(
        json.dumps(
            {
                "invoke": {
                    "content": invoked.text,
                    "usage": invoked.usage_metadata,
                    "stop_reason": invoked.response_metadata.get("stop_reason"),
                    "id": invoked.id,
                },
                "stream": {
                    "content": streamed.text,
                    "pieces": sum(1 for piece in pieces if piece.text),
                    "usage": streamed.usage_metadata,
                },
                "tool_calls": [
                    {key: call[key] for key in ("name", "args", "id")} for call in called.tool_calls
                ],
                "tool_stop_reason": called.response_metadata.get("stop_reason"),
            }
        )
    )


if __name__ == "__main__":
    main(*sys.argv[1:])
