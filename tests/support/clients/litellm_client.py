"""litellm 1.80.0 as a client of a chatgate (run in the benchmark's litellm venv by
tests/system/test_clients_today.py): `python litellm_client.py BASE_URL MODEL` prints JSON."""

from __future__ import annotations

import json
import sys

import litellm

PROMPT = "Hello from litellm"


def main(base_url: str, model: str) -> dict:
    common = {"model": f"openai/{model}", "api_base": base_url, "api_key": "unused", "num_retries": 0}
    messages = [{"role": "user", "content": PROMPT}]
    answer = litellm.completion(messages=messages, **common)
    chunks = list(
        litellm.completion(messages=messages, stream=True, stream_options={"include_usage": True}, **common)
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    usage = next((c.usage for c in reversed(chunks) if getattr(c, "usage", None)), None)
    return {
        "plain": {"content": answer.choices[0].message.content, "usage": answer.usage.model_dump()},
        "stream": {"content": text, "usage": usage.model_dump() if usage else None},
    }


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], sys.argv[2])))
