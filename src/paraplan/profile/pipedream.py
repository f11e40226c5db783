"""PipeDream "TorchGraph" text profiles (as used by DAPPLE/HPGO), in and out.

Node line: ``nodeK -- <description> -- forward_compute_time=F, backward_compute_time=B,
activation_size=A, parameter_size=P`` (optionally ``-- stage_id=s``); F and B in ms at the
profile batch size, A the output activation bytes (a list ``[a; b]`` is summed), P the
parameter bytes. Edge line (indented): ``nodeA -- nodeB``. Nodes come in any order.

Import rules:
- layers are the nodes in topological order (Kahn's algorithm, smallest node id first);
- nodes described as ``Input...`` (data sources) are dropped with their edges;
- ``__getitem__`` nodes (tuple selectors, cost 0) are dropped; an edge through one is
  replaced by a direct edge that carries the selected item's bytes;
- a layer's ``activation_bytes`` is the activation crossing the cut right after it: the
  sum over all edges (u, v) with u at or before the layer and v after it, each edge
  carrying u's output bytes (docs/design.md). For a chain this is the layer's own output.
  The last layer's value is its own output (nothing follows it). Each layer's own
  output bytes are kept in the meta as `output_bytes` (for activation memory).

Values are checked against the profile CSV's `paraplan.profile.io.LAYER_RULES` (a list
by its sum), so an imported profile is one `read_profile` would accept.
"""

from __future__ import annotations

import heapq
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal, localcontext
from pathlib import Path

import numpy as np

from paraplan.core import InputFileError, LayerProfile, ModelProfile
from paraplan.files import write_text
from paraplan.inputs import NumberRule, check_number, parse_number, read_text
from paraplan.profile.io import BATCH_SIZE_RULE, LAYER_RULES, check_layer_name

_FIELDS = ("forward_compute_time", "backward_compute_time", "activation_size", "parameter_size")
_NODE_ID = re.compile(r"^node([0-9]{1,18})$")
_PBS = re.compile(r"-pbs-([0-9]{1,9})\b")
# Field -> the rule its value (ms for times) must satisfy, once converted to the CSV's unit.
_RULES = {
    "forward_compute_time": LAYER_RULES["fwd_s"],
    "backward_compute_time": LAYER_RULES["bwd_s"],
    "activation_size": LAYER_RULES["activation_bytes"],
    "parameter_size": LAYER_RULES["param_bytes"],
}
_MS = NumberRule("a time in milliseconds", 0, LAYER_RULES["fwd_s"].high * 1e3, why=LAYER_RULES["fwd_s"].why)


@dataclass(frozen=True)
class GraphNode:
    node_id: int
    description: str
    fwd_s: float
    bwd_s: float
    activation_bytes: float
    param_bytes: float
    line: int


@dataclass(frozen=True)
class TorchGraph:
    """The parsed file: nodes by id and edges (src, dst) with the line they came from."""

    nodes: dict[int, GraphNode]
    edges: tuple[tuple[int, int, int], ...]  # (src, dst, line)


def batch_size_from_name(path: str | Path) -> int | None:
    """`resnet50-pbs-32.txt` -> 32 (DAPPLE's naming); None when the name has no `-pbs-N`."""
    found = _PBS.search(Path(path).name)
    return int(found.group(1)) if found else None


def _node_id(path: Path, line: int, text: str) -> int:
    found = _NODE_ID.match(text.strip())
    if not found:
        raise InputFileError(path, f"expected a node name like 'node12', got '{text.strip()}'", line)
    return int(found.group(1))


def ms_to_s(text: str) -> float:
    """Milliseconds text -> seconds, correctly rounded (so the exporter can write times
    that read back exactly)."""
    with localcontext() as ctx:
        ctx.prec = 80
        return float(Decimal(text) / 1000)


def _bytes(path: Path, line: int, key: str, text: str) -> float:
    """A byte count, or a list `[a; b]` of them summed; both checked against the rule."""
    field = f"key '{key}'"
    text = text.strip()
    if not text.startswith("["):
        return float(parse_number(path, line, field, text, _RULES[key]))
    if not text.endswith("]"):
        raise InputFileError(path, f"unterminated list '{text[:40]}'", line, field=field)
    parts = [p for p in text[1:-1].split(";") if p.strip()]
    if not parts:
        raise InputFileError(path, "empty list", line, field=field)
    total = math.fsum(float(parse_number(path, line, field, p, _RULES[key])) for p in parts)
    return check_number(path, line, f"{field} (sum of the list)", total, _RULES[key])


def _time_s(path: Path, line: int, key: str, text: str) -> float:
    """Milliseconds text -> seconds (correctly rounded), checked against the rule."""
    parse_number(path, line, f"key '{key}'", text, _MS)
    return check_number(path, line, f"key '{key}'", ms_to_s(text.strip()), _RULES[key])


