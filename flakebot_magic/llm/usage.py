"""What model calls cost: tokens from each reply's ``usage``, summed, and priced from a table the user gives.

A reply's ``usage`` (an ``openai`` ``CompletionUsage`` or the plain JSON
object) says how many prompt, completion and cached prompt tokens it took;
:class:`Usage` adds them up. A price table maps a model's name to USD per
million input and output tokens (and, optionally, per million cached input
tokens); :func:`parse_prices` reads one from a mapping (the ``prices``
setting, ``build(prices=...)``) or from text (``$FLAKEBOT_PRICES``:
``"gpt-4o=2.5/10,gpt-4o-mini=0.15/0.6"``). No price is built in: a model the
table does not name costs ``None`` (unknown), never a guess.

The numbers come from the model's endpoint, which flakebot does not trust: a
count that is not a non-negative integer counts as missing.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, NamedTuple

from ..errors import UsageError
from ..events import ModelUsage

__all__ = [
    "BYTES_PER_TOKEN",
    "PRICE_FORMAT",
    "Price",
    "Prices",
    "Usage",
    "cost_usd",
    "estimate_tokens",
    "message_tokens",
    "parse_prices",
]

#: how a price table is written as text, for error messages and help
PRICE_FORMAT = "MODEL=IN/OUT[/CACHED],... in USD per million tokens, e.g. gpt-4o=2.5/10,gpt-4o-mini=0.15/0.6/0.075"


#: bytes of JSON per token, the estimate's ratio
BYTES_PER_TOKEN = 4
#: what a message costs beyond its text (role, separators)
_MESSAGE_OVERHEAD = 4


def message_tokens(message: Any) -> int:
    """One message's estimated tokens: four bytes of its JSON a token, plus a little for the message."""
    body = json.dumps(message, ensure_ascii=False, separators=(",", ":"), default=str)
    return len(body.encode("utf-8", errors="surrogatepass")) // BYTES_PER_TOKEN + _MESSAGE_OVERHEAD


def estimate_tokens(messages: list[dict[str, Any]]) -> int:
    """About how many tokens ``messages`` take: the budget's guess before a request, a reply's count when unreported.

    >>> estimate_tokens([{"role": "user", "content": "x" * 400}])
    111
    """
    return sum(message_tokens(m) for m in messages)


class Price(NamedTuple):
    """A model's price in USD per million tokens; cached input tokens cost ``input`` when ``cached`` is None."""

    input: float
    output: float
    cached: float | None = None


#: model name -> its price
Prices = dict[str, Price]


