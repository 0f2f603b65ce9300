#!/usr/bin/env python3
"""docs/cli.md's option lists, generated from `mpiddp <command> --help` (the commands' option tables).

usage: scripts/cli_reference.py MPIDDP DOC          rewrite DOC's generated blocks from MPIDDP's --help
       scripts/cli_reference.py MPIDDP DOC --check  exit 1, naming the command, where DOC has drifted

A generated block is the text between `<!-- mpiddp COMMAND --help -->` and `<!-- end -->`; every
command `mpiddp --help` lists must have one. The check compares the text without its white space, so that
another Boost version's line wrapping is not drift.
"""
import os
import re
import subprocess
import sys

BLOCK = re.compile(r"(<!-- mpiddp (\S+) --help -->\n)(.*?)(<!-- end -->)", re.S)


def help_text(mpiddp, *args):
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    run = subprocess.run([mpiddp, *args, "--help"], capture_output=True, text=True, env=env, check=False)
    if run.returncode != 0:
        sys.exit(f"cli_reference: `mpiddp {' '.join(args)} --help` exited {run.returncode}: {run.stderr.strip()}")
    return run.stdout.rstrip() + "\n"


def commands(mpiddp):
    listing = help_text(mpiddp).split("commands:\n", 1)[1]
    return [line.split()[0] for line in listing.splitlines() if line.startswith("  ") and line.strip()]


def folded(text):
    # Without any white space: Boost breaks long words where its line ends, which moves with its version.
    return "".join(text.split())


def main():
    if len(sys.argv) not in (3, 4) or (len(sys.argv) == 4 and sys.argv[3] != "--check"):
        sys.exit(__doc__)
    mpiddp, doc, check = sys.argv[1], sys.argv[2], len(sys.argv) == 4
    text = open(doc, encoding="utf-8").read()
    documented = {m.group(2) for m in BLOCK.finditer(text)}
    missing = [c for c in commands(mpiddp) if c not in documented]
    drifted = []

    def regenerate(m):
        block = "```text\n" + help_text(mpiddp, m.group(2)) + "```\n"
        if folded(block) != folded(m.group(3)):
            drifted.append(m.group(2))
        return m.group(1) + block + m.group(4)

    new = BLOCK.sub(regenerate, text)
    if check:
        for c in missing:
            print(f"{doc}: no generated block for `mpiddp {c} --help`")
        for c in drifted:
            print(f"{doc}: `mpiddp {c} --help` differs from its block (rerun scripts/cli_reference.py {mpiddp} {doc})")
        sys.exit(1 if missing or drifted else 0)
    if missing:
        sys.exit(f"cli_reference: add a block for: {', '.join(missing)}")
    open(doc, "w", encoding="utf-8").write(new)
    print(f"{doc}: {len(documented)} blocks, {len(drifted)} rewritten")


if __name__ == "__main__":
    main()
