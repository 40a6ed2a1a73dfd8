"""Name registries: what is registered, lookups, errors listing the known names."""

import pytest
import torch

from rlvr.algorithms import (
    advantage_names,
    gae_advantages,
    get_advantage,
    get_loss,
    group_advantages,
    loss_names,
    maxent_listwise_loss,
    policy_loss,
)
from rlvr.algorithms.registry import Registry


def test_builtin_names():
    assert advantage_names() == ("drgrpo", "gae", "grpo", "psgrpo_steps", "rloo")
    assert loss_names() == ("maxent_clip", "maxent_listwise", "ppo_clip", "value_clip")
    assert get_advantage("gae") is gae_advantages
    assert get_loss("ppo_clip") is policy_loss
    assert get_loss("maxent_listwise") is maxent_listwise_loss


@pytest.mark.parametrize("name", ["grpo", "drgrpo", "rloo"])
def test_group_estimators_by_name_match_group_advantages(name):
    r = torch.tensor([[1.0, 0.0, 0.0, 1.0], [2.0, 0.0, 1.0, 1.0]])
    torch.testing.assert_close(get_advantage(name)(r, 4), group_advantages(r, 4, name))


def test_unknown_names_list_the_known_ones():
    with pytest.raises(KeyError, match="unknown advantage estimator 'ppo'; known: drgrpo, gae"):
        get_advantage("ppo")
    with pytest.raises(KeyError, match="known: maxent_clip, maxent_listwise, ppo_clip"):
        get_loss("dpo")


def test_register_and_duplicate_names():
    reg = Registry("thing")

    @reg.register("a")
    def a() -> int:
        return 1

    assert reg.get("a") is a and reg.names() == ("a",)
    reg.register("a")(a)  # re-registering the same function is harmless (module reloads)
    with pytest.raises(ValueError, match="thing 'a' is already registered"):
        reg.register("a")(lambda: 2)
    with pytest.raises(ValueError, match="non-empty string"):
        reg.register("")