def _count(value: Any) -> int | None:
    """A token count the endpoint reported, or None when it is missing or not a plausible count."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return None
    return value


def _field(source: Any, name: str) -> Any:
    if source is None:
        return None
    if isinstance(source, Mapping):
        return source.get(name)
    return getattr(source, name, None)


@dataclass
class Usage:
    """Tokens spent over some model calls: prompt (of them ``cached_tokens`` served from a prompt cache) and completion.

    Examples
    --------
    >>> total = Usage()
    >>> total.add_reply({"prompt_tokens": 1200, "completion_tokens": 80,
    ...                  "prompt_tokens_details": {"cached_tokens": 1024}})
    Usage(prompt_tokens=1200, completion_tokens=80, cached_tokens=1024, calls=1)
    >>> total.add_reply(None, prompt_estimate=300, completion_estimate=20)
    Usage(prompt_tokens=300, completion_tokens=20, cached_tokens=0, calls=1)
    >>> total.tokens, total.calls
    (1600, 2)
    """

    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    calls: int = 0

    @property
    def tokens(self) -> int:
        """Prompt and completion tokens together."""
        return self.prompt_tokens + self.completion_tokens

    @classmethod
    def of_reply(cls, usage: Any, *, prompt_estimate: int = 0, completion_estimate: int = 0) -> Usage:
        """One reply's usage, from its ``usage`` object or dict (None: not reported); estimates fill what is missing.

        ``cached_tokens`` is read from ``prompt_tokens_details.cached_tokens``
        (OpenAI) or ``prompt_cache_hit_tokens`` (DeepSeek), and is never more
        than the prompt tokens.
        """
        prompt = _count(_field(usage, "prompt_tokens"))
        completion = _count(_field(usage, "completion_tokens"))
        cached = _count(_field(_field(usage, "prompt_tokens_details"), "cached_tokens"))
        if cached is None:
            cached = _count(_field(usage, "prompt_cache_hit_tokens"))
        prompt = prompt if prompt is not None else max(prompt_estimate, 0)
        completion = completion if completion is not None else max(completion_estimate, 0)
        return cls(prompt, completion, min(cached or 0, prompt), 1)

    def add_reply(self, usage: Any, *, prompt_estimate: int = 0, completion_estimate: int = 0) -> Usage:
        """Add one reply's usage (see :meth:`of_reply`) to these totals; return that reply's own usage."""
        reply = Usage.of_reply(usage, prompt_estimate=prompt_estimate, completion_estimate=completion_estimate)
        self.prompt_tokens += reply.prompt_tokens
        self.completion_tokens += reply.completion_tokens
        self.cached_tokens += reply.cached_tokens
        self.calls += reply.calls
        return reply

    def __add__(self, other: Usage) -> Usage:
        if not isinstance(other, Usage):
            return NotImplemented
        return Usage(
            self.prompt_tokens + other.prompt_tokens,
            self.completion_tokens + other.completion_tokens,
            self.cached_tokens + other.cached_tokens,
            self.calls + other.calls,
        )

    def to_json(self) -> dict[str, int]:
        """The totals as plain JSON (what the journal and ``provenance["usage"]`` hold)."""
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "cached_tokens": self.cached_tokens,
            "calls": self.calls,
            "tokens": self.tokens,
        }

    @classmethod
    def from_json(cls, data: Any) -> Usage:
        """The inverse of :meth:`to_json`; missing or bad counts read as 0."""
        if not isinstance(data, Mapping):
            return cls()
        return cls(
            *(_count(data.get(key)) or 0 for key in ("prompt_tokens", "completion_tokens", "cached_tokens", "calls"))
        )

    def event(
        self, cost: float | None, *, final: bool, candidate: int | None = None, role: str = "engineer"
    ) -> ModelUsage:
        """These totals as a :class:`~flakebot_magic.events.ModelUsage` event."""
        return ModelUsage(
            tokens=self.tokens,
            calls=self.calls,
            prompt_tokens=self.prompt_tokens,
            completion_tokens=self.completion_tokens,
            cached_tokens=self.cached_tokens,
            cost_usd=cost,
            final=final,
            candidate=candidate,
            role=role,
        )

    def describe(self, cost: float | None = None) -> str:
        """One line for people: ``12,345 tokens (12,000 in, 345 out, 8,192 cached) · $0.0341``."""
        line = (
            f"{self.tokens:,} tokens ({self.prompt_tokens:,} in, {self.completion_tokens:,} out, "
            f"{self.cached_tokens:,} cached)"
        )
        return line if cost is None else f"{line} · ${cost:.4f}"


def _price_number(value: Any, entry: str) -> float:
    """One price, a finite non-negative number of USD per million tokens; a UsageError naming ``entry`` if not."""
    number: float | None = None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        number = float(value)
    elif isinstance(value, str):
        try:
            number = float(value.strip().removeprefix("$"))
        except ValueError:
            number = None
    if number is None or not math.isfinite(number) or number < 0:
        raise UsageError(
            f"The price {entry} is not understood: {value!r} is not a non-negative number (write {PRICE_FORMAT})."
        )
    return number


def _price(model: str, value: Any) -> Price:
    entry = repr(f"{model}={value}") if isinstance(value, str) else f"of {model!r} ({value!r})"
    if isinstance(value, Price):
        parts: Sequence[Any] = tuple(value) if value.cached is not None else tuple(value)[:2]
    elif isinstance(value, str):
        parts = value.split("/")
    elif isinstance(value, Mapping):
        unknown = set(value) - {"input", "output", "cached"}
        if unknown or not {"input", "output"} <= set(value):
            raise UsageError(
                f"The price {entry} needs the keys 'input' and 'output' (and optionally 'cached'), "
                f"USD per million tokens{'; unknown: ' + ', '.join(sorted(map(str, unknown))) if unknown else ''}."
            )
        parts = [value["input"], value["output"], *([value["cached"]] if "cached" in value else [])]
    elif isinstance(value, Sequence):
        parts = list(value)
    else:
        parts = []
    if len(parts) not in (2, 3):
        raise UsageError(
            f"The price {entry} is not understood: give an input and an output price, and optionally a cached-input "
            f"price (write {PRICE_FORMAT})."
        )
    numbers = [_price_number(part, entry) for part in parts]
    return Price(numbers[0], numbers[1], numbers[2] if len(numbers) == 3 else None)


def parse_prices(value: Mapping[str, Any] | str | None) -> Prices:
    """A price table from a mapping (model -> (input, output[, cached])) or text ``"m=IN/OUT[/CACHED],..."``.

    Prices are USD per million tokens. Raises :class:`UsageError` naming the
    bad entry. Model names may hold ``/`` (``openai/gpt-4o=2.5/10``): the
    last ``=`` separates the name from the prices.

    Examples
    --------
    >>> table = parse_prices("gpt-4o=2.5/10, openai/gpt-4o-mini=0.15/0.6/0.075")
    >>> table["gpt-4o"]
    Price(input=2.5, output=10.0, cached=None)
    >>> table["openai/gpt-4o-mini"]
    Price(input=0.15, output=0.6, cached=0.075)
    >>> parse_prices({"m": (1, 2)})
    {'m': Price(input=1.0, output=2.0, cached=None)}
    >>> parse_prices("gpt-4o=2.5")
    Traceback (most recent call last):
    ...
    flakebot_magic.errors.UsageError: The price 'gpt-4o=2.5' is not understood: give an input and an output price, ...
    """
    if value is None:
        return {}
    prices: Prices = {}
    if isinstance(value, str):
        for raw in value.split(","):
            entry = raw.strip()
            if not entry:
                continue
            model, equals, numbers = entry.rpartition("=")
            model = model.strip()
            if not equals or not model:
                raise UsageError(f"The price {entry!r} is not understood: write {PRICE_FORMAT}.")
            prices[model] = _price(model, numbers.strip())
        return prices
    if not isinstance(value, Mapping):
        raise UsageError(f"The prices must be a mapping or text ({PRICE_FORMAT}), not {type(value).__name__}.")
    for model, price in value.items():
        if not isinstance(model, str) or not model.strip():
            raise UsageError(f"The price table names a model {model!r}: model names are non-empty text.")
        prices[model.strip()] = _price(model, price)
    return prices


def _decimal(price: float) -> Fraction:
    """A price as the decimal it was written as: ``repr`` of a float is its shortest round-trip text."""
    return Fraction(repr(float(price)))


def cost_usd(usage: Usage, model: str, prices: Mapping[str, Price]) -> float | None:
    """What ``usage`` cost on ``model`` in USD, or None when the table has no price for ``model``.

    Uncached prompt tokens at the input price, cached ones at the cached price
    (the input price when none is given), completion tokens at the output
    price. Each price counts as the decimal it is written as (``0.15`` is
    15/100, not the nearest binary float); the sum is exact, rounded once.

    >>> cost_usd(Usage(prompt_tokens=1_000_000, completion_tokens=200_000), "m", parse_prices("m=2.5/10"))
    4.5
    >>> cost_usd(Usage(prompt_tokens=10), "other", parse_prices("m=2.5/10")) is None
    True
    """
    price = prices.get(model)
    if price is None:
        return None
    cached = min(usage.cached_tokens, usage.prompt_tokens)
    cached_price = price.input if price.cached is None else price.cached
    total = (
        (usage.prompt_tokens - cached) * _decimal(price.input)
        + cached * _decimal(cached_price)
        + usage.completion_tokens * _decimal(price.output)
    )
    return float(total / 1_000_000)