def _parse_node(path: Path, line: int, text: str) -> GraphNode:
    parts = text.strip().split(" -- ")
    attr_index = next((i for i, p in enumerate(parts) if p.lstrip().startswith(_FIELDS[0])), None)
    if attr_index is None or attr_index < 2:
        raise InputFileError(
            path, "expected 'nodeK -- <description> -- forward_compute_time=..., backward_compute_time=..., "
            "activation_size=..., parameter_size=...'", line,
        )
    node_id = _node_id(path, line, parts[0])
    description = check_layer_name(path, line, "description", " -- ".join(parts[1:attr_index]).strip())
    attrs: dict[str, str] = {}
    for item in parts[attr_index].split(","):
        if not item.strip():
            continue
        key, sep, value = item.partition("=")
        if not sep:
            raise InputFileError(path, f"expected key=value, got '{item.strip()}'", line)
        attrs[key.strip()] = value
    for key in _FIELDS:
        if key not in attrs:
            raise InputFileError(path, f"missing field '{key}'", line)
    return GraphNode(
        node_id=node_id,
        description=description,
        fwd_s=_time_s(path, line, _FIELDS[0], attrs[_FIELDS[0]]),
        bwd_s=_time_s(path, line, _FIELDS[1], attrs[_FIELDS[1]]),
        activation_bytes=_bytes(path, line, _FIELDS[2], attrs[_FIELDS[2]]),
        param_bytes=_bytes(path, line, _FIELDS[3], attrs[_FIELDS[3]]),
        line=line,
    )


def parse_torchgraph(text: str, path: str | Path = "<text>") -> TorchGraph:
    """Parse the text; every malformed line is an `InputFileError` naming path and line."""
    path = Path(path)
    nodes: dict[int, GraphNode] = {}
    edges: list[tuple[int, int, int]] = []
    for line_no, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        if raw[0].isspace():
            parts = raw.strip().split(" -- ")
            if len(parts) != 2:
                raise InputFileError(path, f"expected an edge 'nodeA -- nodeB', got '{raw.strip()}'", line_no)
            edges.append((_node_id(path, line_no, parts[0]), _node_id(path, line_no, parts[1]), line_no))
        else:
            node = _parse_node(path, line_no, raw)
            if node.node_id in nodes:
                raise InputFileError(
                    path, f"node{node.node_id} defined twice (first on line {nodes[node.node_id].line})", line_no
                )
            nodes[node.node_id] = node
    if not nodes:
        raise InputFileError(path, "no node lines")
    for src, dst, line_no in edges:
        for end in (src, dst):
            if end not in nodes:
                raise InputFileError(path, f"edge names node{end}, which is not defined", line_no)
        if src == dst:
            raise InputFileError(path, f"self-loop on node{src} (the graph must be acyclic)", line_no)
    return TorchGraph(nodes=nodes, edges=tuple(edges))


def topological_order(graph: TorchGraph, path: str | Path = "<text>") -> list[int]:
    """Kahn's algorithm, always taking the smallest ready node id; a cycle is an error
    naming the first edge line among the nodes left over."""
    indegree = dict.fromkeys(graph.nodes, 0)
    succ: dict[int, list[int]] = {n: [] for n in graph.nodes}
    for src, dst, _ in graph.edges:
        succ[src].append(dst)
        indegree[dst] += 1
    ready = [n for n, d in indegree.items() if d == 0]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        node = heapq.heappop(ready)
        order.append(node)
        for nxt in succ[node]:
            indegree[nxt] -= 1
            if indegree[nxt] == 0:
                heapq.heappush(ready, nxt)
    if len(order) != len(graph.nodes):
        left = {n for n, d in indegree.items() if d > 0}
        line = min(ln for src, dst, ln in graph.edges if src in left and dst in left)
        names = ", ".join(f"node{n}" for n in sorted(left)[:6])
        raise InputFileError(Path(path), f"the graph has a cycle (among {names})", line)
    return order


def _is_input(node: GraphNode) -> bool:
    return node.description.startswith("Input")


def _is_getitem(node: GraphNode) -> bool:
    return node.description.startswith("__getitem__")


def layer_edges(graph: TorchGraph) -> tuple[list[int], list[tuple[int, int, float]]]:
    """Kept node ids (topological order) and their edges (src, dst, bytes) after dropping
    Input nodes and bypassing `__getitem__` nodes."""
    order = topological_order(graph)
    preds: dict[int, list[int]] = {n: [] for n in graph.nodes}
    for src, dst, _ in graph.edges:
        preds[dst].append(src)

    # sources (node, bytes) feeding each node once getitems are bypassed
    feeds: dict[int, list[tuple[int, float]]] = {}
    for node_id in order:
        inflow: list[tuple[int, float]] = []
        for src in preds[node_id]:
            src_node = graph.nodes[src]
            if _is_input(src_node):
                continue
            if _is_getitem(src_node):
                inflow.extend((origin, src_node.activation_bytes) for origin, _ in feeds[src])
            else:
                inflow.append((src, src_node.activation_bytes))
        feeds[node_id] = inflow
    kept = [n for n in order if not _is_input(graph.nodes[n]) and not _is_getitem(graph.nodes[n])]
    edges = [(src, dst, nbytes) for dst in kept for src, nbytes in feeds[dst]]
    return kept, edges


