#!/usr/bin/env python3
"""The file-level call graph of one folder of libsift has no circle.

    check-call-graph.py NM ARCHIVE FOLDER

Reads the symbol tables of ARCHIVE's objects compiled from FOLDER/*.c
(meson names them FOLDER_FILE.c.o) with NM: file A calls file B when A
leaves undefined a function or object that B defines. Static functions are
not in the tables, so an edge is a call across files, which is what a
circle is made of (issue 18: engine.c <-> evict.c <-> pipeline.c was one).
Prints the graph; exits 1 naming every circle (the files and the symbols
on each edge), 2 when the archive has no object of FOLDER or the check's
own cycle finder fails on a known graph.
"""
import collections
import re
import subprocess
import sys

DEFINED = set("TDBRVW")  # global text, data, bss, read-only, weak


def graph_of(nm, archive, folder):
    """{file: {file it calls: [symbols]}} for FOLDER's objects in archive."""
    out = subprocess.run([nm, "-A", archive], capture_output=True, text=True, check=True).stdout
    member = re.compile(r"(?:^|[/:])" + re.escape(folder) + r"_([^/:]+)\.c\.o:")
    defined, undefined = collections.defaultdict(set), collections.defaultdict(set)
    for line in out.splitlines():
        m = member.search(line)
        fields = line[m.end():].split() if m else []
        if len(fields) < 2:
            continue
        name, kind, sym = m.group(1) + ".c", fields[-2], fields[-1]
        if kind == "U":
            undefined[name].add(sym)
        elif kind in DEFINED:
            defined[name].add(sym)
    owner = {sym: f for f, syms in defined.items() for sym in syms}
    graph = {}
    for f in set(defined) | set(undefined):
        calls = collections.defaultdict(list)
        for sym in sorted(undefined[f]):
            if sym in owner and owner[sym] != f:
                calls[owner[sym]].append(sym)
        graph[f] = dict(calls)
    return graph


def circles(graph):
    """The strongly connected components of more than one file (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, {}):
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
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def self_check():
    """The finder against graphs whose answer is known."""
    ring = {"a": {"b": []}, "b": {"c": []}, "c": {"a": []}, "d": {"a": []}}
    chain = {"a": {"b": []}, "b": {"c": []}, "c": {}, "d": {"a": [], "c": []}}
    return circles(ring) == [["a", "b", "c"]] and circles(chain) == []


def main(argv):
    if len(argv) != 4:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    nm, archive, folder = argv[1:]
    if not self_check():
        print("check-call-graph: the cycle finder fails its own known graphs", file=sys.stderr)
        return 2
    graph = graph_of(nm, archive, folder)
    if not graph:
        print(f"check-call-graph: {archive} has no object of {folder}/", file=sys.stderr)
        return 2
    for f in sorted(graph):
        print(f"{folder}/{f} -> {', '.join(sorted(graph[f])) or '(nothing)'}")
    bad = circles(graph)
    for comp in bad:
        print(f"circle between {', '.join(folder + '/' + f for f in comp)}:", file=sys.stderr)
        for f in comp:
            for g in sorted(graph[f]):
                if g in comp:
                    print(f"  {f} -> {g}: {', '.join(graph[f][g])}", file=sys.stderr)
    if bad:
        return 1
    print(f"no circle between the {len(graph)} files of {folder}/")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
