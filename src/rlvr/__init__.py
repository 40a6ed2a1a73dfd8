"""rlvr: reinforcement-learning fine-tuning of language models with verifiable rewards."""

__version__ = "0.1.0"
