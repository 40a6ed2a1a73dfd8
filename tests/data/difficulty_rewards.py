"""A toy reward whose outcome each dataset row chooses (`difficulty_rewards:by_row`)."""

import hashlib


def coin(response: str) -> bool:
    """A fair coin decided by the response text: different responses flip independently."""
    return hashlib.sha256(response.encode("utf-8")).digest()[0] % 2 == 0


def by_row(prompt, response, reference, *, solve, **row):
    """Row field `solve`: "always" -> 1.0, "never" -> 0.0, "coin" -> `coin(response)`."""
    if solve == "always":
        return 1.0
    if solve == "never":
        return 0.0
    return 1.0 if coin(response) else 0.0
