"""The base class of every config section, and the error a config that cannot run raises."""

from pydantic import BaseModel, ConfigDict


class Section(BaseModel):
    """Unknown keys are errors, assignments are validated, NaN and inf are refused."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


class ConfigError(ValueError):
    """A configuration that cannot run; the message names each bad knob."""
