"""The bench's fleet point, without servers: its workload's prompts, its table and the gain of
affinity over today's P2C, on figures set by hand."""

from __future__ import annotations

from typing import Any

from bench import fleet


def routing(p50: float, p90: float, tokens_per_s: float, **more: Any) -> dict[str, Any]:
    return {
        "ttft_p50_ms": p50, "ttft_p90_ms": p90, "output_tokens_per_s": tokens_per_s, "cached_share": 0.5,
        "errors": 0, **more,
    }  # fmt: skip


def test_the_table_has_each_routing_and_affinitys_gain_over_p2c() -> None:
    results = {
        "fleet": {
            "workload": {"tenants": 8, "conversations_per_tenant": 2, "turns": 3, "system_words": 620},
            "model": "medium.gguf",
            "routings": {
                "round-robin": routing(2400, 3100, 20.0),
                "p2c": routing(2300, 3000, 21.0),
                "load-aware": {"error": "StartError: llama-server exited with 1"},
                "load-aware + affinity": routing(60, 750, 30.0, affinity={"hit": 40, "miss": 8}),
            },
        }
    }
    text = "\n".join(fleet.render(results))
    assert "48 streamed requests a round, 1 round pooled" in text
    assert "P2C, gateway's count (today)" in text and "2,300" in text and "3,000" in text
    assert "P2C on the servers' /metrics" in text and "error: StartError" in text
    assert "TTFT p90 4.0× lower" in text and "output tokens/s 1.43×" in text


def test_no_fleet_point_no_table_and_an_error_said() -> None:
    assert fleet.render({}) == []
    assert fleet.render({"fleet": {"error": "RuntimeError: no llama-server"}})[-1].endswith("no llama-server")


def test_tenants_prompts_are_long_their_own_and_the_same_every_run() -> None:
    first = fleet.system_prompt(1, 620)
    assert first == fleet.system_prompt(1, 620) and first != fleet.system_prompt(2, 620)
    assert len(first.split()) > 600


def test_the_gateways_config_routes_each_way_over_both_replicas() -> None:
    class Up:
        def __init__(self, port: int) -> None:
            self.url = f"http://127.0.0.1:{port}"

    for name, routing_settings in fleet.ROUTINGS.items():
        config = fleet.chatgate_config([Up(1), Up(2)], routing_settings)  # type: ignore[list-item]
        (deployment,) = config["deployments"]
        assert [r["options"]["base_url"] for r in deployment["replicas"]] == [
            "http://127.0.0.1:1/v1",
            "http://127.0.0.1:2/v1",
        ]
        assert deployment["routing"] == routing_settings, name
    from gateway.config.settings import Settings

    Settings.model_validate(fleet.chatgate_config([Up(1), Up(2)], fleet.ROUTINGS["load-aware + affinity"]))  # type: ignore[list-item]


def test_rounds_pool_every_turn_and_keep_each_rounds_p90() -> None:
    fast = [fleet.Turn(100.0, 16) for _ in range(9)] + [fleet.Turn(1000.0, 16)]
    slow = [fleet.Turn(3000.0, 16) for _ in range(9)]
    slow += [fleet.Turn(9000.0, 16), fleet.Turn(0.0, 0, "HTTP 502")]
    pooled = fleet.summarize(
        "p2c",
        [
            fleet.RoundSample(fast, 10.0, cached=900, computed=100, affinity={"hit": 3, "miss": 0}),
            fleet.RoundSample(slow, 30.0, cached=100, computed=900, affinity={"hit": 1, "miss": 2}),
        ],
    )
    assert (pooled.rounds, pooled.requests, pooled.errors) == (2, 21, 1)
    # twenty good turns: 9 × 100, 1000, 9 × 3000, 9000 (the failed turn counts in no percentile)
    assert pooled.ttft_p50_ms == 3000.0 and pooled.ttft_p90_ms == 3000.0
    assert pooled.ttft_p90_ms_by_round == [100.0, 3000.0]
    assert pooled.output_tokens == 20 * 16 and pooled.output_tokens_per_s == 8.0
    assert pooled.cached_share == 0.5 and pooled.affinity == {"hit": 4, "miss": 2}
    assert pooled.error_kinds == {"HTTP 502": 1}
