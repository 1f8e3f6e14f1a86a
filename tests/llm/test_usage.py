"""Token usage and cost: replies' usage summed, the price table parsed strictly, cost = usage x price exactly."""

from __future__ import annotations

from fractions import Fraction
from types import SimpleNamespace

import pytest

from flakebot_magic.errors import UsageError
from flakebot_magic.events import ModelUsage
from flakebot_magic.llm.usage import Price, Usage, cost_usd, parse_prices


def test_a_million_prompt_tokens_at_2_5_per_million_cost_2_5() -> None:
    prices = parse_prices("gpt-4o=2.5/10")
    assert cost_usd(Usage(prompt_tokens=1_000_000), "gpt-4o", prices) == 2.5
    assert cost_usd(Usage(completion_tokens=1_000_000), "gpt-4o", prices) == 10.0
    assert cost_usd(Usage(prompt_tokens=1_000_000, completion_tokens=500_000), "gpt-4o", prices) == 7.5


@pytest.mark.parametrize(
    ("prompt", "completion", "cached", "table", "expected"),
    [
        # each price is the decimal it is written as: 1234 x 0.15 / 1e6 is exactly 0.0001851
        (1234, 0, 0, "m=0.15/0.6", "0.0001851"),
        (1234, 567, 0, "m=0.15/0.6", "0.0005253"),
        # cached tokens at the third price; the rest of the prompt at the input price
        (10_000, 1_000, 8_000, "m=2.5/10/1.25", "0.025"),
        # no cached price: cached tokens cost what input does
        (10_000, 1_000, 8_000, "m=2.5/10", "0.035"),
        (3, 7, 0, "m=0.1/0.3", "0.0000024"),
    ],
)
def test_cost_is_usage_times_the_price_table_exactly(
    prompt: int, completion: int, cached: int, table: str, expected: str
) -> None:
    usage = Usage(prompt_tokens=prompt, completion_tokens=completion, cached_tokens=cached, calls=1)
    assert cost_usd(usage, "m", parse_prices(table)) == float(Fraction(expected))


def test_a_model_without_a_price_costs_none_not_a_guess() -> None:
    assert cost_usd(Usage(prompt_tokens=100), "gpt-4o", {}) is None
    assert cost_usd(Usage(prompt_tokens=100), "gpt-4o", parse_prices("gpt-4o-mini=0.15/0.6")) is None
    # a zero price is a price: zero
    assert cost_usd(Usage(prompt_tokens=100), "free", parse_prices("free=0/0")) == 0.0


def test_usage_adds_replies_from_objects_and_dicts() -> None:
    total = Usage()
    openai_like = SimpleNamespace(
        prompt_tokens=1200,
        completion_tokens=80,
        total_tokens=1280,
        prompt_tokens_details=SimpleNamespace(cached_tokens=1024),
    )
    first = total.add_reply(openai_like)
    assert first == Usage(1200, 80, 1024, 1)
    second = total.add_reply({"prompt_tokens": 300, "completion_tokens": 20, "prompt_cache_hit_tokens": 256})
    assert second == Usage(300, 20, 256, 1)
    third = total.add_reply(None, prompt_estimate=50, completion_estimate=5)
    assert third == Usage(50, 5, 0, 1)
    assert total == Usage(1550, 105, 1280, 3)
    assert total.tokens == 1655
    assert first + second == Usage(1500, 100, 1280, 2)
    assert total.to_json() == {
        "prompt_tokens": 1550,
        "completion_tokens": 105,
        "cached_tokens": 1280,
        "calls": 3,
        "tokens": 1655,
    }
    assert Usage.from_json(total.to_json()) == total


@pytest.mark.parametrize(
    "reported",
    [
        {"prompt_tokens": -5, "completion_tokens": "lots"},
        {"prompt_tokens": True, "completion_tokens": 2.5},
        {"prompt_tokens": None},
    ],
)
def test_counts_an_endpoint_makes_up_read_as_missing(reported: dict[str, object]) -> None:
    assert Usage.of_reply(reported, prompt_estimate=40, completion_estimate=4) == Usage(40, 4, 0, 1)


def test_cached_tokens_never_exceed_the_prompt() -> None:
    reply = Usage.of_reply(
        {"prompt_tokens": 10, "completion_tokens": 1, "prompt_tokens_details": {"cached_tokens": 99}}
    )
    assert reply.cached_tokens == 10
    assert cost_usd(Usage(10, 0, 99), "m", parse_prices("m=1/1/0")) == 0.0


def test_the_event_carries_the_totals_and_cost() -> None:
    event = Usage(100, 20, 10, 2).event(0.5, final=False, candidate=1, role="architect")
    assert event == ModelUsage(
        tokens=120,
        calls=2,
        prompt_tokens=100,
        completion_tokens=20,
        cached_tokens=10,
        cost_usd=0.5,
        final=False,
        candidate=1,
        role="architect",
        at=event.at,
    )
    assert Usage(100, 20, 10, 2).describe(0.5) == "120 tokens (100 in, 20 out, 10 cached) · $0.5000"


def test_prices_from_text_and_from_a_mapping() -> None:
    assert parse_prices(" gpt-4o = 2.5/10 ,, openai/gpt-4o-mini=$0.15/0.6/0.075 ,") == {
        "gpt-4o": Price(2.5, 10.0),
        "openai/gpt-4o-mini": Price(0.15, 0.6, 0.075),
    }
    assert parse_prices({"a": (1, 2), "b": [1, 2, 0.5], "c": {"input": 3, "output": "4"}, "d": "5/6"}) == {
        "a": Price(1.0, 2.0),
        "b": Price(1.0, 2.0, 0.5),
        "c": Price(3.0, 4.0),
        "d": Price(5.0, 6.0),
    }
    assert parse_prices(None) == {} == parse_prices("")
    # a parsed table parses again to itself (settings may hold either)
    table = parse_prices("m=1/2/0.5,n=3/4")
    assert parse_prices(table) == table


@pytest.mark.parametrize(
    ("value", "named"),
    [
        ("gpt-4o=abc/10", "'gpt-4o=abc/10'"),
        ("gpt-4o=2.5", "'gpt-4o=2.5'"),
        ("gpt-4o=1/2/3/4", "'gpt-4o=1/2/3/4'"),
        ("gpt-4o=-1/2", "'gpt-4o=-1/2'"),
        ("gpt-4o=nan/2", "'gpt-4o=nan/2'"),
        ("ok=1/2,gpt-4o", "'gpt-4o'"),
        ("=1/2", "'=1/2'"),
        ({"gpt-4o": "x"}, "'gpt-4o=x'"),
        ({"gpt-4o": (1,)}, "'gpt-4o'"),
        ({"gpt-4o": (1, True)}, "'gpt-4o'"),
        ({"gpt-4o": {"in": 1, "out": 2}}, "'gpt-4o'"),
        ({"gpt-4o": None}, "'gpt-4o'"),
        ({"": (1, 2)}, "''"),
    ],
)
def test_a_bad_price_is_a_usage_error_naming_the_entry(value: object, named: str) -> None:
    with pytest.raises(UsageError) as caught:
        parse_prices(value)  # type: ignore[arg-type]
    assert named in str(caught.value)
    assert "USD per million tokens" in str(caught.value) or "model names" in str(caught.value)


def test_prices_of_the_wrong_type_say_what_to_write() -> None:
    with pytest.raises(UsageError, match=r"mapping or text \(MODEL=IN/OUT"):
        parse_prices(42)  # type: ignore[arg-type]
