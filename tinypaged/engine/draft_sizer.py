"""DraftSizer: how many proposals each speculating sequence takes in a step, so that
speculation does not slow what it cannot help (free text, large batches).

A sequence's proposals are accepted at some rate a (Acceptance: a decaying count of
its accepted and rejected proposals, fading back to its prior while it proposes
nothing, so a sequence that stopped speculating is tried again now and then). A new
sequence's prior is the engine's rate so far (every sequence's verifications) where
that is above even: a draft model that agrees with the target nine times in ten is
trusted from a request's first step, where an even prior would rule out proposals
that cost more than half a step. k
proposals then earn a + a^2 + ... + a^k tokens beyond the one a step always gives, for
k more rows in the step, whose cost is what this engine measured: the seconds of pure
decode steps by their rows (their fast end: note_step). Sequence after sequence, each
takes the size (0, 1, 3, 7, ... up to num_speculative_tokens) that gives the step the
most tokens a second. A size not measured yet is guessed cheap, so it is tried once
and then known; a batch size whose plain step was never measured takes no proposals
until it is.
"""
from __future__ import annotations

PRIOR_TRIALS = 2.0  # the prior's weight, in proposals
EVEN = 0.5  # the engine's prior before any verification
DECAY = 0.8  # the weight of a sequence's past verifications at each new one
IDLE_DECAY = 0.97  # a step without proposals: its record fades toward the prior
GUESSED_ROW_COST = 0.05  # an unmeasured size's cost a row, a share of the plain step
# a size's seconds follow a faster step at once and a slower one slowly: a step is
# slowed by what has nothing to do with its rows (a first call's compile, a page fault,
# the collector, another process), and one such step must not rule its size out
FALLING, RISING = 1.0, 0.05


class Acceptance:
    """A record of proposals' fate: one sequence's, or the engine's (all of them)."""
    __slots__ = ("hits", "trials", "prior")

    def __init__(self, prior: float = EVEN):
        self.hits = self.trials = 0.0
        self.prior = prior  # the rate before any evidence

    @property
    def rate(self) -> float:
        return (self.hits + self.prior * PRIOR_TRIALS) / (self.trials + PRIOR_TRIALS)

    def note(self, proposed: int, accepted: int) -> None:
        """A verification: accepted proposals, then (unless all were) one rejected."""
        self.hits = self.hits * DECAY + accepted
        self.trials = self.trials * DECAY + accepted + (accepted < proposed)

    def idle(self) -> None:
        self.hits *= IDLE_DECAY
        self.trials *= IDLE_DECAY


class DraftSizer:
    def __init__(self, most: int):
        """most: num_speculative_tokens."""
        self.sizes = sorted({k for k in (1, 3, 7, 15, 31) if k < most} | {most})
        self.seconds: dict[int, float] = {}  # rows of a pure decode step -> its seconds (note_step)
        self.tried: set[int] = set()  # sizes stepped once (their first step is not kept)

    def note_step(self, rows: int, seconds: float) -> None:
        """A pure decode step of `rows` rows took `seconds`. A size's first step is not
        kept (it may have compiled kernels for new shapes: a draft model's first pass)."""
        if rows not in self.tried:
            self.tried.add(rows)
            return
        old = self.seconds.get(rows)
        if old is None:
            self.seconds[rows] = seconds
        else:
            self.seconds[rows] = old + (FALLING if seconds < old else RISING) * (seconds - old)

    def _cost(self, rows: int, plain: int) -> float:
        """A step of rows rows against a plain step of `plain` (measured, else guessed)."""
        if rows in self.seconds:
            return self.seconds[rows] / self.seconds[plain]
        return 1.0 + GUESSED_ROW_COST * (rows - plain)

    def choose(self, rates: list[float], plain: int) -> list[int]:
        """Proposals for each speculating sequence (acceptance rates `rates`) of a step
        of `plain` decoding sequences."""
        if plain not in self.seconds:
            return [0] * len(rates)
        rows, tokens, sizes = plain, float(plain), []
        for rate in rates:
            best, best_gain, best_value = 0, 0.0, tokens / self._cost(rows, plain)
            for k in self.sizes:
                gain = rate * (1 - rate ** k) / (1 - rate) if rate < 1 else float(k)
                value = (tokens + gain) / self._cost(rows + k, plain)
                if value > best_value:
                    best, best_gain, best_value = k, gain, value
            sizes.append(best)
            rows, tokens = rows + best, tokens + best_gain
        return sizes
