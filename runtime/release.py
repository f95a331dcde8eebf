"""Gradient release for any ``torch.optim`` optimizer, at the speed of its fused kernel.

Parameters are stepped from their ``register_post_accumulate_grad_hook`` as
soon as their gradients are complete, in buckets of parameters whose
gradients complete together, and the gradients are freed right after, so at
most a bucket's gradients are alive at a time instead of all of them.

The user's optimizer object stays the one that matters: its ``step()`` and
``zero_grad()`` become no-ops, its ``state`` holds the per-parameter state (so
``state_dict``/``load_state_dict`` work unchanged), and every per-parameter
step reads ``lr`` and the other hyper-parameters from its *live*
``param_groups``, so an LR scheduler attached to it keeps working. (A wrapper
that gave the scheduler its own copy of the groups would silently train at the
initial learning rate.)

What cannot work with gradients that no longer exist after backward is refused
with :class:`ReleaseUnsupported`: a ``GradScaler`` (it must see every gradient
before any step to skip steps on inf/NaN), gradient accumulation (each backward
already stepped), and gradient clipping or norm measurement after backward, by
any of torch's clipping functions however they were imported (there is no
whole gradient left).
"""

from __future__ import annotations

import collections
import dataclasses
import types
from typing import Any, Callable, Iterable

import torch
from torch.utils.weak import WeakIdKeyDictionary

from gradlint.runtime._patching import Patcher
from gradlint.runtime.clipping import ClipInterceptor
from gradlint.runtime.kernels import FUSED, fused_supports, kernel_of
from gradlint.runtime.tracer import in_backward

_MISSING = object()
_ACTIVE: WeakIdKeyDictionary = WeakIdKeyDictionary()  # optimizer -> GradientRelease
_RELEASED_PARAMS: WeakIdKeyDictionary = WeakIdKeyDictionary()  # param -> GradientRelease
_guards: "_Guards | None" = None


class ReleaseUnsupported(RuntimeError):
    """Gradient release cannot do what the training loop asks for."""


@dataclasses.dataclass(eq=False)
class _Bucket:
    """Parameters of one group whose gradients complete one after the other in backward, stepped together."""

    params: list[torch.Tensor]
    sub: torch.optim.Optimizer | None = None
    ready: int = 0


