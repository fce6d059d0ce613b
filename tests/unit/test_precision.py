"""The ``precision`` key: the GPU flags each value sets, and nothing changed on a CPU."""

import pytest
import torch
from test_run import read_metrics, small_run

from fedclust.engine.precision import apply_precision, precision_flags
from fedclust.schema import PRECISIONS


@pytest.fixture
def restore_flags():
    before = torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32
    yield
    torch.set_float32_matmul_precision(before[0])
    torch.backends.cudnn.allow_tf32 = before[1]


@pytest.mark.parametrize("name,matmul,conv", [("default", "highest", True),   # PyTorch's own defaults
                                              ("fp32", "highest", False),
                                              ("tf32", "high", True)])
def test_each_precision_sets_its_gpu_flags(restore_flags, name, matmul, conv):
    assert precision_flags(name) == (matmul, conv)
    for other in PRECISIONS:   # whatever an earlier run in this process set, a run sets both flags
        apply_precision(other, "cuda")
        assert apply_precision(name, "cuda")
        assert torch.get_float32_matmul_precision() == matmul and torch.backends.cudnn.allow_tf32 is conv
        assert torch.backends.cuda.matmul.allow_tf32 is (matmul != "highest")


def test_a_cpu_is_left_alone(restore_flags):
    torch.set_float32_matmul_precision("highest")
    torch.backends.cudnn.allow_tf32 = True
    assert not apply_precision("tf32", "cpu") and not apply_precision("fp32", "cpu")
    assert torch.get_float32_matmul_precision() == "highest" and torch.backends.cudnn.allow_tf32 is True
    with pytest.raises(ValueError, match="precision must be one of"):
        precision_flags("bf16")


def test_tf32_on_a_cpu_warns_and_changes_no_result(tmp_path, capsys, restore_flags):
    _, plain = small_run(tmp_path, "algorithm.name=random", name="default")
    assert "precision" not in capsys.readouterr().err
    _, tf32 = small_run(tmp_path, "algorithm.name=random", "precision=tf32", name="tf32")
    assert "precision=tf32 changes nothing on a cpu" in capsys.readouterr().err
    assert plain["final_accuracy"] == tf32["final_accuracy"]
    assert ([r["accuracy"] for r in read_metrics(tmp_path / "default")]
            == [r["accuracy"] for r in read_metrics(tmp_path / "tf32")])
    assert torch.get_float32_matmul_precision() == "highest"
