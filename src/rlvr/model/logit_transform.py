"""What a model's forward does to its LM head's output, read from the forward's own source, so
the chunked log-probs (``head_logprobs.py``) apply it too.

The chunked path reads the last hidden states and runs the head itself; anything the forward
does after the head is the chunks' to repeat. In transformers' modelling code (5.23) the
forwards that do anything write: ``cap * tanh(x / cap)`` (``final_logit_softcapping``: Gemma-2,
Gemma-3, Gemma-3n, Gemma-4, VaultGemma, NanoChat, MistralLarge4, Muse after a multiplier);
``x / logits_scaling`` (Granite and its MoE, SWA and hybrid variants); ``x * logit_scale``
(Cohere, Cohere2); ``x * logits_scaling`` (HyperCLOVAX); ``x * lm_head_multiplier``
(FalconH1); ``x.float()`` (Mamba, Mllama, NemotronH). Rather than a list of class names, the
forward's statements from the head call on are read (``ast``) and replayed as a few steps:
multiply or divide by a number the model holds (``self.config...``, ``self.logit_scale``),
``tanh``, ``float()``, an ``if X is not None:`` around them. Anything else that writes the
logits (an in-place method on them, an output built from an expression of them) or, before the
head, the hidden states (a division of the hidden states: MiniCPM3,
Inkling; a slice of the vocabulary: Inkling; a mask: Chameleon; a forward with no
``logits = self.<head>(hidden_states)``) is not recognised: the model takes the full-logits
path, which is its own forward, and a warning says why, once.
"""

from __future__ import annotations

import ast
import inspect
import logging
import math
import textwrap
import weakref
from dataclasses import dataclass

import torch
from torch.nn.parallel import DistributedDataParallel

log = logging.getLogger(__name__)

# ("mul", c) / ("div", c): times or over the number c; ("tanh", None); ("float", None)
Step = tuple[str, float | None]


@dataclass(frozen=True)
class LogitTransform:
    """The steps a forward applies to its head's output, in order (none: the head's output
    is the logits). ``apply`` runs them on a chunk of logits in place, in the forward's order
    and dtypes; ``grad`` takes a gradient back through them."""

    steps: tuple[Step, ...] = ()

    @property
    def upcasts(self) -> bool:
        """Whether the forward turns its logits to float32 (the temperature then divides in
        float32, and the gradient goes back to the compute dtype at that step)."""
        return any(op == "float" for op, _ in self.steps)

    @property
    def needs_output(self) -> bool:
        """Whether the gradient needs the head's output again (``tanh``'s derivative is
        ``1 - y**2`` of its output)."""
        return any(op == "tanh" for op, _ in self.steps)

    def apply(self, z: torch.Tensor) -> torch.Tensor:
        """``z`` (fresh from the head's matmul, overwritten) through the steps, in the
        forward's order and dtypes."""
        for op, c in self.steps:
            z = _step(z, op, c)
        return z

    def grad(
        self, g: torch.Tensor, head_out: torch.Tensor | None, dtype: torch.dtype
    ) -> torch.Tensor:
        """The gradient with respect to the head's output from ``g``, the gradient with respect
        to the transformed logits (overwritten), autograd's formulas step by step in reverse:
        ``mul``/``div`` by the number, ``tanh`` times ``1 - y**2``, ``float`` back to
        ``dtype``. ``head_out``: the head's output recomputed, where ``needs_output`` (its
        buffer becomes the tanh's output: no buffer beyond it)."""
        outputs = []
        if self.needs_output:
            last = max(i for i, (op, _) in enumerate(self.steps) if op == "tanh")
            for i, (op, c) in enumerate(self.steps[: last + 1]):
                head_out = _step(head_out, op, c)
                if op == "tanh":
                    outputs.append(head_out if i == last else head_out.clone())
        for op, c in reversed(self.steps):
            if op == "mul":
                g.mul_(c)
            elif op == "div":
                g.div_(c)
            elif op == "tanh":
                y = outputs.pop()
                g.mul_(y.mul_(y).neg_().add_(1))
                del y
            else:
                g = g.to(dtype)
        return g


