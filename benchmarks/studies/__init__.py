"""One-off studies: A/B runs and same-batch comparisons against TRL, each its own entry
(`python -m benchmarks.studies.NAME`). Their results are in benchmarks/results/NOTEBOOK.md."""
