"""Environments of multi-turn episodes: the protocol, the built-in tools and games, the turn
renderer and the contained calls (docs/environments.md). The episodes themselves run in
rlvr.rollout.episodes."""

from rlvr.envs.base import Env, EnvError, Environment, ToolEnv, check_step
from rlvr.envs.registry import env_class, env_factory

__all__ = ["Env", "EnvError", "Environment", "ToolEnv", "check_step", "env_class", "env_factory"]
