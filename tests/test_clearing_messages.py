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
