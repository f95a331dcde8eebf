"""The loop model's view of gradient release: set-ups in every style, refusals, branches, no_sync."""

from __future__ import annotations

import textwrap

import libcst as cst
import pytest

from fixture_markers import FIXTURES
from gradlint.config import Config
from gradlint.linter import lint_text, needed_tokens
from gradlint.build import build_model
from gradlint.model import NO_SYNC
from gradlint.rule import BACKWARD, STEP
from gradlint.release_setups import RELEASE_TOKENS, release_polarity, runs_without_release
from gradlint.rules import RULES_BY_CODE


def model_of(source: str):
    return build_model(cst.parse_module(textwrap.dedent(source)))


def codes(source: str, select: tuple[str, ...] | None = None) -> set[str]:
    config = Config(select=select) if select else Config()
    return {f.code for f in lint_text(textwrap.dedent(source), "train.py", config).findings}


# -- set-ups, one per style

OPTIMI = """
    from optimi import AdamW, prepare_for_gradient_release
    opt = AdamW(model.parameters(), lr=1e-3, gradient_release=True)
    prepare_for_gradient_release(model, opt)
"""

HOOK = """
    import torch
    optimizer_dict = {p: torch.optim.SGD([p], lr=0.1) for p in model.parameters()}

    def optimizer_hook(parameter):
        optimizer_dict[parameter].step()
        optimizer_dict[parameter].zero_grad()

    for p in model.parameters():
        p.register_post_accumulate_grad_hook(optimizer_hook)
"""

TORCHTUNE = """
    from torchtune import training
    optim_dict = {p: torch.optim.AdamW([p]) for p in net.parameters()}
    training.register_optim_in_bwd_hooks(model=net, optim_dict=optim_dict)
"""

OPTIMIZER_IN_BACKWARD = """
    from torchtune.training import OptimizerInBackward
    optimizer = OptimizerInBackward(net.parameters(), torch.optim.AdamW, lr=1e-3)
"""

APPLY_IN_BACKWARD = """
    from torch.distributed.optim import _apply_optimizer_in_backward
    _apply_optimizer_in_backward(torch.optim.SGD, params=net.parameters(), optimizer_kwargs={"lr": 0.01})
"""


def test_optimi_setup_names_optimizer_and_model():
    setups = model_of(OPTIMI).release.setups
    assert {s.style for s in setups} == {"optimi"}
    assert {s.optimizer for s in setups} == {"opt"}
    assert {s.model for s in setups} == {"model"}


def test_optimi_keyword_false_is_no_release():
    assert model_of("opt = AdamW(model.parameters(), gradient_release=False)\n").release.setups == []


def test_hook_setup_finds_hook_optimizer_model_and_freeing():
    release = model_of(HOOK).release
    (setup,) = release.setups
    assert (setup.style, setup.optimizer, setup.model) == ("hook", "optimizer_dict", "model")
    assert setup.hook is not None and setup.hook.name.value == "optimizer_hook"
    assert setup.frees
    assert release.hooks == {setup.hook}


def test_hook_that_frees_with_none_and_lambda_hook():
    frees = model_of(HOOK.replace("optimizer_dict[parameter].zero_grad()", "parameter.grad = None")).release.setups[0]
    assert frees.frees
    kept = model_of(HOOK.replace("optimizer_dict[parameter].zero_grad()", "pass")).release.setups[0]
    assert not kept.frees
    lam = model_of("for p in model.parameters():\n    p.register_post_accumulate_grad_hook(lambda q: optimizers[q].step())\n")
    assert [s.style for s in lam.release.setups] == ["hook"]


def test_hook_that_does_not_step_is_not_release():
    source = """
        def record(param):
            norms[param] = param.grad.norm()

        for p in model.parameters():
            p.register_post_accumulate_grad_hook(record)
    """
    assert model_of(source).release.setups == []


