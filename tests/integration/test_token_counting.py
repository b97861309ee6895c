"""Prompt tokens from the model's own tokenizer when a deployment names one (a tokenizer built here),
for the context check and the token limits; without one, the estimate is corrected by the count
the backend reports, so its error does not pile up in the buckets."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest
import yaml
from tokenizers import Tokenizer, models, pre_tokenizers

from gateway.config.settings import ConfigError
from gateway.config.source import load_settings
from gateway.core.token_count import PromptCounter, estimate
from tests.support.servers import running_gateway

CJK = "深度学习是机器学习的一个分支" * 20  # 280 characters, each its own token below
MESSAGES = [{"role": "user", "content": CJK}]


def character_tokenizer(path: Path) -> Path:
    """A tokenizer that makes one token of every character (as many CJK tokenizers nearly do)."""
    alphabet = sorted(set(CJK + "abcdefghijklmnopqrstuvwxyz "))
    tokenizer = Tokenizer(models.WordLevel({c: i for i, c in enumerate(alphabet)}, unk_token=" "))
    tokenizer.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    file = path / "tokenizer.json"
    tokenizer.save(str(file))
    return file


def test_the_tokenizer_counts_what_the_estimate_undercounts(tmp_path: Path):
    counter = PromptCounter(character_tokenizer(tmp_path))
    counted = asyncio.run(counter.count(MESSAGES))
    assert counted == len(CJK) + 3
    assert estimate(MESSAGES) < counted / 3  # four characters a token: several-fold under


def test_a_missing_or_broken_tokenizer_is_a_config_error(tmp_path: Path):
    broken = tmp_path / "tokenizer.json"
    broken.write_text("{not json")
    config = tmp_path / "chatgate.yaml"
    config.write_text(yaml.safe_dump({"deployments": [{"name": "echo", "tokenizer": str(broken)}]}))
    with pytest.raises(ConfigError, match=r"deployments\.0.*tokenizer"):
        load_settings(config)


def test_exact_counts_hold_the_token_limit_and_the_context(tmp_path: Path, log_dir: Path):
    config = tmp_path / "chatgate.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "deployments": [
                    {
                        "name": "counted",
                        "backend": "echo",
                        "tokenizer": str(character_tokenizer(tmp_path)),
                        "limits": {"tokens_per_minute": 250},
                        "capabilities": {"context_length": 400},
                    }
                ]
            }
        )
    )
    with running_gateway(log_dir, config) as url:
        body = {"model": "counted", "messages": MESSAGES, "max_tokens": 10}
        too_many = httpx.post(f"{url}/v1/chat/completions", json=body)
        context = httpx.post(f"{url}/v1/chat/completions", json={**body, "max_tokens": 200})
    # 283 tokens counted: more than the 250 a minute (the estimate, about 73, would have passed)
    assert too_many.status_code == 429, too_many.text
    assert context.status_code == 400 and context.json()["error"]["code"] == "context_length_exceeded"


def test_the_estimate_is_corrected_by_the_reported_count(tmp_path: Path, log_dir: Path):
    """Long words: the estimate (a token per four characters) is far above echo's own count; the
    difference goes back to the bucket when the usage is known."""
    config = tmp_path / "chatgate.yaml"
    config.write_text(
        yaml.safe_dump(
            {"deployments": [{"name": "e", "backend": "echo", "limits": {"tokens_per_minute": 600}}]}
        )
    )
    prompt = "supercalifragilistic " * 10  # 210 characters: about 56 estimated, 13 counted by echo
    with running_gateway(log_dir, config) as url:
        body = {"model": "e", "messages": [{"role": "user", "content": prompt}], "max_tokens": 5}
        first = httpx.post(f"{url}/v1/chat/completions", json=body)
        second = httpx.post(f"{url}/v1/chat/completions", json=body)
    estimated = estimate(body["messages"])
    usage = first.json()["usage"]
    remaining_first = int(first.headers["x-ratelimit-remaining-tokens"])
    remaining_second = int(second.headers["x-ratelimit-remaining-tokens"])
    # the second admission sees the first's true use (prompt counted + completion), not its estimate
    assert remaining_first == 600 - estimated
    expected = 600 - usage["total_tokens"] - estimated
    assert expected <= remaining_second <= expected + 3  # the bucket refills 10 tokens a second
