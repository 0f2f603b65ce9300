#!/usr/bin/env bash
# docs/cli.md lists every command's options as its --help prints them (the commands' option tables):
# fails, naming the command, when a block is missing or has drifted (scripts/cli_reference.py
# regenerates them).
# usage: cli_reference.sh MPIDDP SOURCE_DIR
set -euo pipefail
exec python3 "$2/scripts/cli_reference.py" "$1" "$2/docs/cli.md" --check
