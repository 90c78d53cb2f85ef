#!/usr/bin/env python3
"""The module dependency graph of src/, from the #include "..." lines.

A module is a .c file and the .h of the same base name (src/util.c and
src/util.h), NAME_int.h is the private header of module NAME (what its
files share), and a header with no .c of its name (src/compat.h) is a
module of its own.  Module A depends on module B when a file of A includes
a file of B.  src/idempotency.c (_PG_init, which calls each module's init)
has no header: it must be a leaf, on which no module depends.

    include_graph.py [--doc FILE] [SRCDIR]
                                         check: exit 1, printing each cycle
                                         (with the #include lines that make
                                         it), if the modules depend on each
                                         other in a circle or a module
                                         depends on _PG_init's; with --doc,
                                         also if FILE's table of layers
                                         (the one starting "| layer |") is
                                         not what --layers prints
    include_graph.py --layers [SRCDIR]   the modules in layers, as a Markdown
                                         table: a module depends only on
                                         modules of lower layers (a cycle's
                                         modules share one row, marked)

Only includes of files in SRCDIR count (PostgreSQL's headers do not).
"""

import difflib
import os
import re
import sys

# _PG_init's file, a leaf: no module may depend on it
ROOT_FILE = "idempotency.c"
ROOT_MODULE = "idempotency.c (_PG_init)"
# the first line of the table of layers in a document (--doc)
TABLE_HEAD = "| layer | modules (each depends only on modules of lower layers) |"

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


def module_of(name):
    if os.path.splitext(name)[0] == os.path.splitext(ROOT_FILE)[0]:
        return ROOT_MODULE
    stem = os.path.splitext(name)[0]
    # NAME_int.h: the private header of module NAME, shared by its files
    if name.endswith("_int.h"):
        return stem[:-len("_int")]
    return stem


def read_graph(srcdir):
    """{module: {dependency: [(file, line number, line), ...]}}"""
    files = sorted(f for f in os.listdir(srcdir) if f.endswith((".c", ".h")))
    present = set(files)
    graph = {module_of(f): {} for f in files}
    for f in files:
        src = module_of(f)
        with open(os.path.join(srcdir, f), encoding="utf-8", errors="replace") as fh:
            for no, line in enumerate(fh, 1):
                m = INCLUDE.match(line)
                if not m or m.group(1) not in present:
                    continue
                dst = module_of(m.group(1))
                if dst != src:
                    graph[src].setdefault(dst, []).append((f, no, line.strip()))
    return graph


def strongly_connected(graph):
    """Tarjan's algorithm, iteratively: the components, each a sorted list."""
    index, low, stack, on_stack, comps = {}, {}, [], set(), []
    counter = [0]
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter[0]
        counter[0] += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, it = work[-1]
            advanced = False
            for nxt in it:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter[0]
                    counter[0] += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                    advanced = True
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    n = stack.pop()
                    on_stack.discard(n)
                    comp.append(n)
                    if n == node:
                        break
                comps.append(sorted(comp))
    return comps


def shortest_cycle(graph, comp, start):
    """A shortest cycle through the module start of the component (BFS)."""
    members = set(comp)
    prev = {start: None}
    queue = [start]
    while queue:
        node = queue.pop(0)
        for nxt in sorted(graph[node]):
            if nxt not in members:
                continue
            if nxt == start:
                path = [node]
                while prev[path[-1]] is not None:
                    path.append(prev[path[-1]])
                return list(reversed(path)) + [start]
            if nxt not in prev:
                prev[nxt] = node
                queue.append(nxt)
    return [start]


def layers(graph, comps):
    """Layer of each component: 0 when it depends on nothing, else one more
    than its highest dependency."""
    comp_of = {m: i for i, c in enumerate(comps) for m in c}
    layer = {}

    def of(i):
        if i not in layer:
            deps = {comp_of[d] for m in comps[i] for d in graph[m]} - {i}
            layer[i] = 1 + max((of(d) for d in deps), default=-1)
        return layer[i]

    sys.setrecursionlimit(10000)
    for i in range(len(comps)):
        of(i)
    return layer


