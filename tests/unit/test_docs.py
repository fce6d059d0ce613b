"""The documentation cannot drift from the code: the config reference is
generated from the schema and must be current, the README stays a front
door, and every relative link in README.md and docs/ resolves."""

import re
from pathlib import Path

from fedclust.config import REFERENCE_COMMAND, reference_markdown

ROOT = Path(__file__).resolve().parents[2]
DOCS = sorted((ROOT / "docs").glob("*.md"))


def test_the_config_reference_is_current():
    want = reference_markdown()
    got = (ROOT / "docs" / "config.md").read_text()
    assert got == want, f"docs/config.md is out of date: run `{REFERENCE_COMMAND}`"


def test_the_reference_names_every_key_with_its_meaning():
    from test_config import builtin_keys   # not the sections of plug-ins other tests of this process loaded

    text = (ROOT / "docs" / "config.md").read_text()
    rows = dict(re.findall(r"^\| `([^`]+)` \| `[^|]*` \| [^|]* \| (.+) \|$", text, re.M))
    assert sorted(rows) == sorted(builtin_keys())
    assert all(meaning.strip() for meaning in rows.values())


def test_the_readme_is_a_front_door_whose_first_commands_stay_first():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 300
    fences = [i for i, line in enumerate(lines) if line.startswith("```")]
    first, second = lines[fences[0] + 1], lines[fences[2] + 1]
    assert "fedclust run configs/" in first and "pip install" in first
    assert "pytest" in second and "pip install" in second


def test_every_relative_link_resolves():
    for doc in [ROOT / "README.md", *DOCS]:
        text = doc.read_text()
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue
            path = target.split("#", 1)[0]
            assert (doc.parent / path).exists(), f"{doc.name} links to {target}, which does not exist"
