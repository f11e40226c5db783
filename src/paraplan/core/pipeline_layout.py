"""Megatron-Core's pipeline layout (`--pipeline-model-parallel-layout`): which layers
each virtual pipeline stage holds, written as a string.

Grammar (Megatron-Core's `PipelineParallelLayerLayout`):

- `E` the embedding, `t` a transformer (decoder) layer, `m` a multi-token-prediction
  layer, `L` the output layer and loss;
- `|` ends a virtual stage; stages are listed in Megatron's virtual-stage order, so
  stage *i* is model chunk *i // p* of pipeline rank *i % p*, and a stage may be
  empty (`||`);
- `X*N` repeats one symbol (or `|`) N times, `(...)*N` a group of them; commas are
  cosmetic and ignored. Groups do not nest and a group must carry its `*N`
  (Megatron's expansion is a single, non-nested pass).

`"Et|(tt|)*30mL"` on 8 pipeline ranks is 32 virtual stages, v = 4: the embedding and
one layer, thirty stages of two layers, then the MTP layer and the loss.

`parse_layout` checks the syntax (`LayoutError`, naming the character); `check_layout`
checks a parsed layout against a model and the pipeline size with Megatron-Core's
rules (`validate_layer_layout`) and paraplan's one limit (MTP layers beside the loss),
raising `StrategyError`.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from paraplan.core.errors import StrategyError

SYMBOLS: dict[str, str] = {"E": "embedding", "t": "transformer layer", "m": "MTP layer", "L": "loss",
                           "|": "virtual-stage boundary"}
MAX_LAYOUT_SYMBOLS = 100_000
"""A layout expands to at most this many symbols (far more than any model's layers)."""
COLUMN = "pipeline_model_parallel_layout"


class LayoutError(ValueError):
    """A layout string that is not in Megatron's grammar; the message names the character."""


@dataclass(frozen=True)
class PipelineLayout:
    """A parsed layout: each virtual stage's symbols, in virtual-stage order."""

    text: str
    stages: tuple[str, ...]

    def count(self, symbol: str) -> tuple[int, ...]:
        """How many `symbol`s (`t`, `m`, `E`, `L`) each virtual stage holds."""
        return tuple(stage.count(symbol) for stage in self.stages)

    @property
    def transformer_layers(self) -> tuple[int, ...]:
        return self.count("t")


def _where(text: str, i: int) -> str:
    return f"character {i + 1} '{text[i]}'" if i < len(text) else "at the end"


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.chars = [(i, ch) for i, ch in enumerate(text) if ch != ","]
        self.pos = 0
        self.size = 0

    def fail(self, message: str) -> LayoutError:
        i = self.chars[self.pos][0] if self.pos < len(self.chars) else len(self.text)
        return LayoutError(f"{_where(self.text, i)}: {message}")

    def peek(self) -> str:
        return self.chars[self.pos][1] if self.pos < len(self.chars) else ""

    def repeat(self) -> int | None:
        """The N of a `*N` at the cursor (None when there is no `*`)."""
        if self.peek() != "*":
            return None
        self.pos += 1
        start = self.pos
        while self.peek().isdigit():
            self.pos += 1
        if self.pos == start:
            raise self.fail("expected the number of repetitions after '*'")
        return int("".join(ch for _, ch in self.chars[start:self.pos]))

    def grow(self, piece: str) -> str:
        self.size += len(piece)
        if self.size > MAX_LAYOUT_SYMBOLS:
            raise self.fail(f"the layout expands to more than {MAX_LAYOUT_SYMBOLS:,} symbols")
        return piece

    def symbols(self, in_group: bool) -> str:
        """Symbols (each with an optional `*N`) up to the end or a `)`."""
        out = []
        while self.pos < len(self.chars):
            ch = self.peek()
            if ch == ")":
                if in_group:
                    break
                raise self.fail("')' without a matching '('")
            if ch == "(":
                if in_group:
                    raise self.fail("nested parentheses are not in Megatron's layout grammar")
                out.append(self.group())
                continue
            if ch == "*":
                raise self.fail("'*N' must follow a symbol or a parenthesised group")
            if ch not in SYMBOLS:
                known = ", ".join(f"{s} {what}" for s, what in SYMBOLS.items())
                raise self.fail(f"not a layout symbol (expected {known}, (...)*N or X*N)")
            self.pos += 1
            n = self.repeat()
            out.append(self.grow(ch * (1 if n is None else n)))
        return "".join(out)

    def group(self) -> str:
        self.pos += 1  # the '('
        body = self.symbols(in_group=True)
        if self.peek() != ")":
            raise self.fail("'(' without a matching ')'")
        if not body:
            raise self.fail("an empty group '()'")
        self.pos += 1
        n = self.repeat()
        if n is None:
            raise self.fail("a parenthesised group must be followed by '*N'")
        return self.grow(body * n)


@lru_cache(maxsize=256)
def parse_layout(text: str) -> PipelineLayout:
    """The layout a string describes (module doc); `LayoutError` names the first
    character that breaks the grammar."""
    text = text.strip()
    if not text:
        raise LayoutError("an empty layout (leave the cell empty for Megatron's default split)")
    parser = _Parser(text)
    expanded = parser.symbols(in_group=False)
    return PipelineLayout(text, tuple(expanded.split("|")))


def check_layout(layout: PipelineLayout, pipeline_stages: int, num_layers: int, mtp_num_layers: int) -> int:
    """The virtual pipeline size v the layout implies; `StrategyError` when it does not
    fit the model or the pipeline (Megatron-Core's rules, and MTP layers only beside
    the loss: paraplan prices them with the output layer)."""
    stages = layout.stages
    n, p = len(stages), pipeline_stages
    where = f"{COLUMN} '{layout.text}'"
    if n % p:
        raise StrategyError(f"{where} has {n} virtual stages, not a multiple of pipeline_model_parallel_size {p}")
    flat = "".join(stages)
    for symbol, what in (("E", "the embedding"), ("L", "the loss")):
        if flat.count(symbol) != 1:
            raise StrategyError(f"{where} names {what} ('{symbol}') {flat.count(symbol)} times; expected once")
    if not stages[0].startswith("E"):
        raise StrategyError(f"{where}: the embedding 'E' must open the first virtual stage (Megatron builds it "
                            "on the first model chunk of the first pipeline rank)")
    if not stages[-1].endswith("L"):
        raise StrategyError(f"{where}: the loss 'L' must close the last virtual stage (Megatron builds the output "
                            "layer and loss on the last model chunk of the last pipeline rank)")
    if flat.count("t") != num_layers:
        raise StrategyError(f"{where} holds {flat.count('t')} transformer layers ('t'); the model has {num_layers}")
    if flat.count("m") != mtp_num_layers:
        raise StrategyError(f"{where} holds {flat.count('m')} MTP layers ('m'); the model has mtp_num_layers "
                            f"{mtp_num_layers}")
    if "m" in flat and "t" in flat[flat.index("m"):]:
        raise StrategyError(f"{where}: every transformer layer 't' must come before the MTP layers 'm'")
    if "m" in flat and "m" not in stages[-1]:
        raise StrategyError(f"{where}: MTP layers on a virtual stage of their own (Megatron's standalone MTP) are "
                            "not modelled; paraplan prices them beside the output layer and loss, on the last "
                            "virtual stage")
    return n // p
