"""The owners an optimizer is built over, read through the module's own methods and locals (gradlint.reach)."""

import textwrap

from gradlint.linter import lint_text


def test_owners_read_through_a_method_whose_local_grows_itself_end():
    """A method that builds its parameter list by adding to a local in a loop (``params = params + [...]``) is read
    once per local: linting the file ends and finds the parameter no optimizer holds."""
    source = textwrap.dedent(
        """
        import torch
        from torch import nn

        class Agent(nn.Module):
            def __init__(self, nets):
                super().__init__()
                self.nets = nn.ModuleList(nets)
                self.temperature = nn.Parameter(torch.ones(1))
                self.optimizer = torch.optim.Adam(self.net_parameters(), lr=1e-3)

            def net_parameters(self):
                params = []
                for net in self.nets:
                    params = params + list(net.parameters())
                return params

            def update(self, x):
                self.optimizer.zero_grad()
                loss = (self.nets[0](x) / self.temperature).mean()
                loss.backward()
                self.optimizer.step()
        """
    )
    result = lint_text(source, "agent.py")
    assert result.error is None
    assert [f.code for f in result.findings] == ["GL020"]
