"""Fails when modules inside a package import each other in a cycle.

A cycle makes the import order decide which module sees the other half-initialised, and
it means neither module can be read or tested without the other. The check covers every
import, including those inside functions (a lazy import still ties the modules together).

    python tools/check_import_cycles.py [package ...]     (default: engine kernels)

Prints each cycle as a chain of modules and exits 1 if there is any.
"""

from __future__ import annotations

import sys

import grimp

DEFAULT_PACKAGES = ("engine", "kernels")


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of `graph` (Tarjan's algorithm), iteratively."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                components.append(sorted(component))
    return components


def import_cycles(packages: list[str]) -> list[list[str]]:
    """One cycle (a closed chain of modules, first == last) per group of modules that
    import each other, directly or through others of the group."""
    g = grimp.build_graph(*packages, cache_dir=None)
    inside = {m for m in g.modules if m.split(".")[0] in packages}
    graph = {m: g.find_modules_directly_imported_by(m) & inside for m in inside}
    cycles = []
    for component in strongly_connected(graph):
        if len(component) == 1 and component[0] not in graph[component[0]]:
            continue
        first = component[0]
        # a member that imports `first` directly closes the shortest way round through it
        last = next(m for m in component if first in graph[m])
        if last == first:
            cycles.append([first, first])
            continue
        chain = g.find_shortest_chain(importer=first, imported=last)
        cycles.append([*(chain or (first, last)), first])
    return cycles


def main(argv: list[str]) -> int:
    packages = argv or list(DEFAULT_PACKAGES)
    cycles = import_cycles(packages)
    for cycle in cycles:
        print("import cycle: " + " -> ".join(cycle))
    if cycles:
        print(f"{len(cycles)} import cycle(s) in {', '.join(packages)}")
        return 1
    print(f"no import cycles in {', '.join(packages)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
