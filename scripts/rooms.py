#!/usr/bin/env python3
"""The rooms of src/ (its folders) and the includes between them, which must form no cycle.

Room A -> room B when a file of src/A (.hpp, .cpp, .h) includes "B/..." or a public header that B
implements (<mpiddp/X.hpp>, by PUBLIC_HEADERS). common is the base every room may include; a room
that needs another's header is above it, and never also below it. A public header of plain data
(no function of its own) belongs to no room: a room that includes it depends on the rooms of the
public headers it includes.

usage: rooms.py [--root DIR] [--print | --check]
  --print  (the default) each edge, "A -> B  (N includes)"
  --check  exit 1 naming each cycle and the includes that close it; otherwise say the graph is acyclic
"""
import argparse
import re
import sys
from pathlib import Path

INCLUDE = re.compile(r'^\s*#\s*include\s+"([A-Za-z0-9_]+)/[^"]+"', re.M)
PUBLIC_INCLUDE = re.compile(r'^\s*#\s*include\s+<mpiddp/([A-Za-z0-9_/]+\.hpp)>', re.M)
SUFFIXES = {".hpp", ".cpp", ".h"}

# Each public header (include/mpiddp/) and the room that implements it; None: plain data, no room's.
# A header added there is added here (--check fails naming it until then).
PUBLIC_HEADERS = {
    "allocator.hpp": "runtime",
    "backends.hpp": "comm",
    "checkpoint.hpp": "models",
    "collective.hpp": "comm",
    "comm_options.hpp": "runtime",
    "compat.hpp": "common",
    "config.hpp": "common",  # made by CMake (build/include/mpiddp/)
    "data.hpp": "data",
    "ddp.hpp": "ddp",
    "diagnostics.hpp": "runtime",
    "error.hpp": "common",
    "flops.hpp": "log",
    "gpt.hpp": "models",
    "memory.hpp": "runtime",
    "memory_plan.hpp": "train",
    "model.hpp": "models",
    "models.hpp": "models",
    "optim.hpp": "optim",
    "precision.hpp": "optim",
    "process_group.hpp": "comm",
    "reduction.hpp": "ddp",
    "runtime.hpp": "runtime",
    "snapshot.hpp": "snapshot",
    "tensorboard.hpp": "log",
    "timeline.hpp": "ddp",
    "tokens.hpp": "data",
    "trainer.hpp": "train",
    "trainer_options.hpp": None,
    "units.hpp": "models",
    "zero.hpp": "zero",
}


def public_rooms(public):
    """{public header: the rooms a room including it depends on}: its own room, or for a header of
    plain data (None) the rooms of the public headers it includes, followed through plain ones."""
    includes = {}
    if public.is_dir():
        for path in public.glob("*.hpp"):
            text = path.read_text(encoding="utf-8", errors="replace")
            includes[path.name] = [m.group(1) for m in PUBLIC_INCLUDE.finditer(text)]

    def rooms_of(name, seen):
        if PUBLIC_HEADERS.get(name) is not None:
            return {PUBLIC_HEADERS[name]}
        found = set()
        for included in includes.get(name, []):
            if included not in seen:
                seen.add(included)
                found |= rooms_of(included, seen)
        return found

    return {name: rooms_of(name, {name}) for name in PUBLIC_HEADERS}


def room_graph(src):
    """{room: {room it includes: [(file, included path), ...]}} over src's folders, and the public
    headers PUBLIC_HEADERS does not know."""
    rooms = sorted(p.name for p in src.iterdir() if p.is_dir())
    graph = {room: {} for room in rooms}
    owners = public_rooms(src.parent / "include" / "mpiddp")
    unknown = set()
    for room in rooms:
        for path in sorted((src / room).rglob("*")):
            if path.suffix not in SUFFIXES or not path.is_file():
                continue
            text = path.read_text(encoding="utf-8", errors="replace")
            targets = [(m.group(1), m.group(0)) for m in INCLUDE.finditer(text)]
            for m in PUBLIC_INCLUDE.finditer(text):
                if m.group(1) not in PUBLIC_HEADERS:
                    unknown.add(m.group(1))
                targets += [(owner, m.group(0)) for owner in sorted(owners.get(m.group(1), ()))]
            for target, line in targets:
                if target != room and target in graph:
                    graph[room].setdefault(target, []).append((path.relative_to(src.parent).as_posix(), line.strip()))
    return graph, unknown


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
    graph, unknown = room_graph(src)
    public = args.root / "include" / "mpiddp"
    if public.is_dir():
        unknown |= {p.name for p in public.glob("*.hpp")} - set(PUBLIC_HEADERS)

    if args.check:
        found = cycles(graph)
        for name in sorted(unknown):
            print(f"rooms: include/mpiddp/{name} implemented by no room known: add it to PUBLIC_HEADERS", file=sys.stderr)
        if not found and not unknown:
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
