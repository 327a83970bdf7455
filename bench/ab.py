#!/usr/bin/env python3
"""Side-by-side medians of sift's benches for two build trees.

    bench/ab.py --old ../pre/build --new build [--runs 5] [--only REGEX]
                [--list] [--markdown] [--log runs.json]

Each bench below (a `sift bench ...` command) runs --runs times per build,
the two builds alternating (old new, new old, old new, ...) so that a slow
minute of a shared machine falls on both; every figure the bench prints is
read from its output, and the table gives both medians, new / old, and how
much worse the new build is (by the figure's direction: a time is worse
when it grows, a rate when it falls). Figures marked `same` (densities,
checksums, errors) must agree between the builds: the table says where
they do not. Every run has SIFT_THREADS=1 and its own build's policy
plugins on SIFT_POLICY_PATH, runs in the build's source tree (the
parent of the build directory: configs/ of the commit measured), and records its wall and CPU seconds and the
1-minute load average when it started.

The bench list is the wave-1 set of docs/benchmarks.md (kernels, engine,
policies), sized to run in minutes on the 2-core build host; the exact
commands are printed by --list. It exits 1 when a figure is missing from an
output (the output's tail is printed) and 2 on bad arguments.
"""
import argparse
import glob
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import time

HIGHER, LOWER, SAME = "higher", "lower", "same"


class Fig:
    """One figure: the first match of `regex` after `anchor` in the output
    (its first group, a number); `scale` turns it into the unit shown."""

    def __init__(self, name, unit, better, regex, anchor=None, convert=float):
        self.name, self.unit, self.better = name, unit, better
        self.regex = re.compile(regex, re.M)
        self.anchor, self.convert = anchor, convert

    def read(self, out):
        start = 0
        if self.anchor is not None:
            start = out.find(self.anchor)
            if start < 0:
                return None
        m = self.regex.search(out, start)
        return None if m is None else self.convert(m.group(1))


def overhead(pct):
    """'+5.1' (engine over kernel, percent) -> engine / kernel time."""
    return 1.0 + float(pct) / 100.0


NUM = r"([-+]?[0-9.]+)"


def attention_figs():
    figs = [
        Fig("peak fp32 FMA (machine)", "GFLOP/s", HIGHER, r"^peak: fp32 FMA " + NUM),
        Fig("peak read (machine)", "GB/s", HIGHER, r"read " + NUM + r" GB/s"),
        Fig("prefill causal 4096, 32/8 x 128, f16", "GFLOP/s", HIGHER,
            r"^\s+4096\s+\S+\s+" + NUM + r"\s+\S+%$", anchor="\nprefill"),
    ]
    for tokens in (16384, 131072):
        for group in (4, 1):
            figs.append(Fig(f"decode {tokens // 1024}K group {group}", "KV GB/s", HIGHER,
                            rf"^\s+{tokens}\s+{group}\s+\S+\s+" + NUM + r"\s+\S+%$", anchor="\ndecode"))
    for what, tokens in (("decode", 16384), ("decode", 131072), ("prefill", 4096)):
        figs.append(Fig(f"paged (blocks of 128) {what} {tokens}", "ms", LOWER,
                        rf"^\s+{what}\s+{tokens}\s+\S+\s+" + NUM, anchor="\npaged"))
        figs.append(Fig(f"one call per block + merge, {what} {tokens}", "ms", LOWER,
                        rf"^\s+{what}\s+{tokens}\s+\S+\s+\S+\s+" + NUM, anchor="\npaged"))
    return figs


def pipeline_figs(tag, anchors):
    figs = []
    for label, anchor in anchors:
        for phase in ("prefill", "decode"):
            figs.append(Fig(f"{tag}{label}: {phase} efficiency", "wall/max", LOWER,
                            rf"^\s+{phase}\s+wall .* efficiency " + NUM, anchor=anchor))
            figs.append(Fig(f"{tag}{label}: {phase} wall", "s", LOWER,
                            rf"^\s+{phase}\s+wall\s+" + NUM + " s", anchor=anchor))
    return figs