def _step(z: torch.Tensor, op: str, c: float | None) -> torch.Tensor:
    """One step on ``z``, in place where the forward's own op keeps the dtype."""
    if op == "mul":
        return z.mul_(c)
    if op == "div":
        return z.div_(c)
    if op == "tanh":
        return z.tanh_()
    return z.float()  # the model's .float(): a new float32 tensor


IDENTITY = LogitTransform()


class _Unrecognised(Exception):
    """What the forward does that the chunks cannot repeat (the message says what)."""


_TANH = {"torch.tanh", "nn.functional.tanh", "torch.nn.functional.tanh", "F.tanh"}
# the hidden states a forward hands its head: the inner model's last, sliced to the kept positions
_HIDDEN_SOURCES = ("slice_logits_to_keep",)


def _causal_lm(model: torch.nn.Module) -> torch.nn.Module:
    """The transformers model under DDP's and peft's wrappers (FSDP2 keeps the class's forward)."""
    if isinstance(model, DistributedDataParallel):
        model = model.module
    base = getattr(model, "get_base_model", None)  # peft's PeftModel
    return base() if callable(base) else model


def _forward_def(model: torch.nn.Module) -> ast.FunctionDef:
    """The ``forward`` the model's class runs (the first class defining one outside torch's
    own wrappers), parsed."""
    for cls in type(model).__mro__:
        if "forward" in cls.__dict__ and not cls.__module__.startswith("torch."):
            fn = inspect.unwrap(cls.__dict__["forward"])
            break
    else:
        raise _Unrecognised("no forward of its own")
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    except (OSError, TypeError, SyntaxError) as exc:
        raise _Unrecognised(f"its forward's source cannot be read ({exc})") from exc
    node = tree.body[0]
    if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
        raise _Unrecognised("its forward is not a plain function")
    return node


def _stores(node: ast.AST, name: str) -> bool:
    """Whether ``node`` writes ``name`` (or an item or attribute of it), or calls something on
    it as a statement (an in-place method)."""
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name) and sub.id == name and isinstance(sub.ctx, ast.Store):
            return True
        written = isinstance(sub, ast.Subscript | ast.Attribute) and isinstance(sub.ctx, ast.Store)
        if written and _mentions(sub.value, lambda n: _is_name(n, name)):
            return True
        if isinstance(sub, ast.Expr) and _mentions(sub, lambda n: _is_name(n, name)):
            return True
    return False


