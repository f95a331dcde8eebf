"""Every rule's traits and prefilter tokens, known without importing the rules.

Generated from the rule classes by ``python -m gradlint.generate``: do not edit.
``tests/test_generated.py`` fails when it is out of date.
"""

from __future__ import annotations

import re

from gradlint.findings import FixKind, Severity
from gradlint.rule_info import RuleInfo
from gradlint.tokens import BACKWARD, SCALER, STEP, AnyOf, CallNeed, Spelled, call_of  # noqa: F401

_TOKEN_1 = call_of('zero_grad')
_TOKEN_2 = Spelled('grad', '\\.(?:[\\s\\\\)]|#[^\\n]*(?![^\\n]))*grad(?!\\w)(?:[\\s\\\\)]|#[^\\n]*(?![^\\n]))*(?:\\.(?:[\\s\\\\)]|#[^\\n]*(?![^\\n]))*data(?!\\w)(?:[\\s\\\\)]|#[^\\n]*(?![^\\n]))*)?\\.(?:[\\s\\\\)]|#[^\\n]*(?![^\\n]))*(?:zero_|fill_|mul_)(?!\\w)')
_TOKEN_3 = Spelled('grad', '\\.(?:[\\s\\\\)]|#[^\\n]*(?![^\\n]))*grad(?!\\w)(?:[\\s\\\\)]|#[^\\n]*(?![^\\n]))*(?:\\.(?:[\\s\\\\)]|#[^\\n]*(?![^\\n]))*data(?!\\w)(?:[\\s\\\\)]|#[^\\n]*(?![^\\n]))*)?=(?!=)')
_TOKEN_4 = re.compile('zeros_like|(?<![\\w.])(?:0[xXoObB](?:_?0)+|(?:0(?:_?0)*(?:\\.(?:0(?:_?0)*)?)?|\\.0(?:_?0)*)(?:[eE][+-]?\\d(?:_?\\d)*)?)(?![\\w.])(?:[\\s\\\\)]|#[^\\n]*(?![^\\n]))*\\*|\\*(?:[\\s\\\\(]|#[^\\n]*(?![^\\n]))*(?<![\\w.])(?:0[xXoObB](?:_?0)+|(?:0(?:_?0)*(?:\\.(?:0(?:_?0)*)?)?|\\.0(?:_?0)*)(?:[eE][+-]?\\d(?:_?\\d)*)?)(?![\\w.])')
_TOKEN_5 = Spelled('requires_grad', '\\.[\\s\\\\]*requires_grad[\\s\\\\]*=[\\s\\\\]*False|requires_grad_[\\s\\\\]*\\([\\s\\\\]*(?:requires_grad[\\s\\\\]*=[\\s\\\\]*)?False')
_TOKEN_6 = call_of('parameters')
_TOKEN_7 = call_of('update')
_TOKEN_8 = call_of('unscale_')
_TOKEN_9 = AnyOf('post_accumulate_grad_hook', 'in_backward', 'gradient_release', 'in_bwd', 'InBackward')
_TOKEN_10 = re.compile('accum\\w*(?:[\\s\\\\]|#[^\\n]*(?![^\\n]))*=(?!=)', re.IGNORECASE)
_TOKEN_11 = re.compile('(?:zero|clear|reset)_?grad', re.IGNORECASE)
_TOKEN_12 = CallNeed('(?i)[(,]\\s*(?:\\w+\\.)*\\w*opt\\w*\\s*[,):=]', handed=True)

