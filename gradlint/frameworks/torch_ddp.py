"""PyTorch's own data parallelism: ``DistributedDataParallel`` (DDP) and FSDP2's ``fully_shard``.

What it does to gradients. DDP's constructor builds a ``Reducer`` that
hooks every parameter's gradient accumulator: each backward all-reduces
(averages over the ranks) the gradients as they complete, but only after a
forward that prepared it: ``_post_forward`` calls
``reducer.prepare_for_backward`` only while ``require_backward_grad_sync``
is true, and ``no_sync()`` sets that attribute to False for its block and
restores it on exit. A backward after no forward of the wrapper (a loss
computed through ``ddp.module.encode(...)`` or through the module the
wrapper was built from) all-reduces nothing: ``Reducer::autograd_hook``
(``torch/csrc/distributed/c10d/reducer.cpp``) returns at once while
``expect_autograd_hooks_`` is false, and only ``prepare_for_backward`` sets
it (GL309). So DDP decides in the forward whether the coming
backward all-reduces: a ``no_sync()`` entered after the forward, around the
backward alone, changes nothing (``no_sync``'s own docstring: "The forward
pass should be included inside the context manager, or else gradients will
still be synchronized"), unless the Python reducer of compiled DDP runs
(``optimize_ddp = "python_reducer"``: ``_register_accum_grad_hook`` reads
the flag in the backward). FSDP1's ``no_sync()`` (``_sync_gradients``, read
in ``_runtime_utils._post_backward_hook``) and FSDP2's
``set_requires_gradient_sync`` (``reduce_grads``, read in
``FSDPParamGroup.post_backward``) are read in the backward.
``register_comm_hook(state, hook)`` replaces the all-reduce by the hook.
FSDP2's ``fully_shard(module)`` reduce-scatters each backward's gradients;
``set_requires_gradient_sync(False)`` ("the equivalent of ``no_sync`` in
FSDP1") keeps them unsharded and unreduced until switched back.
``ShardedGradScaler`` is FSDP's grad scaler.
FSDP1's ``FullyShardedDataParallel`` with a sharded strategy (``FULL_SHARD``,
the default when ``sharding_strategy`` is not given: ``_init_utils._init_core_state``,
``sharding_strategy or ShardingStrategy.FULL_SHARD``; ``SHARD_GRAD_OP``,
the hybrid ones) leaves each rank only its shard of every gradient, as
plain tensors: ``torch.nn.utils.clip_grad_norm_(model.parameters(), ...)``
then takes each rank's own norm and clips each shard by a different factor.
``FullyShardedDataParallel.clip_grad_norm_`` reduces the norm over the
ranks first; its docstring: "If every FSDP instance uses ``NO_SHARD`` ...
you may directly use :func:`torch.nn.utils.clip_grad_norm_`. If at least
some FSDP instance uses a sharded strategy ... you should use this method
instead". FSDP2's gradients are ``DTensor``s, whose norm
``torch.nn.utils.clip_grad_norm_`` reduces over the mesh: it is right there.

Where it was read: torch 2.13.0 (the wheel this project pins),
``torch/nn/parallel/distributed.py``: ``DistributedDataParallel._ddp_init_helper``
(``self.reducer = dist.Reducer(...)``), ``_pre_forward``, ``_post_forward``, ``no_sync``,
``_register_accum_grad_hook``,
``register_comm_hook``; ``torch/distributed/fsdp/_fully_shard/_fully_shard.py``:
``fully_shard``, ``FSDPModule.set_requires_gradient_sync``;
``torch/distributed/fsdp/sharded_grad_scaler.py``; ``torch/distributed/fsdp/fully_sharded_data_parallel.py``
(``no_sync``, ``clip_grad_norm_``), ``_init_utils.py`` (``_init_core_state``) and ``_runtime_utils.py``, ``_fully_shard/_fsdp_param_group.py`` for where FSDP reads its flags. ``fully_shard`` is
exported both as ``torch.distributed.fsdp.fully_shard`` and, where FSDP2
first appeared, ``torch.distributed._composable.fsdp.fully_shard``: any
``fully_shard`` under ``torch.distributed`` is this one (other libraries
have functions of that name). Versions: read at 2.13.0, the version this
project pins; earlier releases were not read.
"""