class _Reader:
    """Replays the forward's statements about the head's output on the model instance."""

    def __init__(self, model: torch.nn.Module, head_name: str):
        self.model = model
        self.head_name = head_name
        self.names: dict[str, object] = {}

    def value(self, node: ast.expr) -> object:
        """A number or object the model holds: ``self.a.b``, ``x.get_text_config()``, a name
        bound by ``:=`` in an ``if``, a literal."""
        if isinstance(node, ast.Constant) and not isinstance(node.value, bool):
            return node.value
        if isinstance(node, ast.Name):
            if node.id == "self":
                return self.model
            if node.id in self.names:
                return self.names[node.id]
        if isinstance(node, ast.Attribute):
            return getattr(self.value(node.value), node.attr)
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "get_text_config"
            and not node.args
            and not node.keywords
        ):
            return self.value(node.func.value).get_text_config()
        raise _Unrecognised(f"`{ast.unparse(node)}` is not a value rlvr can read")

    def number(self, node: ast.expr) -> float:
        v = self.value(node)
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v == 0:
            raise _Unrecognised(f"`{ast.unparse(node)}` is {v!r}, not a finite nonzero number")
        return float(v)

    def is_head_call(self, node: ast.expr) -> bool:
        """``self.<head>(hidden_states)``, of a slice of them, or of them ``.to(dtype)``."""
        if not (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == self.head_name
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == "self"
        ):
            return False
        if len(node.args) != 1 or node.keywords:
            raise _Unrecognised(f"its head call `{ast.unparse(node)}` has other arguments")
        arg = node.args[0]
        if isinstance(arg, ast.Subscript):
            arg = arg.value
        elif (
            isinstance(arg, ast.Call)
            and isinstance(arg.func, ast.Attribute)
            and arg.func.attr == "to"
        ):
            arg = arg.func.value
        if not (isinstance(arg, ast.Name) and arg.id == "hidden_states"):
            raise _Unrecognised(f"its head runs on `{ast.unparse(node.args[0])}`")
        return True

    def steps(self, node: ast.expr, leaf) -> list[Step]:
        """The steps from ``leaf`` (the head call or ``logits``) to the expression ``node``."""
        if leaf(node):
            return []
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult | ast.Div):
            if _mentions(node.left, leaf):
                op = "mul" if isinstance(node.op, ast.Mult) else "div"
                return [*self.steps(node.left, leaf), (op, self.number(node.right))]
            if isinstance(node.op, ast.Mult) and _mentions(node.right, leaf):
                return [*self.steps(node.right, leaf), ("mul", self.number(node.left))]
        if isinstance(node, ast.Call) and not node.keywords:
            name = ast.unparse(node.func)
            if name in _TANH and len(node.args) == 1:
                return [*self.steps(node.args[0], leaf), ("tanh", None)]
            if isinstance(node.func, ast.Attribute) and not node.args:
                if node.func.attr == "float":
                    return [*self.steps(node.func.value, leaf), ("float", None)]
                if node.func.attr == "contiguous":
                    return self.steps(node.func.value, leaf)
        raise _Unrecognised(f"`{ast.unparse(node)}`")

    def statements(self, body: list[ast.stmt]) -> list[Step]:
        """The steps of the statements after the head that write ``logits``."""
        out: list[Step] = []
        for st in body:
            if not _stores(st, "logits"):
                _check_reads(st)  # the loss, the return: they read the logits
                continue
            if (
                isinstance(st, ast.Assign)
                and len(st.targets) == 1
                and isinstance(st.targets[0], ast.Name)
                and st.targets[0].id == "logits"
            ):
                out += self.steps(st.value, _is_logits)
            elif isinstance(st, ast.If) and not st.orelse and self.not_none(st.test):
                out += self.statements(st.body)
            elif not (isinstance(st, ast.If) and not st.orelse):
                raise _Unrecognised(f"`{ast.unparse(st).splitlines()[0]}`")
        return out

    def not_none(self, test: ast.expr) -> bool:
        """``X is not None`` (``X`` possibly ``(name := ...)``), evaluated on the model."""
        if not (
            isinstance(test, ast.Compare)
            and len(test.ops) == 1
            and isinstance(test.ops[0], ast.IsNot)
            and isinstance(test.comparators[0], ast.Constant)
            and test.comparators[0].value is None
        ):
            raise _Unrecognised(f"`if {ast.unparse(test)}:` around its logits")
        left = test.left
        if isinstance(left, ast.NamedExpr):
            self.names[left.target.id] = v = self.value(left.value)
        else:
            v = self.value(left)
        return v is not None


def _check_reads(st: ast.stmt) -> None:
    """A statement that does not assign ``logits`` only reads them: no in-place method on them
    (``_ = logits.mul_(c)``) and no output built from anything but them (``logits=logits * c``
    in a ``return`` or a ``...Output(...)``; a loss may take what it likes), which would change
    what the forward returns without a write the reader follows."""
    outputs = [
        n
        for n in ast.walk(st)
        if isinstance(n, ast.Return)
        or (isinstance(n, ast.Call) and "Output" in ast.unparse(n.func))
    ]
    for out in outputs:
        for node in ast.walk(out):
            kw = isinstance(node, ast.keyword) and node.arg == "logits"
            if kw and not _is_logits(node.value):
                raise _Unrecognised(f"it returns `logits={ast.unparse(node.value)}`")
    for node in ast.walk(st):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and _is_logits(node.func.value)
            and node.func.attr.endswith("_")
            and not node.func.attr.startswith("__")
        ):
            raise _Unrecognised(f"`{ast.unparse(node)}` changes its logits in place")


