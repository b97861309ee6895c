"""The replica pick: on the servers' own load (/metrics as vLLM, llama.cpp's server and TGI
publish it), by prefix affinity with bounded load, and in turn; in one process, no sockets."""

from __future__ import annotations

import random
import time
from typing import Any

import pytest

from gateway.config.settings import Deployment
from gateway.core.canonical import ChatRequest
from gateway.core.trace import SESSION_LIMIT, Trace
from gateway.fleet.affinity import block_hashes, rendered
from gateway.fleet.router import Replica, RoutedDeployment, Router
from gateway.fleet.server_load import ServerLoad, metrics_url, parse_load

# The shapes of the servers' pages, as each publishes them (TGI: its documented names).
VLLM = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="tiny"} 2.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="tiny"} 3.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="tiny"} 0.25
# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="tiny"} 3584.0
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.001",model_name="tiny"} 0.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="tiny"} 4.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="tiny"} 4.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="tiny"} 2.1
"""
LLAMA_CPP = """\
# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed.
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 3676
# HELP llamacpp:prompt_tokens_cached_total Number of prompt tokens served from the cache.
# TYPE llamacpp:prompt_tokens_cached_total counter
llamacpp:prompt_tokens_cached_total 1834
# HELP llamacpp:requests_processing Number of requests processing.
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 1
# HELP llamacpp:requests_deferred Number of requests deferred.
# TYPE llamacpp:requests_deferred gauge
llamacpp:requests_deferred 1
"""
TGI = """\
# TYPE tgi_queue_size gauge
tgi_queue_size 4
# TYPE tgi_batch_current_size gauge
tgi_batch_current_size 8
"""


def test_each_servers_page_reads_as_its_load() -> None:
    vllm = parse_load(VLLM, "tiny")
    assert vllm is not None and (vllm.running, vllm.waiting, vllm.kv_cache) == (2.0, 3.0, 0.25)
    llama = parse_load(LLAMA_CPP)
    assert llama is not None and (llama.running, llama.waiting, llama.kv_cache) == (1, 1, 0.0)
    tgi = parse_load(TGI)
    assert tgi is not None and (tgi.running, tgi.waiting) == (8, 4)
    assert parse_load("# TYPE other gauge\nother 1\n") is None  # not a server of these
    other_model = parse_load(VLLM.replace('model_name="tiny"', 'model_name="big"'), "tiny")
    assert other_model is not None and other_model.running == 2.0  # no series of its own: all


def test_the_metrics_address_is_the_base_urls_host_and_metrics() -> None:
    assert metrics_url("http://127.0.0.1:8000/v1") == "http://127.0.0.1:8000/metrics"
    assert metrics_url("http://tgi:80/") == "http://tgi:80/metrics"
    assert metrics_url("https://h/proxy/v1/") == "https://h/proxy/metrics"


def deployment(routing: dict[str, Any] | None = None, replicas: int = 2, **config: Any) -> RoutedDeployment:
    settings = Deployment(
        name="d",
        replicas=[{"name": f"r{i}", "metrics_url": f"http://127.0.0.1:1/{i}"} for i in range(replicas)],
        routing=routing or {},
        **config,
    )
    return Router.build(settings, {})


def said(replica: Replica, running: float, waiting: float = 0, kv: float = 0, age: float = 0) -> None:
    replica.server = ServerLoad(running, waiting, kv, time.monotonic() - age, replica.outstanding)


def picks(routed: RoutedDeployment, times: int = 50, request: ChatRequest | None = None) -> set[str]:
    rng = random.Random(7)
    prompt = routed.prompt_of(request) if request is not None else None
    return {routed.pick(set(), rng, 1, prompt).name for _ in range(times)}  # type: ignore[union-attr]


def test_the_pick_goes_to_the_replica_whose_server_says_it_is_less_loaded() -> None:
    routed = deployment({"load_from": "metrics"})
    a, b = routed.replicas
    said(a, running=4, waiting=2)
    said(b, running=1)
    assert picks(routed) == {"r1"}
    said(b, running=1, kv=0.9)
    said(a, running=1)
    assert picks(routed) == {"r0"}  # the same count, but b's KV cache is nearly full


def test_between_reads_the_gateways_own_requests_fill_the_gap() -> None:
    routed = deployment({"load_from": "metrics"})
    a, b = routed.replicas
    said(a, running=0)
    said(b, running=2)
    a.started(3)  # sent since the read: the server has not said so yet
    assert a.load(time.monotonic()) == 3
    assert picks(routed) == {"r1"}
    a.released(3)
    assert a.load(time.monotonic()) == 0


def test_a_stale_read_falls_back_to_the_gateways_count_and_keeps_the_replica() -> None:
    routed = deployment({"load_from": "metrics", "scrape_interval": 0.5, "stale_after": 2})
    a, b = routed.replicas
    said(a, running=0, age=60)  # its /metrics stopped answering a minute ago
    said(b, running=9)
    a.started(2)
    assert a.load(time.monotonic()) == 2  # the gateway's own count
    assert picks(routed) == {"r0"}  # b's fresh 9 still counts; a serves on
    said(b, running=0)
    assert picks(routed) == {"r1"}


def request(system: str, question: str, **fields: Any) -> ChatRequest:
    messages = [{"role": "system", "content": system}, {"role": "user", "content": question}]
    return ChatRequest(model="d", messages=messages, **fields)


LONG = "You are a helpful assistant for the tenant. " * 40


def test_a_shared_prefix_hashes_alike_until_the_prompts_differ() -> None:
    one = block_hashes(rendered(request(LONG, "one").messages, []), 64)
    two = block_hashes(rendered(request(LONG, "two?").messages, []), 64)
    other = block_hashes(rendered(request(LONG.upper(), "one").messages, []), 64)
    shared = len(LONG) // 64
    assert one[:shared] == two[:shared] and len(one) > shared
    assert not set(one) & set(other)  # chained: a different start changes every block


def test_affinity_sends_a_prompt_back_to_the_replica_that_holds_its_prefix() -> None:
    routed = deployment({"affinity": {"enabled": True, "block_chars": 64}}, replicas=4)
    rng = random.Random(3)
    first = routed.pick(set(), rng, 1, routed.prompt_of(request(LONG, "one")))
    assert first is not None
    for question in ("two", "three", "four"):
        prompt = routed.prompt_of(request(LONG, question))
        assert routed.pick(set(), rng, 1, prompt) is first
        assert prompt is not None and prompt.outcome == "hit"
    fresh = routed.prompt_of(request("another tenant " * 50, "one"))
    routed.pick(set(), rng, 1, fresh)
    assert fresh is not None and fresh.outcome == "miss"


@pytest.mark.parametrize("state", ["ejected", "full", "overloaded", "excluded"])
def test_affinity_never_sends_work_to_an_ejected_full_or_overloaded_replica(state: str) -> None:
    routed = deployment(
        {"affinity": {"enabled": True, "block_chars": 64, "bound": 1.25}},
        replicas=2,
        concurrency={"max_concurrent": 4},
    )
    rng = random.Random(5)
    holder = routed.pick(set(), rng, 1, routed.prompt_of(request(LONG, "one")))
    assert holder is not None
    exclude: set[str] = set()
    if state == "ejected":
        for _ in range(holder.failures_to_eject):
            holder.count_failure()
    elif state == "full":
        holder.started(4)
    elif state == "overloaded":
        holder.started(3)  # 3 + 1 > ceil(1.25 × (3 + 0 + 1) / 2) = 3
    else:
        exclude = {holder.name}  # tried already, or not to go back to
    outcomes = []
    for question in ("two", "three"):
        prompt = routed.prompt_of(request(LONG, question))
        chosen = routed.pick(exclude, rng, 1, prompt)
        assert chosen is not None and chosen is not holder and prompt is not None
        outcomes.append(prompt.outcome)
    assert outcomes == ["overridden", "hit"]  # the replica chosen instead holds it now


def test_a_clients_key_sticks_its_requests_to_one_replica() -> None:
    routed = deployment({"affinity": {"enabled": True}}, replicas=4)
    rng = random.Random(11)

    def chosen(**fields: Any) -> set[str]:
        names = set()
        for i in range(20):  # prompts that share no block
            replica = routed.pick(set(), rng, 1, routed.prompt_of(request(f"s {i}", "hi", **fields)))
            assert replica is not None
            names.add(replica.name)
        return names

    assert len(chosen(user="alice")) == 1
    assert len(chosen(options={"prompt_cache_key": "k"})) == 1
    assert len(chosen(trace=Trace.from_request("r", {"x-claude-code-session-id": "s"}))) == 1
    assert len(chosen()) > 1


def test_a_session_header_is_read_first_named_first_and_bounded() -> None:
    assert Trace.from_request("r", {}).session is None
    assert Trace.from_request("r", {"session-id": "codex", "x-session-id": "generic"}).session == "codex"
    assert Trace.from_request("r", {"x-session-id": "s" * 1000}).session == "s" * SESSION_LIMIT
    traced = Trace.from_request("r", {"x-session-id": "s", "traceparent": f"00-{'1' * 32}-{'2' * 16}-01"})
    assert traced.session == "s" and "s" not in traced.headers().values()  # never sent upstream
    # the prompt_cache_key names the cache more exactly than a session: it wins
    routed = deployment({"affinity": {"enabled": True}}, replicas=2)
    keyed = routed.prompt_of(request("x", "hi", options={"prompt_cache_key": "k"}, trace=traced))
    assert keyed is not None and keyed.key == "k"


def test_round_robin_takes_the_replicas_in_turn() -> None:
    routed = deployment({"pick": "round-robin"}, replicas=3)
    rng = random.Random(1)
    names = [routed.pick(set(), rng).name for _ in range(6)]  # type: ignore[union-attr]
    assert names[:3] != names[1:4] and sorted(names[:3]) == ["r0", "r1", "r2"] and names[:3] == names[3:]


def test_without_routing_settings_the_pick_is_todays() -> None:
    routed = deployment()
    assert routed.affinity is None and routed.watch is None
    assert routed.prompt_of(request(LONG, "one")) is None
    routed.replicas[0].started(2)
    assert picks(routed) == {"r1"}
