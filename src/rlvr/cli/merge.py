"""`rlvr merge`: the command line of rlvr.checkpoint.merge."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rlvr.checkpoint.merge import merge_checkpoint


def run_merge(args: argparse.Namespace) -> int:
    try:
        out = merge_checkpoint(Path(args.checkpoint), args.out, args.base)
    except FileExistsError as exc:
        print(f"rlvr merge: {exc}", file=sys.stderr)
        return 2
    print(f"merged model: {out}")
    return 0
