"""Run one benchmark command in this checkout and in a `git worktree` of another commit, interleaved, and print
the medians of the figures it reports and their ratios (this tree / the other).

    python experiments/bench/against.py --ref 7ebad05 --runs 5 --figure 'lumina\\s+([0-9.]+) ms' -- \\
        python experiments/bench/moe.py --threads 2 --repeats 3

The command runs from the root of each checkout with PYTHONPATH pointing at it (so each imports its own
`lumina` and its own bench scripts; with --script-here both run this checkout's scripts, the other's
`lumina`); runs alternate (this tree, the other, this tree, ...) so machine load
hits both alike. --figure: a regular expression whose group 1 is the number to compare (repeatable; each
is read from the run's stdout, the last match counts). The worktree is made under --worktree (kept)."""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def worktree(ref: str, path: Path) -> Path:
    """A git worktree of `ref` at `path` (made if missing)."""
    if not path.exists():
        subprocess.run(["git", "worktree", "add", "--detach", str(path), ref], cwd=REPO, check=True,
                       capture_output=True)
    return path


def figures(root: Path, command: list[str], patterns: list[str], timeout_s: float, cwd: Path) -> list[float]:
    env = {**os.environ, "PYTHONPATH": str(root)}
    result = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout_s)
    if result.returncode:
        raise RuntimeError(f"{command} in {root} failed ({result.returncode}): {result.stderr[-2000:]}")
    found = []
    for pattern in patterns:
        matches = re.findall(pattern, result.stdout)
        if not matches:
            raise RuntimeError(f"--figure {pattern!r}: no match in {root}'s output:\n{result.stdout[-2000:]}")
        found.append(float(matches[-1]))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ref", required=True, help="the other commit")
    parser.add_argument("--worktree", type=Path, default=None, help="where its worktree lives")
    parser.add_argument("--runs", type=int, default=5, help="runs in each checkout")
    parser.add_argument("--figure", action="append", required=True, help="regex, group 1 = a number")
    parser.add_argument("--timeout-s", type=float, default=1800)
    parser.add_argument("--script-here", action="store_true", help="run this checkout's scripts for both")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    other = worktree(args.ref, args.worktree or REPO.parent / f"{REPO.name}-{args.ref}")
    runs: dict[str, list[list[float]]] = {"this": [], args.ref: []}
    for i in range(args.runs):
        for name, root in (("this", REPO), (args.ref, other)):
            cwd = REPO if args.script_here else root
            runs[name].append(figures(root, command, args.figure, args.timeout_s, cwd))
            print(f"run {i + 1} {name}: {runs[name][-1]}", flush=True, file=sys.stderr)
    print(f"{' '.join(command)} (medians of {args.runs} interleaved runs each)")
    for k, pattern in enumerate(args.figure):
        mine = statistics.median(r[k] for r in runs["this"])
        theirs = statistics.median(r[k] for r in runs[args.ref])
        print(f"  {pattern}: this {mine:.4g}, {args.ref} {theirs:.4g}, ratio {mine / theirs:.3f}")


if __name__ == "__main__":
    main()
