"""LangChain's ChatOpenAI and llama-index's OpenAILike against a chatgate (run in their own venv
by tests/system/test_clients_today.py): `python python_frameworks.py BASE_URL MODEL` prints what each
call gave back, as JSON."""

from __future__ import annotations

import json
import sys

from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from llama_index.core.llms import ChatMessage
from llama_index.llms.openai_like import OpenAILike
from pydantic import BaseModel

PROMPT = "Hello from a framework"


class City(BaseModel):
    name: str
    population: int


@tool
def get_weather(city: str) -> str:
    """The weather in a city."""
    return "sunny"


def langchain(base_url: str, model: str) -> dict:
    chat = ChatOpenAI(model=model, base_url=base_url, api_key="unused", max_retries=0)
    answer = chat.invoke(PROMPT)
    pieces = list(chat.stream(PROMPT, stream_usage=True))
    streamed = pieces[0]
    for piece in pieces[1:]:
        streamed = streamed + piece
    city = chat.with_structured_output(City).invoke("Name a city")
    forced = chat.bind_tools([get_weather], tool_choice="get_weather").invoke("Weather in Paris?")
    return {
        "invoke": {"content": answer.content, "usage": answer.usage_metadata},
        "stream": {"content": streamed.content, "usage": streamed.usage_metadata, "pieces": len(pieces)},
        "structured": city.model_dump(),
        "tool_calls": [{"name": c["name"], "args": c["args"]} for c in forced.tool_calls],
    }


def llama_index(base_url: str, model: str) -> dict:
    llm = OpenAILike(model=model, api_base=base_url, api_key="unused", is_chat_model=True, max_retries=0)
    messages = [ChatMessage(role="user", content=PROMPT)]
    answer = llm.chat(messages)
    pieces = list(llm.stream_chat(messages))
    return {
        "chat": {
            "content": answer.message.content,
            "usage": dict(answer.raw.usage) if answer.raw.usage else None,
        },
        "stream_chat": {"content": pieces[-1].message.content, "deltas": [p.delta for p in pieces]},
    }


if __name__ == "__main__":
    base, model = sys.argv[1], sys.argv[2]
    print(
        json.dumps(
            {"langchain": langchain(base, model), "llama_index": llama_index(base, model)}, default=str
        )
    )
