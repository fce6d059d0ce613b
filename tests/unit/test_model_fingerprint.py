"""What a resume is tied to for your own model (fedclust.models.user.model_fingerprint): the model's definition
in its file (the class or factory, and what it uses there) and its parameters' names and shapes, not every byte
of the file; checkpoints written before fingerprints were kept are compared by the file's SHA-256, as then.
The whole run (finished, extended after an unrelated edit, refused after an edit of the model) is
tests/integration/test_user_model_runs.py's."""

from __future__ import annotations

import hashlib
import textwrap

import pytest

from fedclust import checkpoint
from fedclust.models.user import definition, file_sha256, model_fingerprint

SHAPE, CLASSES = (6,), 3

MODEL = textwrap.dedent('''\
    """A model file."""
    import math

    import torch
    from torch import nn

    WIDTH = 8


    def act(x):
        return torch.relu(x)


    class Net(nn.Module):
        """Linear, act, Linear."""

        def __init__(self, input_shape, num_classes):
            super().__init__()
            self.fc = nn.Linear(math.prod(input_shape), WIDTH)
            self.out = nn.Linear(WIDTH, num_classes)

        def forward(self, x):
            return self.out(act(self.fc(torch.flatten(x, 1))))


    def factory(input_shape, num_classes):
        return Net(input_shape, num_classes)
    ''')


def fingerprint(tmp_path, text, name="Net", file="model.py", classes=CLASSES):
    path = tmp_path / file          # a new file name each time: a file is imported once per process
    path.write_text(text)
    return model_fingerprint(f"{path}:{name}", SHAPE, classes)


@pytest.mark.parametrize("name", ["Net", "factory"])
def test_edits_that_leave_the_model_as_it_was_keep_its_fingerprint(tmp_path, name):
    base = fingerprint(tmp_path, MODEL, name, "a.py")
    same = {
        "a comment": MODEL.replace("WIDTH = 8", "WIDTH = 8   # hidden units") + "\n# edited after the run\n",
        "an unrelated class": MODEL + "\n\nclass Other(nn.Module):\n    pass\n",
        "docstrings": MODEL.replace('"""Linear, act, Linear."""', '"""Two layers."""')
                           .replace('"""A model file."""', '"""Mine."""'),
        "the order of definitions": MODEL.replace("WIDTH = 8\n", "").replace("import math\n",
                                                                            "import math\n\nWIDTH = 8\n"),
        "a script block": MODEL + "\nif __name__ == '__main__':\n    print(Net((6,), 3))\n",
    }
    for i, (what, text) in enumerate(same.items()):
        assert fingerprint(tmp_path, text, name, f"same{i}.py") == base, what


@pytest.mark.parametrize("name", ["Net", "factory"])
def test_edits_of_the_model_or_what_it_uses_change_its_fingerprint(tmp_path, name):
    base = fingerprint(tmp_path, MODEL, name, "b.py")
    other = {
        "its forward": MODEL.replace("return self.out(act(", "return 2 * self.out(act("),
        "a function it calls": MODEL.replace("torch.relu(x)", "torch.tanh(x)"),
        "a constant it uses (and so its shapes)": MODEL.replace("WIDTH = 8", "WIDTH = 9"),
        "an import it uses": MODEL.replace("from torch import nn", "import torch.nn as nn"),
    }
    for i, (what, text) in enumerate(other.items()):
        assert fingerprint(tmp_path, text, name, f"other{i}.py") != base, what
    assert fingerprint(tmp_path, MODEL, name, "b.py", classes=4) != base     # other shapes


def test_the_definition_reaches_what_the_factory_uses_and_nothing_else(tmp_path):
    path = tmp_path / "m.py"
    path.write_text(MODEL + "\n\nclass Other(nn.Module):\n    pass\n")
    text = "\n".join(definition(str(path), "factory"))
    for name in ("'factory'", "'Net'", "'act'", "'WIDTH'", "'math'", "'nn'", "'torch'"):
        assert name in text, name
    assert "'Other'" not in text
    path.write_text("def broken(:\n")                 # Python cannot parse it: the whole file counts
    assert definition(str(path), "Net") == [hashlib.sha256(b"def broken(:\n").hexdigest()]


def _inputs(path, spec_fingerprint):
    return {"model": {"path": str(path), "sha256": file_sha256(str(path)), **spec_fingerprint}}


def test_a_resume_compares_the_fingerprint_and_an_older_checkpoint_the_files_bytes(tmp_path):
    path = tmp_path / "m.py"
    path.write_text("x = 1\n")
    then_sha = file_sha256(str(path))
    path.write_text("x = 1\n# a comment\n")
    now = _inputs(path, {"fingerprint": "f" * 64})
    assert checkpoint.changed_inputs({"model": {"path": str(path), "sha256": then_sha, "fingerprint": "f" * 64}},
                                     now) is None                          # same model, another file
    why = checkpoint.changed_inputs({"model": {"path": str(path), "sha256": then_sha, "fingerprint": "e" * 64}}, now)
    assert why is not None and str(path) in why and "changed" in why and "fingerprint eeeeeeeeeeee..." in why
    old = checkpoint.changed_inputs({"model": {"path": str(path), "sha256": then_sha}}, now)   # before fingerprints
    assert old is not None and "changed (sha256" in old
    assert checkpoint.changed_inputs({"model": {"path": str(path), "sha256": now["model"]["sha256"]}}, now) is None


def test_file_sha256_reads_in_chunks_as_hashlib_does_whole(tmp_path):
    path = tmp_path / "big.bin"
    data = bytes(range(256)) * (3 * 4096 + 7)           # 3 MiB and a bit: several 1 MiB chunks
    path.write_bytes(data)
    assert file_sha256(str(path)) == hashlib.sha256(data).hexdigest()
