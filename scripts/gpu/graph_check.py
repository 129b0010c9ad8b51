"""The autograd graph the shim recorded, against the one PyTorch's Python API walks.

    python3 graph_check.py GPUSHIM TRACE PYTHON_GRAPH.jsonl MODEL [COSTS_FILE]

TRACE is a run of scripts/gpu/fit_truth.py under the shim with FIT_GRAPH=PYTHON_GRAPH.jsonl
(the second step's graph, walked in Python from the loss before its backward). The shim walks
from the first node of a backward pass that allocates, so its nodes are those of Python's below
that node: for each, its class and every input's source (a node and which of its outputs, a
parameter, or none) must be the same. Prints one row of the table (header with --header).
"""
import json
import subprocess
import sys

FROM_NODE, FROM_LEAF, FROM_NONE = 0, 1, 2
SHIFT = 40


def walks(gpushim, trace):
    """The whole walks of the trace: each a dict seq -> (class, [source]), with the walk's
    outcome."""
    out = subprocess.run([gpushim, "events", "--json", trace], capture_output=True, text=True,
                         check=True).stdout
    found, nodes, current = [], {}, None
    for line in out.splitlines():
        r = json.loads(line)
        kind = r["kind"]
        if not kind.startswith("graph"):
            continue
        ptr = int(r["ptr"], 16) if isinstance(r["ptr"], str) else r["ptr"]
        size = int(r["size"], 16) if isinstance(r["size"], str) else r["size"]
        if kind == "graph_node":
            current = ptr
            nodes[ptr] = (r["text"], [])
        elif kind == "graph_edge":
            seq, index = ptr & ((1 << SHIFT) - 1), ptr >> SHIFT
            if r["status"] == FROM_NODE:
                src = ("node", size & ((1 << SHIFT) - 1), size >> SHIFT)
            elif r["status"] == FROM_LEAF:
                src = ("leaf",)
            else:
                src = ("none",)
            nodes.setdefault(seq, ("?", []))[1].append((index, src))
        else:
            found.append((r["status"], nodes))
            nodes = {}
    return found


def python_graph(path):
    g = {}
    for line in open(path):
        n = json.loads(line)
        srcs = []
        for e in n["next"]:
            if e is None:
                srcs.append(("none",))
            elif "leaf" in e:
                srcs.append(("leaf",))
            else:
                srcs.append(("node", e["seq"], e["nr"]))
        g[n["seq"]] = (n["name"], srcs)
    return g


def main():
    if sys.argv[1:] == ["--header"]:
        print(f"{'model':<14} {'python':>7} {'shim':>6} {'above':>6} {'class':>6} {'inputs':>7} "
              f"{'walks':>6} {'walk ms':>8}")
        return
    gpushim, trace, pyg, model = sys.argv[1:5]
    py = python_graph(pyg)
    best = None
    for status, nodes in walks(gpushim, trace):
        common = len(set(nodes) & set(py))
        if best is None or common > best[0]:
            best = (common, status, nodes)
    n_walks = len(walks(gpushim, trace))
    if best is None:
        print(f"{model:<14} {len(py):>7} {'-':>6} no walk in the trace")
        return
    _, status, shim = best
    class_wrong = inputs_wrong = 0
    for seq, (cls, srcs) in shim.items():
        want = py.get(seq)
        if want is None or want[0] != cls:
            class_wrong += 1
            continue
        got = [s for _, s in sorted(srcs)]
        if got != want[1]:
            inputs_wrong += 1
    # Python's nodes the shim's walk did not reach: those above its first node (the loss's).
    above = len(set(py) - set(shim))
    ms = "-"
    if len(sys.argv) > 5:
        for line in open(sys.argv[5]):
            if "graph walks" in line:
                parts = line.split()
                # "  of which graph walks  CALLS  TOTAL_MS  MEAN_NS"
                ms = f"{float(parts[-2]) / max(1, int(parts[-3])):.2f}"
    print(f"{model:<14} {len(py):>7} {len(shim):>6} {above:>6} {class_wrong:>6} {inputs_wrong:>7} "
          f"{n_walks:>6} {ms:>8}")


if __name__ == "__main__":
    main()
