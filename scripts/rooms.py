#!/usr/bin/env python3
"""The rooms of src/ (its folders) and the includes between them, which must form no cycle.

Room A -> room B when a file of src/A (.hpp, .cpp, .h) includes "B/...". common is the base every
room may include; a room that needs another's header is above it, and never also below it.

usage: rooms.py [--root DIR] [--print | --check]
  --print  (the default) each edge, "A -> B  (N includes)"
  --check  exit 1 naming each cycle and the includes that close it; otherwise say the graph is acyclic
"""
import argparse
import re
import sys
from pathlib import Path

INCLUDE = re.compile(r'^\s*#\s*include\s+"([A-Za-z0-9_]+)/[^"]+"', re.M)
SUFFIXES = {".hpp", ".cpp", ".h"}


def room_graph(src):
    """{room: {room it includes: [(file, included path), ...]}} over src's folders."""
    rooms = sorted(p.name for p in src.iterdir() if p.is_dir())
    graph = {room: {} for room in rooms}
    for room in rooms:
        for path in sorted((src / room).rglob("*")):
            if path.suffix not in SUFFIXES or not path.is_file():
                continue
            text = path.read_text(encoding="utf-8", errors="replace")
            for m in INCLUDE.finditer(text):
                target = m.group(1)
                if target != room and target in graph:
                    line = m.group(0).strip()
                    graph[room].setdefault(target, []).append((path.relative_to(src.parent).as_posix(), line))
    return graph


def cycles(graph):
    """The cycles, each once: the strongly connected components of more than one room (Tarjan), and
    within each one cycle through its rooms, from its first room in name order."""
    index, low, on_stack, stack, comps = {}, {}, set(), [], []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                comps.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)

    found = []
    for comp in sorted(comps):
        members = set(comp)
        start = comp[0]
        # The shortest path back to start inside the component (breadth first).
        prev, frontier, seen = {}, [start], {start}
        end = None
        while frontier and end is None:
            nxt = []
            for v in frontier:
                for w in sorted(graph[v]):
                    if w == start:
                        end = v
                        break
                    if w in members and w not in seen:
                        seen.add(w)
                        prev[w] = v
                        nxt.append(w)
                if end is not None:
                    break
            frontier = nxt
        path = [end]
        while path[-1] != start:
            path.append(prev[path[-1]])
        path.reverse()
        found.append((comp, path + [start]))
    return found


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default=Path(__file__).resolve().parent.parent, type=Path,
                        help="the source tree (default: this script's)")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--print", action="store_true", help="print the graph's edges (the default)")
    mode.add_argument("--check", action="store_true", help="exit 1 if the rooms include each other in a cycle")
    args = parser.parse_args()
    src = args.root / "src"
    if not src.is_dir():
        print(f"rooms: error: no src/ under '{args.root}'", file=sys.stderr)
        return 2
    graph = room_graph(src)

    if args.check:
        found = cycles(graph)
        if not found:
            edges = sum(len(targets) for targets in graph.values())
            print(f"rooms: {len(graph)} rooms, {edges} edges, no cycle")
            return 0
        for comp, path in found:
            print(f"rooms: cycle: {' -> '.join(path)} (the rooms that include each other: {', '.join(comp)})",
                  file=sys.stderr)
            for a, b in zip(path, path[1:]):
                for file, line in graph[a][b]:
                    print(f"  {a} -> {b}: {file}: {line}", file=sys.stderr)
        return 1

    for room in sorted(graph):
        for target in sorted(graph[room]):
            n = len(graph[room][target])
            print(f"{room} -> {target}  ({n} include{'s' if n != 1 else ''})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
