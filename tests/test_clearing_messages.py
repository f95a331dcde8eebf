"""What GL003's messages name: the line a reader must change next."""

from __future__ import annotations

import textwrap

from gradlint.linter import lint_text

# Reduced from PreDiff's VAE training_step (manual optimization, two optimizers, each cleared every micro-batch).
TWO_OPTIMIZERS = textwrap.dedent(
    """\
    import lightning.pytorch as pl


    class VAE(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.automatic_optimization = False

        def training_step(self, batch, batch_idx):
            g_opt, d_opt = self.optimizers()
            aeloss = self.loss(batch, 0)
            g_opt.zero_grad()
            self.manual_backward(aeloss)
            if (batch_idx + 1) % self.accumulate_grad_batches == 0:
                g_opt.step()
            discloss = self.loss(batch, 1)
            d_opt.zero_grad()
            self.manual_backward(discloss)
            if (batch_idx + 1) % self.accumulate_grad_batches == 0:
                d_opt.step()
    """
)


def test_gl003_names_the_undivided_backward_after_its_clear():
    findings = {f.line: f.message for f in lint_text(TWO_OPTIMIZERS, "vae.py").findings if f.code == "GL003"}
    assert sorted(findings) == [12, 17]
    assert "divide the loss of the backward at line 13 " in findings[12]
    assert "divide the loss of the backward at line 18 " in findings[17]


def _accumulating_loop(optimizer: str, imports: str = "import torch") -> str:
    return imports + textwrap.dedent(
        f"""


        def train(model, loader, accum):
            optimizer = {optimizer}
            for i, (x, y) in enumerate(loader):
                loss = torch.nn.functional.mse_loss(model(x), y)
                loss.backward()
                if (i + 1) % accum == 0:
                    optimizer.step()
                    optimizer.zero_grad()
        """
    )


def _gl004_message(text: str) -> str:
    messages = [f.message for f in lint_text(text, "train.py").findings if f.code == "GL004"]
    assert len(messages) == 1, messages
    return messages[0]


def test_gl004_says_the_step_is_too_large_for_sgd():
    message = _gl004_message(_accumulating_loop("torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)"))
    assert message.endswith("each step of `SGD` is that many times too large")


def test_gl004_says_an_adaptive_optimizer_barely_changes_its_step():
    for built, imports, name in [
        ("torch.optim.AdamW(model.parameters(), lr=1e-4)", "import torch", "AdamW"),
        ("FusedAdam(model.parameters(), lr=1e-4)", "import torch\nfrom apex.optimizers import FusedAdam", "FusedAdam"),
        ("bnb.optim.AdamW8bit(model.parameters())", "import torch\nimport bitsandbytes as bnb", "AdamW8bit"),
        ("Lion(model.parameters(), lr=1e-4)", "import torch\nfrom lion_pytorch import Lion", "Lion"),
    ]:
        message = _gl004_message(_accumulating_loop(built, imports))
        assert f"`{name}` divides its update by the gradient's scale, so its steps barely change" in message
        assert "gradient clipping thresholds, `eps` and logged gradient norms" in message
        assert "each step" not in message


def test_gl004_says_both_when_the_optimizer_is_unknown():
    for built in ("create_optimizer(model)", "torch.optim.AdamW(model.parameters()) if accum > 1 else torch.optim.SGD(model.parameters(), lr=0.1)"):
        message = _gl004_message(_accumulating_loop(built))
        assert "with an optimizer that steps in proportion to the gradient (SGD) each step is that many times too large" in message
        assert "(Adam and its kin) the steps barely change" in message


def test_gl004_names_both_counts_of_a_wrong_divisor():
    text = textwrap.dedent(
        """\
        import torch


        def train(args, model, loader):
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            for i, (x, y) in enumerate(loader):
                loss = torch.nn.functional.mse_loss(model(x), y) / args.grad_accum
                loss.backward()
                if (i + 1) % args.accumulation_steps == 0:
                    optimizer.step()
                    optimizer.zero_grad()
        """
    )
    findings = [f for f in lint_text(text, "train.py").findings if f.code == "GL004"]
    assert [f.line for f in findings] == [7]
    assert "divided by `args.grad_accum`" in findings[0].message
    assert "every `args.accumulation_steps` micro-batches" in findings[0].message
