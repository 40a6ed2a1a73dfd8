"""User-style reward functions for end-to-end tests (named in config as `toy_rewards:NAME`)."""


def count_sevens(prompt, response, reference, **row):
    """Fraction of the response's characters that are '7': a task a random tiny model learns fast."""
    return response.count("7") / max(1, len(response))


def always_zero(prompt, response, reference, **row):
    return 0.0


def always_one(prompt, response, reference, **row):
    return 1.0


def toy_prm(prompt, steps):
    """A process reward model as a plain function: step k scores 1 / (k + 1)."""
    return [1.0 / (k + 1) for k in range(len(steps))]


def digit_fraction(prompt, response, reference, **row):
    """Fraction of the response's characters that are digits: rewards vary within every group of
    a random tiny model's replies, so every step has a gradient."""
    return sum(ch.isdigit() for ch in response) / max(1, len(response))


def varies_on_odd_answers(prompt, response, reference, **row):
    """0 for every reply to a prompt whose answer is even (an uninformative group); otherwise a
    checksum of the reply in [0, 1), which differs between the replies of a random model."""
    import zlib

    if int(float(reference)) % 2 == 0:
        return 0.0
    return zlib.crc32(response.encode()) % 1000 / 1000


def reply_checksum(prompt, response, reference, **row):
    """A checksum of the reply in [0, 1): different replies of a random model score differently,
    so every group has a gradient."""
    import zlib

    return zlib.crc32(response.encode()) % 1000 / 1000


def checksum_never_correct(prompt, response, reference, **row):
    """A score that differs between replies (a checksum in [0, 1)) from a verifier that calls
    every reply wrong: groups differ in score but never in accuracy."""
    import zlib

    from rlvr.rewards.base import RewardResult

    return RewardResult(zlib.crc32(response.encode()) % 1000 / 1000, {"correct": 0.0})


def prompt_length(prompt, response, reference, **row):
    """The prompt's length in characters: tells which prompt text a caller passed."""
    return float(len(prompt))