ALL_RULES: tuple[RuleInfo, ...] = (
    RuleInfo(
        code='GL001',
        name='missing-zero-grad',
        summary='a loop backpropagates and steps an optimizer but never clears its gradients',
        severity=Severity.ERROR,
        fix=FixKind.SAFE,
        enabled_by_default=True,
        needs=((BACKWARD, STEP),),
    ),
    RuleInfo(
        code='GL002',
        name='zero-grad-between-backward-and-step',
        summary='gradients are cleared between backward() and the step that should use them',
        severity=Severity.ERROR,
        fix=FixKind.SAFE,
        enabled_by_default=True,
        needs=((BACKWARD, STEP),),
    ),
    RuleInfo(
        code='GL003',
        name='zero-grad-in-accumulation',
        summary='the step is under an accumulation guard but the clear runs every micro-batch',
        severity=Severity.ERROR,
        fix=FixKind.SAFE,
        enabled_by_default=True,
        needs=((BACKWARD, STEP),),
    ),
    RuleInfo(
        code='GL004',
        name='unscaled-accumulated-loss',
        summary='gradients are accumulated over N micro-batches but the loss is not divided by N',
        severity=Severity.WARNING,
        fix=FixKind.UNSAFE,
        enabled_by_default=True,
        needs=((BACKWARD, STEP),),
    ),
    RuleInfo(
        code='GL005',
        name='grads-kept-allocated',
        summary='gradients are zeroed in place where set_to_none=True would free them',
        severity=Severity.WARNING,
        fix=FixKind.SAFE,
        enabled_by_default=True,
        needs=((_TOKEN_1, 'False'), _TOKEN_2, (_TOKEN_3, _TOKEN_4)),
    ),
    RuleInfo(
        code='GL006',
        name='clip-per-micro-batch',
        summary='gradients are clipped on every micro-batch of an accumulation, or after the step that used them',
        severity=Severity.WARNING,
        fix=None,
        enabled_by_default=True,
        needs=((BACKWARD, STEP, 'clip_grad'), (BACKWARD, STEP, '.grad')),
    ),
    RuleInfo(
        code='GL007',
        name='loss-divided-twice',
        summary='the loss is divided by the accumulation count by hand and again by the framework',
        severity=Severity.WARNING,
        fix=FixKind.UNSAFE,
        enabled_by_default=True,
        needs=((BACKWARD, 'gradient_accumulation_steps'), ('accumulate_grad_batches', 'training_step', 'LightningModule')),
    ),
    RuleInfo(
        code='GL008',
        name='num-items-in-batch-ignored',
        summary="a Trainer's compute_loss ignores num_items_in_batch: a token mean, or a loss nothing divides by N",
        severity=Severity.WARNING,
        fix=None,
        enabled_by_default=True,
        needs=(('compute_loss', 'num_items_in_batch'),),
    ),
    RuleInfo(
        code='GL009',
        name='optimizer-over-frozen-params',
        summary='an optimizer is built only over parameters frozen with requires_grad = False: it updates nothing',
        severity=Severity.ERROR,
        fix=None,
        enabled_by_default=True,
        needs=((_TOKEN_5, _TOKEN_6, STEP),),
    ),
    RuleInfo(
        code='GL010',
        name='loss-divided-without-accumulation',
        summary='the loss is divided by the accumulation count but the step and the clear run on every micro-batch',
        severity=Severity.ERROR,
        fix=None,
        enabled_by_default=True,
        needs=((BACKWARD, STEP, 'accum'),),
    ),
    RuleInfo(
        code='GL011',
        name='step-outside-accumulation-guard',
        summary='an optimizer steps under an accumulation guard and again on every micro-batch',
        severity=Severity.ERROR,
        fix=None,
        enabled_by_default=True,
        needs=((BACKWARD, STEP),),
    ),
    RuleInfo(
        code='GL012',
        name='optimizer-stepped-on-one-setting-branch',
        summary='an optimizer steps in one branch of a setting only: with the other value its parameters never update',
        severity=Severity.ERROR,
        fix=None,
        enabled_by_default=True,
        needs=((STEP, _TOKEN_6),),
    ),
    RuleInfo(
        code='GL013',
        name='inverted-accumulation-guard',
        summary="the step runs where the counter's remainder is not zero: on every micro-batch but the N-th",
        severity=Severity.ERROR,
        fix=None,
        enabled_by_default=True,
        needs=((BACKWARD, STEP),),
    ),
    RuleInfo(
        code='GL101',
        name='backward-without-scaler',
        summary='a GradScaler is in use but the loss is backpropagated without scaler.scale()',
        severity=Severity.ERROR,
        fix=FixKind.SAFE,
        enabled_by_default=True,
        needs=((BACKWARD, STEP, SCALER), (BACKWARD, _TOKEN_7, SCALER), (BACKWARD, _TOKEN_8, SCALER)),
    ),
    RuleInfo(
        code='GL102',
        name='step-bypasses-scaler',
        summary='a scaled backward is followed by optimizer.step() instead of scaler.step(optimizer)',
        severity=Severity.ERROR,
        fix=FixKind.SAFE,
        enabled_by_default=True,
        needs=((BACKWARD, STEP, SCALER),),
    ),
    RuleInfo(
        code='GL103',
        name='clip-before-unscale',
        summary='gradients are clipped before scaler.unscale_(optimizer)',
        severity=Severity.ERROR,
        fix=FixKind.SAFE,
        enabled_by_default=True,
        needs=((BACKWARD, 'clip', SCALER), (STEP, 'clip', SCALER)),
    ),
    RuleInfo(
        code='GL104',
        name='scaler-without-update',
        summary='scaler.step() with no scaler.update()',
        severity=Severity.ERROR,
        fix=FixKind.SAFE,
        enabled_by_default=True,
        needs=((STEP, SCALER),),
    ),
    RuleInfo(
        code='GL105',
        name='scaler-unscale-per-micro-batch',
        summary='scaler.unscale_() or scaler.update() runs on micro-batches that do not step the optimizer',
        severity=Severity.ERROR,
        fix=FixKind.SAFE,
        enabled_by_default=True,
        needs=((BACKWARD, STEP, _TOKEN_8, SCALER), (BACKWARD, STEP, _TOKEN_7, SCALER), (BACKWARD, STEP, 'accumulate', 'clip_grad', 'fp16')),
    ),
    RuleInfo(
        code='GL106',
        name='scaler-update-skipped',
        summary='scaler.update() is skipped on iterations that unscale_ or step through the scaler',
        severity=Severity.ERROR,
        fix=None,
        enabled_by_default=True,
        needs=((BACKWARD, _TOKEN_7, SCALER),),
    ),
    RuleInfo(
        code='GL107',
        name='statistic-of-scaled-gradients',
        summary='a gradient statistic (norm, histogram) is read while the gradients are still scaled',
        severity=Severity.WARNING,
        fix=None,
        enabled_by_default=True,
        needs=((BACKWARD, _TOKEN_8, SCALER),),
    ),
    RuleInfo(
        code='GL201',
        name='gradscaler-with-gradient-release',
        summary='a GradScaler or float16 autocast together with gradient release',
        severity=Severity.ERROR,
        fix=None,
        enabled_by_default=True,
        needs=((_TOKEN_9, SCALER), (_TOKEN_9, 'autocast')),
    ),
    RuleInfo(
        code='GL202',
        name='accumulation-with-gradient-release',
        summary='gradient accumulation together with gradient release',
        severity=Severity.ERROR,
        fix=None,
        enabled_by_default=True,
        needs=((_TOKEN_9, _TOKEN_10), (_TOKEN_9, BACKWARD, STEP), (_TOKEN_9, BACKWARD, _TOKEN_11), (_TOKEN_9, BACKWARD, _TOKEN_2), (_TOKEN_9, BACKWARD, _TOKEN_3)),
    ),
    RuleInfo(
        code='GL203',
        name='clipping-with-gradient-release',
        summary='gradient clipping together with gradient release',
        severity=Severity.ERROR,
        fix=None,
        enabled_by_default=True,
        needs=((_TOKEN_9, 'clip'),),
    ),
    RuleInfo(
        code='GL204',
        name='gradient-release-candidate',
        summary='a plain loop whose single optimizer could be fused into backward (gradient release)',
        severity=Severity.INFO,
        fix=FixKind.UNSAFE,
        enabled_by_default=False,
        needs=((BACKWARD, STEP),),
    ),
    RuleInfo(
        code='GL301',
        name='scheduler-steps-per-micro-batch',
        summary='an LR scheduler is stepped every micro-batch while the optimizer steps under an accumulation guard',
        severity=Severity.ERROR,
        fix=FixKind.SAFE,
        enabled_by_default=True,
        needs=((BACKWARD, STEP),),
    ),
    RuleInfo(
        code='GL302',
        name='accumulation-without-no-sync',
        summary='a data-parallel model accumulates gradients without no_sync() on the micro-batches that do not step',
        severity=Severity.WARNING,
        fix=None,
        enabled_by_default=True,
        needs=((BACKWARD, STEP), (BACKWARD, _TOKEN_12)),
    ),
    RuleInfo(
        code='GL303',
        name='ddp-model-changed-after-wrap',
        summary='a DDP model is moved to another device or cast after wrapping, or wrapped inside the training loop',
        severity=Severity.ERROR,
        fix=None,
        enabled_by_default=True,
        needs=(('DistributedDataParallel', BACKWARD),),
    ),
    RuleInfo(
        code='GL304',
        name='grad-sync-set-after-forward',
        summary='require_backward_grad_sync is set after the DDP forward it is meant for: it applies to the next one',
        severity=Severity.ERROR,
        fix=None,
        enabled_by_default=True,
        needs=(('require_backward_grad_sync', BACKWARD),),
    ),
    RuleInfo(
        code='GL305',
        name='no-sync-on-stepping-micro-batch',
        summary="no_sync() covers the micro-batch that steps, so the step's gradients are never all-reduced",
        severity=Severity.ERROR,
        fix=None,
        enabled_by_default=True,
        needs=(('no_sync', BACKWARD, STEP),),
    ),
    RuleInfo(
        code='GL306',
        name='no-sync-after-forward',
        summary='no_sync() holds only the backward: the DDP forward before it already armed the all-reduce',
        severity=Severity.WARNING,
        fix=None,
        enabled_by_default=True,
        needs=(('no_sync', BACKWARD),),
    ),
)

RULES_BY_CODE: dict[str, RuleInfo] = {rule.code: rule for rule in ALL_RULES}