@pytest.mark.parametrize(
    "source, style, optimizer, model",
    [
        (TORCHTUNE, "torchtune", "optim_dict", "net"),
        (OPTIMIZER_IN_BACKWARD, "torchtune", "optimizer", "net"),
        (APPLY_IN_BACKWARD, "apply_in_backward", None, "net"),
        ("wrapper = OptimizerInBackwardWrapper(model=net, optim_map=optimizers)\n", "torchtune", "optimizers", "net"),
    ],
)
def test_helper_styles(source, style, optimizer, model):
    setups = model_of(source).release.setups
    assert [(s.style, s.optimizer, s.model) for s in setups] == [(style, optimizer, model)]


def test_config_flag_is_a_setup():
    source = """
        class Recipe:
            def train(self):
                if not self._optimizer_in_bwd:
                    self.opt.step()
    """
    assert [s.style for s in model_of(source).release.setups] == ["flag"]


def test_model_that_is_a_parameter_is_left_open():
    source = """
        def attach(net, opt):
            prepare_for_gradient_release(net, opt)
    """
    (setup,) = model_of(source).release.setups
    assert setup.model is None and setup.optimizer == "opt"


def test_module_without_release_has_no_setups():
    release = model_of("for x in loader:\n    loss.backward()\n    opt.step()\n").release
    assert release.setups == [] and release.hooks == frozenset()


# -- every recognised spelling carries a prefilter token


@pytest.mark.parametrize("source", [OPTIMI, HOOK, TORCHTUNE, OPTIMIZER_IN_BACKWARD, APPLY_IN_BACKWARD])
def test_each_style_carries_a_release_token(source):
    assert model_of(source).release.setups
    assert any(token in source for token in RELEASE_TOKENS)


def test_release_rules_prefilter_on_the_release_tokens():
    # Every token of the release rules needs a release set-up's spelling, then what the rule weighs against it.
    from gradlint.rules.gradient_release import RELEASE

    assert all(RELEASE.search(token) for token in RELEASE_TOKENS)
    for code in ("GL201", "GL202", "GL203"):
        tokens = needed_tokens([RULES_BY_CODE[code]])
        assert tokens and all(isinstance(t, tuple) and t[0] is RELEASE and len(t) > 1 for t in tokens), code
    # GL302 needs what every accumulation needs, a backward and a step, or a backward and a call handed an optimizer
    # (a helper of another module that steps; MAE's ``loss_scaler(loss, optimizer, ...)`` backpropagates too, and the
    # runner reads such a call's file with a backward in its text: prefilter.text_in_context), and no wrap token: a
    # data-parallel model is spelled many ways (DDP, accelerate, Fabric, fully_shard), or wrapped by a caller in
    # another module.
    from gradlint.tokens import HANDS_AN_OPTIMIZER

    assert needed_tokens([RULES_BY_CODE["GL302"]]) == ((BACKWARD, STEP), (BACKWARD, HANDS_AN_OPTIMIZER))


def test_modules_without_release_tokens_skip_the_search_but_keep_grad_use():
    release = model_of("for p in model.parameters():\n    p.grad = None\n").release
    assert release.setups == [] and release.touches_grads
    assert not model_of("x = y.grad_fn\n").release.touches_grads


def test_release_fixtures_are_never_skipped_by_the_prefilter():
    for path in sorted((FIXTURES / "release").glob("*.py")):
        text = path.read_text(encoding="utf-8")
        if build_model(cst.parse_module(text)).release.setups:
            assert any(token in text for token in RELEASE_TOKENS), path.name


# -- branches on the release flag


@pytest.mark.parametrize(
    "test, polarity",
    [
        ("self._optimizer_in_bwd", True),
        ("not self._optimizer_in_bwd", False),
        ('cfg.get("optimizer_in_bwd", False)', True),
        ('cfg["gradient_release"]', True),
        ("optimizer_in_bwd and clip is not None", True),
        ("not optimizer_in_bwd and clip", False),
        ("optimizer_in_bwd is False", False),
        ("optimizer_in_bwd or clip", None),
        ("clip is not None", None),
        ("args.fp16", None),
    ],
)
def test_release_polarity(test, polarity):
    assert release_polarity(cst.parse_expression(test)) is polarity