def overhead_figs(tag, decode_at):
    figs = []
    for mode, anchor in (("zero-copy", " zero-copy"), ("copying", " copying")):
        rows = [("prefill 2048", r"prefill 2048 \(chunk \d+\)")] + \
               [(f"decode at {n}", rf"decode at {n}") for n in decode_at]
        for label, rx in rows:
            figs.append(Fig(f"{tag}{mode} {label}: engine / kernel", "ratio", LOWER,
                            rf"^\s+{rx}\s.*:\s+" + r"([-+][0-9.]+)%", anchor=anchor, convert=overhead))
    return figs


BENCHES = [
    # Kernels (issue 2): `sift bench attention --repeats 3`, one thread,
    # the 4096 prefill (16384 costs ~40 s a run on one thread).
    ("kernels", ["bench", "attention", "--threads", "1", "--repeats", "3", "--lengths", "4096",
                 "--decode-lengths", "16k,128k", "--blocks", "256"], attention_figs()),
    # Engine (issue 4): `sift bench offload`, its three sections.
    ("stores", ["bench", "offload", "--sections", "stores"], [
        Fig("host store load", "GiB/s", HIGHER, r"host store, copy worker\s+" + NUM),
        Fig("host store / memcpy", "%", HIGHER, r"host store, copy worker\s+\S+ GiB/s\s+" + NUM + "%"),
        Fig("file store (io_uring) / sequential read, cold", "%", HIGHER,
            r"file store, copy worker \S+\s+\S+ GiB/s\s+" + NUM + "%"),
    ]),
    ("pipeline", ["bench", "offload", "--sections", "pipeline"],
     pipeline_figs("", [("copied", "Pipeline efficiency"), ("in place", "Pipeline without copies")])),
    ("pipeline-8x2", ["bench", "offload", "--sections", "pipeline", "--q-heads", "8", "--kv-heads", "2",
                      "--head-dim", "128", "--rows", "4", "--steps", "16", "--decode-only"],
     [f for f in pipeline_figs("8/2 x 128, 4 rows, ", [("copied", "Pipeline efficiency")])
      if "decode" in f.name]),
    ("overhead", ["bench", "offload", "--sections", "overhead", "--reps", "5"],
     overhead_figs("4/1 x 64, ", (2048, 32768))),
    ("overhead-32x8", ["bench", "offload", "--sections", "overhead", "--reps", "5", "--q-heads", "32",
                       "--kv-heads", "8", "--head-dim", "128", "--decode-at", "2048,32768"],
     overhead_figs("32/8 x 128, ", (2048, 32768))),
    # Policies (issues 5-9).
    ("quest", ["bench", "policy", "quest", "--lengths", "32768", "--steps", "16"], [
        Fig("quest 32K: full decode", "ms/step", LOWER, r"^\s+32768 full\s+" + NUM),
        Fig("quest 32K: quest decode", "ms/step", LOWER, r"^\s+32768 quest\s+" + NUM),
        Fig("quest 32K: quest attention", "ms/step", LOWER, r"^\s+32768 quest\s+\S+\s+" + NUM),
        Fig("quest 32K: speedup over full", "x", HIGHER, r"^\s+32768 quest(?:\s+\S+){5}\s+" + NUM + "x"),
        Fig("quest 32K: bytes per step", "bytes", SAME, r"^\s+32768 quest(?:\s+\S+){3}\s+" + NUM),
    ]),
    ("minference", ["bench", "policy", "minference", "-n", "16384", "--heads", "4", "--dense-tiles", "4",
                    "--threads", "1", "--data", "synth"], [
        Fig("minference 16K: sparse (estimate included)", "CPU s", LOWER, r"^\s+16384\s+\S+\s+\S+\s+" + NUM),
        Fig("minference 16K: dense", "CPU s", LOWER, r"^\s+16384(?:\s+\S+){6}\s+" + NUM),
        Fig("minference 16K: speedup (CPU)", "x", HIGHER, r"^\s+16384(?:\s+\S+){10}\s+" + NUM + "x"),
        Fig("minference 16K: density", "", SAME, r"^\s+16384\s+" + NUM),
    ]),
    ("xattn_bsa", ["bench", "policy", "xattn_bsa", "--config", "configs/large.yaml", "--heads", "4",
                   "--paged", "--lengths", "16384", "--sample", "1"], [
        Fig("xattn_bsa 16K: xattn", "CPU s", LOWER, r"^\s+16384(?:\s+\S+){3}\s+" + NUM),
        Fig("xattn_bsa 16K: dense", "CPU s", LOWER, r"^\s+16384\s+\S+\s+" + NUM),
        Fig("xattn_bsa 16K: speedup vs dense", "x", HIGHER, r"^\s+16384(?:\s+\S+){5}\s+" + NUM + "x"),
        Fig("xattn_bsa 16K: density", "", SAME, r"^\s+16384\s+" + NUM),
        Fig("xattn_bsa 16K: rel. error", "", SAME, r"^\s+16384(?:\s+\S+){7}\s+" + NUM),
    ]),
    ("subquadratic", ["bench", "policy", "subquadratic", "--threads", "1", "--reps", "3", "--no-tiled",
                      "--lengths", "32768"], [
        Fig("subquadratic 8K: sparse", "CPU s", LOWER, r"^\s+sparse\s+\S+\s+" + NUM),
        Fig("subquadratic 8K: dense", "CPU s", LOWER, r"^\s+dense\s+\S+\s+" + NUM),
        Fig("subquadratic 8K: speedup (CPU)", "x", HIGHER, r"^\s+sparse(?:\s+\S+){3}\s+" + NUM + "x"),
        Fig("subquadratic 32K: sparse", "CPU s", LOWER, r"^\s+32768\s+\S+\s+\S+\s+" + NUM,
            anchor="Time per doubling"),
        Fig("subquadratic 8K: checksum", "", SAME, r"checksum " + NUM),
    ]),
    ("evict", ["bench", "evict", "--steps", "128"],
     [Fig("evict: unbounded", "ms/step", LOWER, r"^unbounded: " + NUM)] +
     [Fig(f"evict 1024 {g} {s}: decode", "ms/step", LOWER, rf"^1024\s+{g}\s+{re.escape(s)}(?:\s+\S+){{4}}\s+" + NUM)
      for g in ("token", "block") for s in ("sinks+window", "h2o")] +
     [Fig("evict 1024 token h2o: rel.err", "", SAME, r"^1024\s+token\s+h2o\s+" + NUM)]),
]


