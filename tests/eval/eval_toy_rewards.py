"""Toy rewards for the eval tests (named in config as `eval_toy_rewards:NAME`)."""


def first_char_even(prompt, response, reference, **row):
    """1.0 when the response's first character has an even code point: about half of a random
    model's responses, so correctness is mixed and comparing it between two evaluations means
    something."""
    return 1.0 if response and ord(response[0]) % 2 == 0 else 0.0