class GradientRelease:
    """Turn ``optimizer`` into steps run during backward, each as soon as its gradients are complete.

    Use as a context manager or call :meth:`remove` to restore the optimizer.

    The first backward steps each parameter alone the moment its gradient is
    accumulated, and notes the order in which they complete. From then on
    parameters are stepped in buckets of that order (consecutive parameters
    of one group, up to ``bucket_bytes`` of gradients): a bucket steps, in one
    call of the optimizer's kernel, once its last gradient is in, and its
    gradients are freed right after. Python runs once per bucket instead of
    once per parameter, and at most a bucket's gradients are alive at a time.

    ``fused=True`` (the default) steps with the optimizer's fused kernel
    where it has one for the parameters' devices (Adam, AdamW, SGD, Adagrad
    on CPU and CUDA): one kernel launch per bucket and no temporaries.
    ``fused=False`` keeps the optimizer's own kernel. Steps are bitwise equal
    to the plain loop whenever both run the same kernel (the kernels are
    elementwise, so how parameters are grouped does not change a bit);
    between kernels the difference is rounding. :attr:`kernel` names the
    kernel used for each group.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, fused: bool = True, bucket_bytes: int | None = None) -> None:
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"expected a torch.optim.Optimizer, got {type(optimizer).__name__}")
        if isinstance(optimizer, torch.optim.LBFGS):
            raise ReleaseUnsupported("LBFGS re-evaluates the loss inside step(); it cannot step one parameter at a time")
        if optimizer in _ACTIVE:
            raise ReleaseUnsupported("gradient release is already enabled on this optimizer")
        self.optimizer = optimizer
        self.fused = fused
        self.bucket_bytes = bucket_bytes
        self.step_callbacks: list[Callable[[], None]] = []
        self._solo: WeakIdKeyDictionary = WeakIdKeyDictionary()  # param -> its one-parameter bucket
        self._bucket_of: dict[int, _Bucket] = {}  # id(param) -> its bucket, once the order is known
        self._buckets: list[_Bucket] = []
        self._order: list[torch.Tensor] | None = []  # completion order seen in the first backward
        self._stepped: collections.Counter[int] = collections.Counter()
        self._seen: set[int] = set()  # parameters whose gradient came in since the loop's last step
        self._step_calls = 0
        self._fused_groups: dict[tuple[int, int], bool] = {}
        self._group_index: dict[int, int] = {}
        self._groups_key: tuple[int, int] | None = None
        self._handles = []
        self._saved_attrs = {name: optimizer.__dict__.get(name, _MISSING) for name in ("step", "zero_grad")}
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p in _RELEASED_PARAMS:
                    raise ReleaseUnsupported("a parameter is already released by another optimizer")
        self._hooked: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self._had_grad: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self.keep_zeros = False  # the loop's last clear was zero_grad(set_to_none=False)
        self._hook_new_parameters()
        optimizer.step = types.MethodType(_released_step, optimizer)  # type: ignore[method-assign]
        optimizer.zero_grad = types.MethodType(_released_zero_grad, optimizer)  # type: ignore[method-assign]
        if not _ACTIVE:
            _install_guards()
        _ACTIVE[optimizer] = self

    @property
    def kernel(self) -> list[str]:
        """The kernel each parameter group steps with: ``fused``, ``foreach`` or ``for-loop``."""
        return [self._kernel_for(group) for group in self.optimizer.param_groups]

    def _kernel_for(self, group: dict[str, Any]) -> str:
        if self._uses_fused(group):
            return FUSED
        return kernel_of(self.optimizer, group)

    def _uses_fused(self, group: dict[str, Any]) -> bool:
        if group.get("fused"):
            return True
        if not self.fused or group.get("differentiable"):
            return False
        key = (id(group), len(group["params"]))  # asked at every step: the answer is kept per group
        known = self._fused_groups.get(key)
        if known is None:
            known = self._fused_groups[key] = fused_supports(type(self.optimizer), group["params"])
        return known

    def _hook_new_parameters(self) -> None:
        """Hook every parameter of the groups that requires grad and is not hooked yet."""
        for group in self.optimizer.param_groups:
            for p in group["params"]:
                if p.requires_grad and p not in self._hooked:
                    self._handles.append(p.register_post_accumulate_grad_hook(self._on_gradient))
                    self._hooked[p] = True
                    _RELEASED_PARAMS[p] = self

    # ------------------------------------------------------------------ steps during backward
    def _on_gradient(self, p: torch.Tensor) -> None:
        """The post-accumulate-grad hook: ``p.grad`` is complete for this backward."""
        key = id(p)
        if key in self._seen:
            raise ReleaseUnsupported(
                "gradient accumulation cannot be combined with gradient release: a second backward reached a "
                "parameter before optimizer.step(); each backward already stepped and freed its gradient"
            )
        if p.grad is None:
            return
        self._seen.add(key)
        bucket = self._bucket_of.get(key)
        if bucket is None:  # order not known yet, or a parameter the first backward did not reach
            if self._order is not None:
                self._order.append(p)
            self._step(self._solo_bucket(p))
            return
        bucket.ready += 1
        if bucket.ready == len(bucket.params):
            self._step(bucket)

    def _solo_bucket(self, p: torch.Tensor) -> _Bucket:
        bucket = self._solo.get(p)
        if bucket is None:
            bucket = self._solo[p] = _Bucket([p])
        return bucket

    def _group_of(self, p: torch.Tensor) -> dict[str, Any]:
        groups = self.optimizer.param_groups
        key = (id(groups), len(groups))
        if key != self._groups_key:  # load_state_dict or add_param_group replaced the groups
            self._group_index = {id(q): i for i, g in enumerate(groups) for q in g["params"]}
            self._groups_key = key
        return groups[self._group_index[id(p)]]

    def _sub_optimizer(self, bucket: _Bucket, live: dict[str, Any]) -> torch.optim.Optimizer:
        """A same-class optimizer over the bucket's parameters, sharing everything but the groups and step hooks.

        Built lazily, once the user's constructor has finished setting its attributes.
        """
        opt = self.optimizer
        sub = object.__new__(type(opt))
        skip = {"step", "zero_grad", "param_groups", "state"}
        sub.__dict__.update({k: v for k, v in opt.__dict__.items() if k not in skip})
        sub._optimizer_step_pre_hooks = collections.OrderedDict()
        sub._optimizer_step_post_hooks = collections.OrderedDict()
        sub.param_groups = [{"params": bucket.params}]
        sub._gradlint_release_of = opt  # whose steps these are, for a tracer watching every optimizer's steps
        if self._uses_fused(live) and not live.get("fused"):
            # state made by another kernel keeps its step counter on the CPU; the fused kernel wants it on the device
            for p in bucket.params:
                step = opt.state.get(p, {}).get("step")
                if isinstance(step, torch.Tensor) and step.device != p.device:
                    opt.state[p]["step"] = step.to(device=p.device, dtype=torch.float32)
        return sub

    def _step(self, bucket: _Bucket, params: list[torch.Tensor] | None = None) -> None:
        """Step the bucket's parameters (or ``params``, some of them) on their gradients, then free the gradients."""
        params = bucket.params if params is None else params
        live = self._group_of(params[0])
        if params is bucket.params:
            if bucket.sub is None:
                bucket.sub = self._sub_optimizer(bucket, live)
            sub = bucket.sub
        else:
            sub = self._sub_optimizer(bucket, live)
            sub.param_groups[0]["params"] = params
        group = sub.param_groups[0]
        for k, v in live.items():
            if k != "params":
                group[k] = v
        if self._uses_fused(live):
            group["fused"], group["foreach"] = True, False
        sub.state = self.optimizer.state  # re-read: load_state_dict replaces the dict
        sub.step()
        for k, v in group.items():
            if k not in ("params", "fused", "foreach") and live.get(k, _MISSING) is not v:
                live[k] = v
        for p in params:
            p.grad = None
        if bucket.sub is not sub or len(params) == 1:  # the hooks' buckets are counted through _seen
            for p in params:
                self._stepped[id(p)] += 1
                self._had_grad[p] = True
        bucket.ready = 0

    # ------------------------------------------------------------------ at the loop's step()
    def _make_buckets(self) -> None:
        """Buckets from the completion order of the first backward: consecutive parameters of one group."""
        order, self._order = self._order or [], None
        if not order:
            return
        sizes = [p.numel() * p.element_size() for p in order]
        limit = self.bucket_bytes or max(max(sizes), sum(sizes) // 32)
        current: list[torch.Tensor] = []
        current_group, current_bytes = None, 0
        for p, size in zip(order, sizes):
            group = id(self._group_of(p))
            if current and (group != current_group or current_bytes + size > limit):
                self._buckets.append(_Bucket(current))
                current, current_bytes = [], 0
            current.append(p)
            current_group, current_bytes = group, current_bytes + size
        if current:
            self._buckets.append(_Bucket(current))
        self._bucket_of = {id(p): b for b in self._buckets for p in b.params}

    def _catch_up(self) -> None:
        """At the loop's ``step()``: step what the hooks could not, as the plain loop would.

        A bucket some of whose parameters got no gradient this time is stepped
        now, on the gradients it has. A parameter added with
        ``add_param_group`` or unfrozen after set-up has no hook yet, so its
        gradient is still there: step it now and hook it for the next
        backward. After ``zero_grad(set_to_none=False)`` the plain loop steps
        every parameter that ever had a gradient, on a zero gradient where
        backward did not reach it this time.
        """
        for bucket in self._buckets:
            if bucket.ready:
                self._step(bucket, [p for p in bucket.params if p.grad is not None])
        for group in self.optimizer.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    self._step(self._solo_bucket(p))
                elif self.keep_zeros and self._had_gradient(p) and not self._stepped[id(p)] and id(p) not in self._seen:
                    p.grad = torch.zeros_like(p)
                    self._step(self._solo_bucket(p))
        self._hook_new_parameters()

    def _had_gradient(self, p: torch.Tensor) -> bool:
        """Whether ``p`` was ever stepped: alone (noted), or in a bucket (made from parameters that were)."""
        return p in self._had_grad or id(p) in self._bucket_of

    def _on_user_step(self) -> None:
        self._catch_up()
        if self._order is not None:
            self._make_buckets()
        self._stepped.clear()
        self._seen.clear()
        self._step_calls += 1
        for callback in self.step_callbacks:
            callback()

    # ------------------------------------------------------------------ undo
    def remove(self) -> None:
        """Give the optimizer its own ``step``/``zero_grad`` back and drop the hooks."""
        if _ACTIVE.get(self.optimizer) is not self:
            return
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        for p in [p for p, r in _RELEASED_PARAMS.items() if r is self]:
            del _RELEASED_PARAMS[p]
        for name, value in self._saved_attrs.items():
            if value is _MISSING:
                self.optimizer.__dict__.pop(name, None)
            else:
                setattr(self.optimizer, name, value)
        del _ACTIVE[self.optimizer]
        if not _ACTIVE:
            _remove_guards()

    def __enter__(self) -> "GradientRelease":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.remove()


def enable_gradient_release(optimizer: torch.optim.Optimizer, fused: bool = True) -> GradientRelease:
    """Switch ``optimizer`` to gradient release; returns the handle whose ``remove()`` undoes it."""
    return GradientRelease(optimizer, fused=fused)


def _released_step(optimizer: torch.optim.Optimizer, closure: Callable[[], Any] | None = None) -> Any:
    """``step()`` of a released optimizer: the steps already ran during backward."""
    loss = None
    if closure is not None:
        with torch.enable_grad():
            loss = closure()
    optimizer._opt_called = True  # type: ignore[attr-defined]  # keeps LRScheduler's order check quiet
    _ACTIVE[optimizer]._on_user_step()
    return loss


# LRScheduler warns when ``optimizer.step`` lacks this mark (it thinks the step
# was overridden after the scheduler was built); the no-op step keeps the order
# bookkeeping through ``_opt_called`` itself.
_released_step._wrapped_by_lr_sched = True  # type: ignore[attr-defined]


def _released_zero_grad(optimizer: torch.optim.Optimizer, set_to_none: bool = True) -> None:
    """``zero_grad()`` of a released optimizer: remember how the loop clears, and clear what is not released.

    Released gradients are already freed; a parameter without a hook yet (added
    or unfrozen since the last step) still has one, cleared as the plain loop would.
    """
    _ACTIVE[optimizer].keep_zeros = not set_to_none
    type(optimizer).zero_grad(optimizer, set_to_none)


# ---------------------------------------------------------------------- refusals
def _refuse_scaler(original: Callable) -> Callable:
    def guarded(scaler: Any, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
        # a disabled scaler (enabled=False, or no CUDA) passes straight to optimizer.step()
        if optimizer in _ACTIVE and scaler.is_enabled():
            raise ReleaseUnsupported(
                "a GradScaler cannot be used with gradient release: it must check every gradient for inf/NaN "
                "before any parameter steps; use bf16 autocast without a scaler"
            )
        return original(scaler, optimizer, *args, **kwargs)

    return guarded


def _refuse_clip(name: str, original: Callable) -> Callable:
    def guarded(*args: Any, **kwargs: Any) -> Any:
        # Outside backward there is no whole gradient left to clip or measure: each
        # was stepped and freed as soon as it existed (a clip inside a release hook,
        # on the one parameter at hand, is fine).
        if not in_backward():
            raise ReleaseUnsupported(
                f"gradient clipping cannot be combined with gradient release: {name} needs the gradients "
                "after backward, but each one was stepped and freed as soon as it existed"
            )
        return original(*args, **kwargs)

    return guarded


def _note_module_clear(original: Callable) -> Callable:
    def zero_grad(module: torch.nn.Module, set_to_none: bool = True) -> None:
        releases = {id(r): r for p in module.parameters() if (r := _RELEASED_PARAMS.get(p)) is not None}
        for release in releases.values():
            release.keep_zeros = not set_to_none
        return original(module, set_to_none)

    return zero_grad


class _Guards:
    """The refusals in force while any optimizer is released."""

    def __init__(self) -> None:
        from torch.amp.grad_scaler import GradScaler

        self._patcher = Patcher()
        self._patcher.wrap(GradScaler, "unscale_", _refuse_scaler)
        self._patcher.wrap(GradScaler, "step", _refuse_scaler)
        self._patcher.wrap(torch.nn.Module, "zero_grad", _note_module_clear)
        self._clipping = ClipInterceptor(_refuse_clip)

    def remove(self) -> None:
        self._clipping.restore()
        self._patcher.restore()


def _install_guards() -> None:
    global _guards
    _guards = _Guards()


def _remove_guards() -> None:
    global _guards
    if _guards is not None:
        _guards.remove()
        _guards = None


def released(params: Iterable[torch.Tensor]) -> bool:
    """Whether any of ``params`` is stepped by gradient release right now."""
    return any(p in _RELEASED_PARAMS for p in params)