def cut_activation_bytes(kept: Sequence[int], edges: Sequence[tuple[int, int, float]],
                         own_bytes: Sequence[float]) -> np.ndarray:
    """Bytes crossing the cut after each position: sum over edges (u, v) with
    pos(u) <= i < pos(v); the last position gets its own output bytes."""
    pos = {node: i for i, node in enumerate(kept)}
    n = len(kept)
    delta = np.zeros(n + 1)
    for src, dst, nbytes in edges:
        a, b = pos[src], pos[dst]
        if b <= a:  # cannot happen in a topological order; guard for hand-made input
            raise ValueError(f"edge node{src} -> node{dst} goes backwards")
        delta[a] += nbytes
        delta[b] -= nbytes
    crossing = np.cumsum(delta)[:n]
    crossing[n - 1] = own_bytes[n - 1]
    return crossing


def graph_to_profile(graph: TorchGraph, batch_size: int, name: str, path: str | Path = "<text>",
                     meta: dict | None = None) -> ModelProfile:
    topological_order(graph, path)  # raises a located error on a cycle
    kept, edges = layer_edges(graph)
    if not kept:
        raise InputFileError(Path(path), "no layers left after dropping Input and __getitem__ nodes")
    own = [graph.nodes[n].activation_bytes for n in kept]
    crossing = cut_activation_bytes(kept, edges, own)
    layers = tuple(
        LayerProfile(
            name=graph.nodes[n].description or f"node{n}",
            fwd_s=graph.nodes[n].fwd_s,
            bwd_s=graph.nodes[n].bwd_s,
            activation_bytes=float(crossing[i]),
            param_bytes=graph.nodes[n].param_bytes,
        )
        for i, n in enumerate(kept)
    )
    info = {"method": "pipedream-import", "source": str(path), "node_ids": [int(n) for n in kept],
            "output_bytes": [float(b) for b in own]}  # each layer's own output (activation_bytes: the cut)
    info.update(meta or {})
    return ModelProfile(name=name, batch_size=batch_size, layers=layers, meta=info)


def read_pipedream(path: str | Path, batch_size: int | None = None) -> ModelProfile:
    """Read a TorchGraph text file as a chain of layers (see the module docstring).

    `batch_size` defaults to the `-pbs-N` in the file name."""
    path = Path(path)
    if batch_size is None:
        batch_size = batch_size_from_name(path)
        if batch_size is None:
            raise InputFileError(path, "no '-pbs-N' in the file name; give the batch size (--profile-batch-size)")
    parse_number(path, None, "batch size", str(batch_size), BATCH_SIZE_RULE)
    graph = parse_torchgraph(read_text(path, "a PipeDream TorchGraph text profile"), path)
    name = _PBS.split(path.stem)[0] or path.stem
    return graph_to_profile(graph, batch_size, name, path, {"device": "unknown", "dtype": "float32"})


def _ms_text(seconds: float) -> str:
    """Milliseconds text that reads back (`ms_to_s`) as exactly `seconds`."""
    if seconds == 0:
        return "0"
    guess = seconds * 1e3
    candidates = [guess]
    up = down = guess
    for _ in range(8):
        up, down = math.nextafter(up, math.inf), math.nextafter(down, -math.inf)
        candidates += [up, down]
    for value in candidates:
        if ms_to_s(repr(value)) == seconds:
            return repr(value)
    # the exact decimal of seconds x 1000 always reads back exactly
    return format(Decimal(seconds) * 1000, "f")


def _bytes_text(nbytes: float) -> str:
    return str(int(nbytes)) if float(nbytes).is_integer() else repr(float(nbytes))


def profile_to_torchgraph(profile: ModelProfile) -> str:
    """A chain of nodes node1..nodeN (no Input node); reading it back gives `profile`'s
    layer names, times, activation and parameter bytes exactly. Fixed times and FLOPs
    have no place in the format and are not written."""
    lines = []
    for i, la in enumerate(profile.layers, start=1):
        name = " ".join(la.name.split()) or f"layer{i - 1}"
        if name.startswith(("Input", "__getitem__")):
            name = f"layer {name}"
        lines.append(
            f"node{i} -- {name} -- forward_compute_time={_ms_text(la.fwd_s)}, "
            f"backward_compute_time={_ms_text(la.bwd_s)}, "
            f"activation_size={_bytes_text(la.activation_bytes)}, "
            f"parameter_size={_bytes_text(la.param_bytes)}"
        )
    lines += [f"\tnode{i} -- node{i + 1}" for i in range(1, profile.num_layers)]
    return "\n".join(lines) + "\n"


def write_pipedream(profile: ModelProfile, path: str | Path) -> Path:
    """Write `profile` as TorchGraph text (atomically). Name the file `<model>-pbs-<B>.txt`
    so that `read_pipedream` finds the batch size in it."""
    write_text(path, profile_to_torchgraph(profile))
    return Path(path)
