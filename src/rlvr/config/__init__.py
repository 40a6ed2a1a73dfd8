"""Typed run configuration: YAML file + dotted command-line overrides, checked before any model loads.

    cfg = load_config("run.yaml", ["algo.group_size=4", "train.lr=2e-6"])
    problems = validate.problems(cfg)  # contradictions among its own knobs, each named
    validate.check(cfg)                # raises ConfigError listing them
    # a run checks more (objectives, rewards, data paths): rlvr.training.preflight.checks

A leaf: importing this package loads pydantic and yaml, no other rlvr module. Sections are in
`sections` (plus `algo`, `eval`, `health`, `lora`, `reward`), reading in `loading`, the cross-knob checks
in `validate` (which reads the sections; they do not import it). Unknown keys are an error that names the key and suggests the closest valid one.
"""

from rlvr.config import validate
from rlvr.config.algo import (
    VLLM_ROLLOUT_CORRECTION,
    AlgoConfig,
    GSPOTokenConfig,
    MaxEntConfig,
    PPOConfig,
    PSGRPOStepsConfig,
    RolloutCorrectionConfig,
    TeacherConfig,
)
from rlvr.config.base import ConfigError, Section
from rlvr.config.env import BUILTIN_ENVS, EnvConfig
from rlvr.config.loading import (
    ALIASES,
    apply_overrides,
    config_from_dict,
    known_keys,
    load_config,
)
from rlvr.config.reward import RewardConfig, RewardSpec
from rlvr.config.sandbox import SANDBOX_BACKENDS, SandboxConfig
from rlvr.config.sections import (
    TEMPLATES,
    Config,
    DataConfig,
    LoggingConfig,
    ModelConfig,
    RolloutConfig,
    TrainConfig,
)

__all__ = [
    "ALIASES",
    "BUILTIN_ENVS",
    "EnvConfig",
    "TEMPLATES",
    "VLLM_ROLLOUT_CORRECTION",
    "AlgoConfig",
    "Config",
    "ConfigError",
    "DataConfig",
    "GSPOTokenConfig",
    "LoggingConfig",
    "MaxEntConfig",
    "ModelConfig",
    "PPOConfig",
    "PSGRPOStepsConfig",
    "RewardConfig",
    "RewardSpec",
    "RolloutConfig",
    "RolloutCorrectionConfig",
    "SANDBOX_BACKENDS",
    "SandboxConfig",
    "Section",
    "TeacherConfig",
    "TrainConfig",
    "apply_overrides",
    "config_from_dict",
    "known_keys",
    "load_config",
    "validate",
]