def test_runs_without_release_reads_both_sides():
    flag = cst.parse_expression("self._optimizer_in_bwd")
    assert runs_without_release([(flag, "else")])
    assert not runs_without_release([(flag, "if")])
    assert runs_without_release([(cst.parse_expression("not self._optimizer_in_bwd"), "if")])
    assert not runs_without_release([(cst.parse_expression("clip"), "else")])


# -- what the rules weigh against the set-ups


def test_refusals_are_read_from_raise_and_assert_guards():
    source = """
        if cfg.optimizer_in_bwd and cfg.clip_grad_norm is not None:
            raise ValueError("no clipping with optimizer in backward")
        assert not (cfg.optimizer_in_bwd and cfg.gradient_accumulation_steps > 1)
    """
    assert model_of(source).release.refused == {"clipping", "accumulation"}


def test_a_raise_without_the_flag_refuses_nothing():
    source = """
        if cfg.clip_grad_norm is not None and cfg.gradient_accumulation_steps > 1:
            raise ValueError("unsupported")
    """
    assert model_of(source).release.refused == frozenset()


def test_scalers_autocasts_and_settings():
    source = """
        import torch
        scaler = torch.cuda.amp.GradScaler()
        off = torch.amp.GradScaler("cuda", enabled=False)
        with torch.autocast("cuda", dtype=torch.float16):
            pass
        with torch.autocast("cuda", dtype=torch.bfloat16):
            pass
        with torch.autocast("cpu"):
            pass
        with torch.cuda.amp.autocast():
            pass
        accum_steps = 4
        single_accum = 1
        acc = Accelerator(gradient_accumulation_steps=8)
        opt.optimizer_accumulation = i % 4 != 0
        prepare_for_gradient_release(model, opt)
    """
    release = model_of(source).release
    assert len(release.scalers) == 1
    assert [cst.Module([]).code_for_node(s.node) for s in release.fp16_autocasts] == [
        'torch.autocast("cuda", dtype=torch.float16)',
        "torch.cuda.amp.autocast()",
    ]
    assert len(release.accumulation_settings) == 2
    assert release.accumulating_optimizers == {"opt"}


def test_together_follows_calls_classes_and_the_module_body():
    source = """
        def build():
            prepare_for_gradient_release(model, opt)

        def train():
            clip_grad_norm_(model.parameters(), 1.0)

        def unrelated():
            clip_grad_norm_(model.parameters(), 1.0)

        class Recipe:
            def setup(self):
                pass

            def train(self):
                pass

        if __name__ == "__main__":
            build()
            train()
    """
    model = model_of(source)
    functions = {f.name.value + ("@" + str(i) if f.name.value == "train" else ""): f for i, f in enumerate(_functions(model.module))}
    build, train, unrelated = functions["build"], functions["train@1"], functions["unrelated"]
    setup, method = functions["setup"], functions["train@4"]
    release = model.release
    assert release.together(build, train)
    assert not release.together(build, unrelated)
    assert release.together(setup, method)
    assert not release.together(setup, build)
    assert release.together(None, unrelated)


def _functions(module: cst.Module) -> list[cst.FunctionDef]:
    found: list[cst.FunctionDef] = []

    class Collect(cst.CSTVisitor):
        def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
            found.append(node)

    module.visit(Collect())
    return found


# -- the attribute form of no_sync


def test_require_backward_grad_sync_is_modelled():
    source = """
        for step in range(accum):
            model.require_backward_grad_sync = step == accum - 1
            loss.backward()
    """
    events = [e for root in model_of(source).roots for e in root.events if e.kind == NO_SYNC]
    assert [e.target for e in events] == ["model"]
    assert events[0].loops  # it sits in the loop, like every event


def test_setting_grad_sync_back_on_is_not_no_sync():
    events = [e for root in model_of("model.require_backward_grad_sync = True\n").roots for e in root.events]
    assert not any(e.kind == NO_SYNC for e in events)


