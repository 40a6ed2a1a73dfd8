"""Side-by-side benchmarks of rlvr against TRL's GRPOTrainer (``python -m benchmarks.step``).

Not part of the rlvr package: TRL lives only in the benchmark's own virtualenv.
"""