def layer_table(graph):
    """The Markdown table of layers, as a list of lines."""
    full = strongly_connected(graph)
    layer = layers(graph, full)
    out = [TABLE_HEAD, "| --- | --- |"]
    for lv in sorted(set(layer.values()), reverse=True):
        names = []
        for i in sorted(i for i in layer if layer[i] == lv):
            c = full[i]
            names.append(("cycle: " + " + ".join(c)) if len(c) > 1 else c[0])
        out.append(f"| {lv} | {', '.join(sorted(names))} |")
    return out


def doc_table(path):
    """The table of layers in the document path: its lines, or None."""
    with open(path, encoding="utf-8") as fh:
        lines = fh.read().split("\n")
    if TABLE_HEAD not in lines:
        return None
    i = lines.index(TABLE_HEAD)
    j = i
    while j < len(lines) and lines[j].startswith("|"):
        j += 1
    return lines[i:j]


def main(argv):
    show_layers, doc, args = False, None, []
    it = iter(argv)
    try:
        for a in it:
            if a == "--layers":
                show_layers = True
            elif a == "--doc":
                doc = next(it)
            elif a.startswith("-") or args:
                raise ValueError(a)
            else:
                args.append(a)
    except (StopIteration, ValueError):
        sys.stderr.write(__doc__)
        return 2
    srcdir = args[0] if args else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src")
    srcdir = os.path.normpath(srcdir)
    graph = read_graph(srcdir)
    checked = graph
    comps = strongly_connected(checked)
    cycles = [c for c in comps if len(c) > 1]

    if show_layers:
        print("\n".join(layer_table(graph)))
        return 0

    failed = False
    # _PG_init's file is a leaf: a module that includes a file of its
    # (a header of its name) depends on the entry point
    up = [(m, f, no, line) for m, deps in sorted(checked.items())
          for d, where in deps.items() if d == ROOT_MODULE for f, no, line in where]
    if up:
        failed = True
        print(f"include graph of {srcdir}: {ROOT_FILE} (_PG_init) is not a leaf; these depend on it:")
        for m, f, no, line in up:
            print(f"  {m} -> {ROOT_MODULE}: src/{f}:{no}: {line}")
    if doc is not None:
        want = layer_table(graph)
        have = doc_table(doc)
        if have != want:
            failed = True
            print(f"{doc}: its table of layers is not the include graph's "
                  f"(make include-graph prints it; replace the table with that):")
            if have is None:
                print(f"  no line {TABLE_HEAD!r}")
            else:
                for line in difflib.unified_diff(have, want, doc, "make include-graph", lineterm=""):
                    print("  " + line)
        else:
            print(f"{doc}: its table of layers is the include graph's")

    modules = len(checked)
    edges = sum(len(d) for d in checked.values())
    if not cycles:
        print(f"include graph of {srcdir}: {modules} modules, {edges} dependencies, no cycle")
        return 1 if failed else 0
    print(f"include graph of {srcdir}: {modules} modules, {edges} dependencies, "
          f"{len(cycles)} circle(s) of modules that depend on each other:")
    for c in cycles:
        if len(c) > 2:
            print(f"  {len(c)} modules in one circle: {', '.join(c)}; the shortest cycle through each:")
        seen = set()
        for start in c:
            path = shortest_cycle(checked, c, start)
            # the same cycle from another start
            ring = path[:-1]
            key = min(tuple(ring[i:] + ring[:i]) for i in range(len(ring)))
            if key in seen:
                continue
            seen.add(key)
            print(f"  cycle: {' -> '.join(path)}")
            for a, b in zip(path, path[1:]):
                for f, no, line in checked[a][b]:
                    print(f"    {a} -> {b}: src/{f}:{no}: {line}")
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
