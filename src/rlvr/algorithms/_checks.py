"""Input checks shared by the algorithm modules: each raises ``ValueError`` naming the field."""

from __future__ import annotations

import torch
from torch import Tensor


def require_tensor(name: str, value: object) -> Tensor:
    """``value`` itself if it is a tensor; otherwise a ``TypeError`` naming ``name``."""
    if not isinstance(value, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    return value


def require_ndim(name: str, value: Tensor, ndim: int) -> None:
    """Fail unless ``value`` has exactly ``ndim`` dimensions."""
    require_tensor(name, value)
    if value.dim() != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got shape {tuple(value.shape)}")


def require_same_shape(**tensors: Tensor) -> None:
    """Fail unless all given tensors share one shape; the message lists every shape."""
    shapes = {name: tuple(require_tensor(name, t).shape) for name, t in tensors.items()}
    if len(set(shapes.values())) > 1:
        listing = ", ".join(f"{name}={shape}" for name, shape in shapes.items())
        raise ValueError(f"shape mismatch: {listing}")


def require_mask(name: str, mask: Tensor) -> Tensor:
    """Check ``mask`` holds only 0/1 (or is bool) and return it as a bool tensor."""
    require_tensor(name, mask)
    if mask.dtype == torch.bool:
        return mask
    if not bool(((mask == 0) | (mask == 1)).all()):
        raise ValueError(f"{name} must contain only 0 and 1")
    return mask != 0


def require_positive(name: str, value: float) -> None:
    """Fail unless ``value`` is a number > 0."""
    if not value > 0:
        raise ValueError(f"{name} must be > 0, got {value!r}")


def require_in_unit(name: str, value: float) -> None:
    """Fail unless 0 <= ``value`` <= 1."""
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{name} must be in [0, 1], got {value!r}")


def float_dtype(t: Tensor) -> torch.dtype:
    """``t``'s dtype if floating, else the default float dtype (for int/bool rewards)."""
    return t.dtype if t.is_floating_point() else torch.get_default_dtype()
