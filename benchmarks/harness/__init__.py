"""The benchmark harness: side workers (rlvr, TRL), the alternating runner, workloads, machine
figures, statistics and the report."""