def test_no_sync_call_is_modelled_in_any_position():
    source = """
        for i, batch in enumerate(loader):
            ctx = ddp.no_sync() if i % 4 else contextlib.nullcontext()
            with ctx:
                loss.backward()
    """
    assert any(e.kind == NO_SYNC and e.target == "ddp" for root in model_of(source).roots for e in root.events)


# -- silent fixtures are silent because of the correct form they show


def _fixture(*parts: str) -> str:
    return FIXTURES.joinpath(*parts).read_text(encoding="utf-8")


@pytest.mark.parametrize(
    "fixture, old, new, code",
    [
        (("release", "ok_recipe_raises.py"), 'raise RuntimeError("gradient clipping', 'print("gradient clipping', "GL203"),
        (("release", "ok_recipe_raises.py"), 'raise RuntimeError("gradient accumulation', 'print("gradient accumulation', "GL202"),
        (("release", "ok_recipe_raises.py"), "if not self._optimizer_in_bwd:\n            self._scaler", "if True:\n            self._scaler", "GL201"),
        (("release", "ok_optimi_optimizer_accumulation.py"), "opt.optimizer_accumulation = ", "boundary = ", "GL202"),
        (("release", "ok_release_bf16_autocast.py"), "torch.bfloat16", "torch.float16", "GL201"),
        (("release", "ok_flag_recipe_clips_without_release.py"), "if not self._optimizer_in_bwd:", "if self._optimizer_in_bwd or True:", "GL203"),
        (("release", "ok_gan_release_generator_only.py"), "clip_grad_norm_(discriminator", "clip_grad_norm_(generator", "GL203"),
        (("release", "ok_release_off_with_clipping.py"), "gradient_release=False", "gradient_release=True", "GL203"),
        (("schedule", "ok_scheduler_under_guard.py"), "        scheduler.step()\n", "    scheduler.step()\n", "GL301"),
        (("distributed", "ok_ddp_no_sync_context.py"), "model.no_sync()", "contextlib.nullcontext()", "GL302"),
        (("distributed", "ok_fabric_no_backward_sync.py"), "fabric.no_backward_sync(model, enabled=is_accumulating)", "contextlib.nullcontext()", "GL302"),
        (("distributed", "ok_ddp_no_sync_variable.py"), "ddp.no_sync()", "contextlib.nullcontext()", "GL302"),
        (("distributed", "ok_ddp_require_backward_grad_sync.py"), "model.require_backward_grad_sync = ", "sync = ", "GL302"),
    ],
)
def test_breaking_the_correct_form_brings_the_finding_back(fixture, old, new, code):
    text = _fixture(*fixture)
    assert old in text
    assert code not in codes(text)
    assert code in codes(text.replace(old, new))


def test_per_parameter_clip_inside_the_hook_is_not_flagged_but_outside_it_is():
    text = _fixture("release", "ok_hook_steps_and_frees.py")
    assert "GL203" not in codes(text)
    moved = text.replace("    torch.nn.utils.clip_grad_norm_(param, 1.0)\n", "") + "    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\n"
    assert "GL203" in codes(moved)


def test_gl204_is_off_unless_selected():
    text = _fixture("release", "gl204_plain_loop.py")
    assert "GL204" not in codes(text)
    assert "GL204" in codes(text, select=("GL204",))


def test_a_raise_under_the_flag_alone_refuses_every_combination():
    source = """
        if cfg.get("optimizer_in_bwd", False):
            raise NotImplementedError("optimizer in backward is not supported by this recipe")
    """
    assert model_of(source).release.refused == {"clipping", "accumulation", "scaler"}


def test_gl204_stays_quiet_when_the_code_reads_gradients():
    text = _fixture("release", "gl204_plain_loop.py")
    logged = text.replace("        optimizer.step()", "        log(model.weight.grad.norm())\n        optimizer.step()")
    assert "GL204" not in codes(logged, select=("GL204",))


def test_fabric_no_backward_sync_names_the_model():
    source = "with fabric.no_backward_sync(model, enabled=is_accumulating):\n    loss.backward()\n"
    (event,) = [e for root in model_of(source).roots for e in root.events if e.kind == NO_SYNC]
    assert event.target == "model"
