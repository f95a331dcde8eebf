"""What the run's constructions of a class hand it at an argument spelled as a device (GL018's moved parameters)."""

from __future__ import annotations

import ast
import textwrap

from gradlint.device_constructions import cpu_only, device_arguments
from gradlint.python_nodes import FiledTree


def _facts(source: str) -> frozenset[str]:
    return device_arguments(FiledTree(ast.parse(textwrap.dedent(source))))


def test_a_name_bound_only_to_the_cpu_is_the_cpu():
    facts = _facts("""
        def train():
            device = torch.device("cuda")
            loss_device = torch.device("cpu")
            model = SpeakerEncoder(device, loss_device)
    """)
    assert facts == {"SpeakerEncoder:0=other", "SpeakerEncoder:1=cpu"}
    assert cpu_only(facts, "SpeakerEncoder", ("1", "loss_device"))
    assert not cpu_only(facts, "SpeakerEncoder", ("0", "device"))


def test_a_name_bound_to_another_device_on_some_path_is_not():
    facts = _facts("""
        def train(args):
            loss_device = torch.device("cpu")
            if args.gpu_loss:
                loss_device = torch.device("cuda")
            model = SpeakerEncoder(torch.device("cuda"), loss_device)
    """)
    assert not cpu_only(facts, "SpeakerEncoder", ("1", "loss_device"))


def test_a_parameter_of_the_constructing_function_is_unknown():
    facts = _facts("""
        loss_device = "cpu"

        def build(device, loss_device):
            return SpeakerEncoder(device, loss_device=loss_device)
    """)
    assert facts == {"SpeakerEncoder:0=other", "SpeakerEncoder:loss_device=other"}


def test_one_construction_elsewhere_on_another_device_decides():
    facts = _facts("""
        a = SpeakerEncoder("cuda", "cpu")
        b = SpeakerEncoder("cuda", loss_device="cuda:0")
    """)
    assert not cpu_only(facts, "SpeakerEncoder", ("1", "loss_device"))
    assert cpu_only(facts - {"SpeakerEncoder:loss_device=other"}, "SpeakerEncoder", ("1", "loss_device"))


def test_a_call_handing_no_device_is_not_noted():
    assert _facts("model = SpeakerEncoder(hidden, layers)") == frozenset()