def policy_path(build):
    dirs = sorted(d for d in glob.glob(os.path.join(build, "policies", "*")) if os.path.isdir(d))
    return os.pathsep.join(os.path.abspath(d) for d in dirs)


def run_once(build, argv):
    # In the build's source tree: configs/ are read from the commit measured.
    cwd = os.path.dirname(os.path.abspath(build))
    env = dict(os.environ, SIFT_THREADS="1", SIFT_POLICY_PATH=policy_path(build))
    exe = os.path.join(os.path.abspath(build), "tools", "sift")
    load = os.getloadavg()[0]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    p = subprocess.run([exe] + argv, cwd=cwd, env=env, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True)
    wall = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return p.returncode, p.stdout, {"load": load, "wall": wall, "cpu": cpu}


def fmt(x):
    if x is None:
        return "—"
    if abs(x) >= 1e5:
        return f"{x:.0f}"
    return f"{x:.4g}"


def worse_by(fig, old, new):
    """How much worse new is than old, as a fraction (negative: better)."""
    if fig.better == SAME or not old or not new:
        return None
    return new / old - 1.0 if fig.better == LOWER else old / new - 1.0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--old", help="build tree of the old commit (has tools/sift)")
    ap.add_argument("--new", help="build tree of the new commit")
    ap.add_argument("--runs", type=int, default=5, help="runs per build and bench (default 5)")
    ap.add_argument("--only", help="benches whose id matches this regular expression")
    ap.add_argument("--threshold", type=float, default=3.0, help="flag figures worse by more than this %% (3)")
    ap.add_argument("--list", action="store_true", help="print the benches and their figures, run nothing")
    ap.add_argument("--markdown", action="store_true", help="the table as Markdown")
    ap.add_argument("--log", help="append every run's figures, wall, CPU and load to this JSON-lines file")
    a = ap.parse_args()
    benches = [b for b in BENCHES if a.only is None or re.search(a.only, b[0])]
    if a.list:
        for bid, argv, figs in benches:
            print(f"{bid}: sift {' '.join(argv)}")
            for f in figs:
                print(f"    {f.name} [{f.unit or '-'}] {f.better}")
        return 0
    if not a.old or not a.new or a.runs < 1 or not benches:
        ap.error("--old and --new are required, --runs >= 1, --only must match a bench")
    for b in (a.old, a.new):
        if not os.access(os.path.join(b, "tools", "sift"), os.X_OK):
            ap.error(f"{b}: no tools/sift in this build tree")
    log = open(a.log, "a") if a.log else None
    rows = []
    for bid, argv, figs in benches:
        vals = {"old": {f.name: [] for f in figs}, "new": {f.name: [] for f in figs}}
        meta = {"old": [], "new": []}
        for i in range(a.runs):
            for side in (("old", "new") if i % 2 == 0 else ("new", "old")):
                rc, out, m = run_once(a.old if side == "old" else a.new, argv)
                got = {f.name: f.read(out) for f in figs}
                missing = [n for n, v in got.items() if v is None]
                if rc != 0 or missing:
                    print(f"{bid} ({side}, run {i + 1}): exit {rc}, missing {missing or 'nothing'}; "
                          f"output ends:\n{out[-2000:]}", file=sys.stderr)
                    return 1
                for n, v in got.items():
                    vals[side][n].append(v)
                meta[side].append(m)
                print(f"# {bid} {side} run {i + 1}: wall {m['wall']:.1f} s, cpu {m['cpu']:.1f} s, "
                      f"load {m['load']:.2f}", file=sys.stderr, flush=True)
                if log:
                    log.write(json.dumps({"bench": bid, "side": side, "run": i + 1, "argv": argv,
                                          "figures": got, **m, "time": time.time()}) + "\n")
                    log.flush()
        loads = [m["load"] for s in meta for m in meta[s]]
        for f in figs:
            o, n = vals["old"][f.name], vals["new"][f.name]
            mo, mn = statistics.median(o), statistics.median(n)
            w = worse_by(f, mo, mn)
            if f.better == SAME:
                note = "same" if set(o) == set(n) and len(set(o)) == 1 else f"DIFFER old {sorted(set(o))} new {sorted(set(n))}"
            elif w is not None and w * 100 > a.threshold:
                note = f"WORSE by {w * 100:.1f}%"
            else:
                note = ""
            rows.append((bid, f, mo, mn, (mn / mo) if mo else None, w, len(o), min(loads), max(loads), note))
    if a.markdown:
        print("| bench | figure | unit | old median | new median | new / old | worse by | runs | load | note |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        for bid, f, mo, mn, r, w, k, l0, l1, note in rows:
            ws = "—" if w is None else f"{w * 100:+.1f}%"
            print(f"| {bid} | {f.name} | {f.unit} | {fmt(mo)} | {fmt(mn)} | {fmt(r)} | {ws} | {k} + {k} | "
                  f"{l0:.1f}-{l1:.1f} | {note} |")
    else:
        for bid, f, mo, mn, r, w, k, l0, l1, note in rows:
            ws = "" if w is None else f"{w * 100:+6.1f}%"
            print(f"{bid:13} {f.name:52} {f.unit:9} {fmt(mo):>10} {fmt(mn):>10} {fmt(r):>7} {ws:>8} "
                  f"n={k} load {l0:.1f}-{l1:.1f} {note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
