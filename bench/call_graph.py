#!/usr/bin/env python3
"""call_graph.py: the file-level call graph of some folders of the library, read from
the built objects with nm (a file calls another when it uses a symbol the other
defines), and its circles (strongly connected components of more than one file); and
the same for the #include "..." lines of the folder's sources, twice: file by file, and
unit by unit (x.c, x.h and x's private x_impl.h are one unit, so x.c including y.h and
y.c including x.h is a circle even though no header includes itself).

    bench/call_graph.py                      # src/comm, src/ddp, src/parallel, src/train
    bench/call_graph.py src/comm             # one folder (and its sub-folders)
    OBJ=/tmp/old/build/release/obj bench/call_graph.py src/comm

Prints, per folder: files, edges inside the folder, and every circle with its files,
for calls and for includes.
Exit code 0 either way (a measurement, not a gate).
"""
import os
import re
import subprocess
import sys

OBJ = os.environ.get("OBJ", "build/release/obj")


def symbols(path):
    out = subprocess.run(["nm", "-P", path], capture_output=True, text=True, check=True).stdout
    defined, used = set(), set()
    for line in out.splitlines():
        parts = line.split()
        if len(parts) < 2:
            continue
        name, kind = parts[0], parts[1]
        if kind == "U":
            used.add(name)
        elif kind in "TDBRVWGS" and not name.startswith("."):
            defined.add(name)
    return defined, used


def objects(folder):
    root = os.path.join(OBJ, folder)
    for dirpath, _, files in os.walk(root):
        for f in sorted(files):
            if f.endswith(".o"):
                yield os.path.join(dirpath, f)


def sccs(nodes, edges):
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in nodes:
        if v not in index:
            visit(v)
    return out


INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


def includes(folder):
    """{source: [included file inside the folder]}: a name resolves beside the including
    file first, then under src/ (the library's include path)."""
    srcs = []
    for dirpath, _, files in os.walk(folder):
        srcs += [os.path.join(dirpath, f) for f in sorted(files) if f.endswith((".c", ".h"))]
    known = {os.path.normpath(f) for f in srcs}
    out = {}
    for f in srcs:
        f = os.path.normpath(f)
        out[f] = []
        with open(f, encoding="utf-8", errors="replace") as fh:
            for line in fh:
                m = INCLUDE.match(line)
                if not m:
                    continue
                for cand in (os.path.join(os.path.dirname(f), m.group(1)),
                             os.path.join("src", m.group(1))):
                    cand = os.path.normpath(cand)
                    if os.path.exists(cand):
                        if cand in known and cand != f:
                            out[f].append(cand)
                        break
    return out


def report(what, nodes, edges):
    nedges = sum(len(v) for v in edges.values())
    circles = [c for c in sccs(sorted(nodes), edges) if len(c) > 1]
    print(f"  {what}: {len(nodes)} nodes, {nedges} edges, {len(circles)} circle(s)")
    for c in circles:
        print("    circle: " + ", ".join(c))


def main():
    folders = sys.argv[1:] or ["src/comm", "src/ddp", "src/parallel", "src/train"]
    for folder in folders:
        files = {}
        for o in objects(folder):
            rel = os.path.relpath(o, OBJ)[: -len(".o")] + ".c"
            files[rel] = symbols(o)
        owner = {}
        for f, (defined, _) in files.items():
            for s in defined:
                owner[s] = f
        edges = {}
        for f, (_, used) in files.items():
            edges[f] = sorted({owner[s] for s in used if s in owner and owner[s] != f})
        print(f"{folder}:")
        report("calls between files (objects)", files, edges)
        inc = includes(folder)
        report("includes between files", inc, {f: sorted(set(v)) for f, v in inc.items()})
        unit = lambda f: re.sub(r"_impl$", "", os.path.splitext(f)[0])
        units = {unit(f) for f in inc}
        uedges = {u: set() for u in units}
        for f, v in inc.items():
            uedges[unit(f)].update(unit(g) for g in v if unit(g) != unit(f))
        report("includes between units (x.c, x.h, x_impl.h)", units, {u: sorted(v) for u, v in uedges.items()})


if __name__ == "__main__":
    main()