from __future__ import annotations

import libcst as cst

from gradlint.frameworks.framework import Framework, NoSyncContext, ShardedGrads, SyncFlag, SyncSwitch, Wrap
from gradlint.kinds import ObjKind
from gradlint.syntax import bool_literal, keyword_arg, positional_args

_DDP = frozenset({"torch.nn.parallel.DistributedDataParallel", "torch.nn.parallel.distributed.DistributedDataParallel"})


def _ddp_message(name: str, where: str) -> str:
    return (
        f"the DDP model `{name}` all-reduces the gradients of this backward on every micro-batch, "
        f"but {where}: run the micro-batches that do not step "
        f"inside `{name}.no_sync()` (or set `require_backward_grad_sync = False` for them)"
    )


def _fsdp2_message(name: str, where: str) -> str:
    return (
        f"`{name}` is sharded with `fully_shard`, which reduce-scatters the gradients of every backward, but "
        f"{where}: call `{name}.set_requires_gradient_sync(False)` for the micro-batches that do not step "
        f"(FSDP2 then keeps unsharded gradients until the step: memory traded for communication)"
    )


# How DDP decides in the forward whether the coming backward all-reduces (``_post_forward``; ``no_sync``), for GL306.
FORWARD_DECIDES = (
    "its forward arms the all-reduce of the coming backward while `require_backward_grad_sync` is true "
    "(`_post_forward` calls `reducer.prepare_for_backward`), and `no_sync()` only sets that flag for its block"
)

# What a loss computed around a DDP model skips (``Reducer::autograd_hook`` returns while ``expect_autograd_hooks_`` is
# false; only ``prepare_for_backward``, called by the forward, sets it), for GL309.
AROUND_FORWARD = (
    "DDP all-reduces a backward only after its own forward prepared the reducer (`_post_forward` calls "
    "`reducer.prepare_for_backward`; until then its gradient hooks return at once), so this backward all-reduces "
    "nothing and each process steps its own replica"
)


def _switches_off_sync(call: cst.Call) -> bool:
    """``model.set_requires_gradient_sync(flag)``: told not to reduce (anything but a literal True)."""
    args = positional_args(call)
    arg = args[0] if args else keyword_arg(call, "requires_gradient_sync")
    return arg is not None and bool_literal(arg.value) is not True


FRAMEWORK = Framework(
    name="PyTorch DDP and FSDP",
    builds={
        **dict.fromkeys(_DDP, ObjKind.PARALLEL_MODEL),
        "torch.distributed.fsdp.sharded_grad_scaler.ShardedGradScaler": ObjKind.SCALER,
    },
    no_sync=(NoSyncContext("no_sync"),),
    sync_switches=(SyncSwitch("set_requires_gradient_sync", _switches_off_sync),),
    sync_flags=(SyncFlag("require_backward_grad_sync", applied_by="prepare_for_backward", reader="DDP"),),
    wraps=(
        Wrap(
            "ddp", _ddp_message, constructors=_DDP, class_name="DistributedDataParallel", wrapper_object=True,
            hooks_at_wrap=True, short="DDP", tokens=("DistributedDataParallel",), arms_in_forward=lambda arguments: True,
            forward_decides=FORWARD_DECIDES, around_forward=AROUND_FORWARD,
        ),
        Wrap("fsdp2", _fsdp2_message, function="fully_shard", function_module="torch.distributed"),
    ),
    comm_hooks={"register_comm_hook": (1, "hook")},
    sharded_grads=(
        ShardedGrads(
            constructors=frozenset({
                "torch.distributed.fsdp.FullyShardedDataParallel",
                "torch.distributed.fsdp.fully_sharded_data_parallel.FullyShardedDataParallel",
            }),
            strategy_keyword="sharding_strategy", unsharded=frozenset({"NO_SHARD"}), default="FULL_SHARD",
            clip_method="clip_grad_norm_", short="FSDP",
            norm_clips=frozenset({"torch.nn.utils.clip_grad_norm_", "torch.nn.utils.clip_grad_norm", "torch.nn.utils.clip_grad.clip_grad_norm_"}),
        ),
    ),
)
