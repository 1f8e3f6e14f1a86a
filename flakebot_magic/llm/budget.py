"""The model budget of one run, shared by every actor that spends it (architect, engineers): tokens and dollars.

Each reply is charged as it arrives; before each request an actor asks
:meth:`Budget.check`, which raises :class:`~flakebot_magic.errors.BudgetExhausted`
when the tokens are spent, or when the request about to go out could take the
cost past ``max_cost`` (its prompt, priced as input, on top of what is spent:
the session stops *before* it overspends, not after).

Examples
--------
>>> from flakebot_magic.llm.usage import Price, Usage
>>> budget = Budget(1_000_000, max_cost=1.0, prices={"m": Price(2.0, 8.0)})
>>> budget.charge("m", Usage(prompt_tokens=100_000, completion_tokens=10_000, calls=1))
>>> round(budget.cost_usd, 4)
0.28
>>> budget.check("m", next_prompt_tokens=400_000)  # 0.28 + 0.8 > 1.0
Traceback (most recent call last):
...
flakebot_magic.errors.BudgetExhausted: The cost limit ($1.00) would be passed by the next request: ...
"""

from __future__ import annotations

import threading
from collections.abc import Mapping

from ..errors import BudgetExhausted
from .usage import Price, Usage, cost_usd

__all__ = ["Budget"]


class Budget:
    """Tokens and dollars spent by a run's model requests, against ``token_budget`` and ``max_cost`` (thread-safe)."""

    def __init__(
        self,
        token_budget: int,
        *,
        max_cost: float | None = None,
        prices: Mapping[str, Price] | None = None,
    ) -> None:
        self.token_budget = token_budget
        self.max_cost = max_cost
        self.prices = dict(prices or {})
        self._lock = threading.Lock()
        #: what the replies charged so far add up to
        self.spent = Usage()
        self.cost_usd = 0.0
        #: True once a reply's model had no price: the cost is then a lower bound
        self.unpriced = False

    @property
    def tokens(self) -> int:
        return self.spent.tokens

    def cost(self, model: str, usage: Usage) -> float | None:
        """What ``usage`` of ``model`` cost, from the price table; None without a price."""
        return cost_usd(usage, model, self.prices)

    def charge(self, model: str, usage: Usage) -> None:
        """Count replies: one, or what an interrupted session spent before this one resumed it."""
        cost = self.cost(model, usage)
        with self._lock:
            self.spent = self.spent + usage
            if cost is None:
                self.unpriced = self.unpriced or usage.calls > 0
            else:
                self.cost_usd += cost

    def check(self, model: str, *, next_prompt_tokens: int = 0) -> None:
        """Raise :class:`BudgetExhausted` (its ``reason``: ``tokens`` or ``cost``) when the next request may not go."""
        with self._lock:
            tokens, spent = self.spent.tokens, self.cost_usd
        if tokens >= self.token_budget:
            raise BudgetExhausted(
                f"The token budget ({self.token_budget:,} tokens) is spent: {tokens:,} tokens so far.",
                reason="tokens",
            )
        if self.max_cost is None:
            return
        price = self.prices.get(model)
        if price is None:
            raise BudgetExhausted(
                f"--max-cost ${self.max_cost:.2f} needs a price for the model {model!r}, and the price table has "
                "none. Add one (`prices={'MODEL': (USD per million input tokens, USD per million output tokens)}`, "
                "or FLAKEBOT_PRICES='MODEL=IN/OUT'), or drop --max-cost.",
                reason="cost",
            )
        upcoming = next_prompt_tokens * price[0] / 1_000_000
        if spent + upcoming > self.max_cost:
            raise BudgetExhausted(
                f"The cost limit (${self.max_cost:.2f}) would be passed by the next request: ${spent:.4f} spent, "
                f"and its prompt alone (~{next_prompt_tokens:,} tokens) costs about ${upcoming:.4f}.",
                reason="cost",
            )
