"""Command-line front ends: `rlvr train | eval | data | preflight | report | merge | doctor |
rollout-server` (argparse only; the work is done by the packages they call)."""
