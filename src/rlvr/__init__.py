"""rlvr: reinforcement-learning fine-tuning of language models with verifiable rewards."""

__version__ = "0.1.0"


def train(config=None, **overrides):
    """Train from a Config, a YAML path, or the defaults; ``overrides`` are dotted keys.

    >>> import rlvr
    >>> summary = rlvr.train("run.yaml", **{"train.max_steps": 5})
    """
    from rlvr.config import Config, load_config
    from rlvr.training.trainer import Trainer

    if isinstance(config, Config):
        cfg = config
        if overrides:
            from rlvr.config import apply_overrides, config_from_dict

            cfg = config_from_dict(
                apply_overrides(
                    cfg.model_dump(mode="json"), [f"{k}={v}" for k, v in overrides.items()]
                )
            )
    else:
        cfg = load_config(config, [f"{k}={v}" for k, v in overrides.items()])
    return Trainer(cfg).fit()