def _is_logits(node: ast.expr) -> bool:
    return isinstance(node, ast.Name) and node.id == "logits"


def _mentions(node: ast.expr, leaf) -> bool:
    return any(leaf(n) for n in ast.walk(node))


def _hidden_ok(value: ast.expr) -> bool:
    """The hidden states the forward hands its head: the inner model's last
    (``outputs.last_hidden_state``, ``outputs[0]``), sliced to the kept positions."""
    if isinstance(value, ast.IfExp):
        return _hidden_ok(value.body) and _hidden_ok(value.orelse)
    if isinstance(value, ast.Attribute):
        return value.attr == "last_hidden_state" and isinstance(value.value, ast.Name)
    if isinstance(value, ast.Subscript):  # outputs[0], hidden_states[:, slice_indices, :]
        return isinstance(value.value, ast.Name) and (
            value.value.id == "hidden_states"
            or (isinstance(value.slice, ast.Constant) and value.slice.value == 0)
        )
    if isinstance(value, ast.Call) and ast.unparse(value.func) in _HIDDEN_SOURCES:
        return _hidden_ok(value.args[0]) or _is_name(value.args[0], "hidden_states")
    return False


def _is_name(node: ast.expr, name: str) -> bool:
    return isinstance(node, ast.Name) and node.id == name


def _check_hidden(body: list[ast.stmt]) -> None:
    """Every write of ``hidden_states`` before the head is one of ``_hidden_ok``'s."""
    for st in body:
        if not _stores(st, "hidden_states"):
            continue
        if isinstance(st, ast.Assign) and all(_is_name(t, "hidden_states") for t in st.targets):
            if not _hidden_ok(st.value):
                raise _Unrecognised(f"before its head, `{ast.unparse(st)}`")
        elif isinstance(st, ast.If):
            _check_hidden(st.body)
            _check_hidden(st.orelse)
        else:
            raise _Unrecognised(f"before its head, `{ast.unparse(st).splitlines()[0]}`")


def read_logit_transform(model: torch.nn.Module, head: torch.nn.Module) -> LogitTransform:
    """The steps ``model``'s forward applies to ``head``'s output; raises ``ValueError`` naming
    what it does that is not recognised."""
    model = _causal_lm(model)
    try:
        names = [n for n, m in model.named_children() if m is head]
        if not names:
            raise _Unrecognised("its head is not one of its own attributes")
        fn = _forward_def(model)
        reader = _Reader(model, names[0])
        at = None
        for i, st in enumerate(fn.body):
            writes = isinstance(st, ast.Assign) and any(_is_name(t, "logits") for t in st.targets)
            if writes and _mentions(st.value, reader.is_head_call):
                at = i
        if at is None:
            raise _Unrecognised(f"its forward has no `logits = self.{names[0]}(hidden_states)`")
        _check_hidden(fn.body[:at])
        steps = reader.steps(fn.body[at].value, reader.is_head_call)
        steps += reader.statements(fn.body[at + 1 :])
    except _Unrecognised as exc:
        name = type(model).__name__
        raise ValueError(f"{name}'s forward post-processes its logits: {exc}") from None
    return LogitTransform(tuple(steps))


_READ: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_WARNED: set[str] = set()


def logit_transform(model: torch.nn.Module, head: torch.nn.Module) -> LogitTransform | None:
    """``read_logit_transform``, once per model; None where it is not recognised (the full
    path must run), with a warning, once per reason."""
    key = _causal_lm(model)
    if key not in _READ:
        try:
            _READ[key] = read_logit_transform(model, head)
        except ValueError as exc:
            _READ[key] = str(exc)
    found = _READ[key]
    if isinstance(found, LogitTransform):
        return found
    if found not in _WARNED:
        _WARNED.add(found)
        log.warning(
            "%s; the chunked log-probs (algo.logprob_chunk_tokens) cannot repeat that, so this "
            "model takes the full-logits path",
            found,
        )
    return None
