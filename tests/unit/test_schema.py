"""The config schema's room (issue 45): each key described once, by the docstring under its field, which
``fedclust check --keys`` and the config reference read; each core section checking its own ranges, stated in
its docstrings; the config file's reading in fedclust.configfile, its names still reached where they were."""

import ast
import dataclasses
import re
from pathlib import Path
from typing import Literal

import pytest

from fedclust import schema
from fedclust.cli import main
from fedclust.config import load_algorithms, load_config
from fedclust.errors import ConfigError
from fedclust.schema import (
    AttackConfig,
    Config,
    NetworkConfig,
    TrainConfig,
    WandbConfig,
    field_doc,
    key_records,
    option,
    resumable,
)

ROOT = Path(__file__).resolve().parents[2]


def core_fields():
    """``{dotted key: (the dataclass declaring it, its field)}`` of every core key."""
    out = {}

    def walk(cls, prefix):
        for f in dataclasses.fields(cls):
            if f.name == "sections":
                continue
            if isinstance(f.default_factory, type) and dataclasses.is_dataclass(f.default_factory):
                walk(f.default_factory, f"{prefix}{f.name}.")
            else:
                out[f"{prefix}{f.name}"] = (cls, f)

    walk(Config, "")
    return out


def paragraphs(doc):
    return [" ".join(p.split()) for p in re.split(r"\n\s*\n", doc) if p.strip()]


def no_stop(text):
    return text[:-1] if text.endswith(".") else text


def test_every_core_key_has_a_docstring_and_no_second_description():
    fields = core_fields()
    assert len(fields) == len([k for k in schema.valid_keys() if k.split(".")[0] in schema.CORE_KEYS])
    missing = [k for k, (cls, f) in fields.items() if not field_doc(cls, f.name).strip()]
    assert missing == [], f"core keys without a docstring under their field: {missing}"
    twice = [k for k, (cls, f) in fields.items() if f.metadata.get("help") or f.metadata.get("doc")]
    assert twice == [], f"core keys described by option(help/doc) as well as by their docstring: {twice}"


def test_check_keys_prints_each_core_keys_meaning_from_its_docstring(capsys):
    assert main(["check", "--keys"]) == 0
    lines = capsys.readouterr().out.splitlines()
    width = lines[0].index("meaning")
    printed = {line.split()[0]: line[width:] for line in lines[1:lines.index("")]}
    for key, (cls, f) in core_fields().items():
        first = no_stop(paragraphs(field_doc(cls, f.name))[0])
        want = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", first).replace("`", "")   # Markdown as plain text
        assert printed[key] == want, key
    assert printed["seed"] == "seed of every draw (data split, initial model, candidates, batches), 0 <= seed < 2^32"


def test_the_reference_gives_each_core_keys_whole_docstring():
    text = (ROOT / "docs" / "config.md").read_text()
    rows = dict(re.findall(r"^\| `([^`]+)` \| `[^|]*` \| [^|]* \| (.+) \|$", text, re.M))
    for key, (cls, f) in core_fields().items():
        whole = no_stop(" ".join(paragraphs(field_doc(cls, f.name)))).replace("|", "\\|")
        if f.metadata.get("resumable"):
            whole += " *(may change when a run continues)*"
        assert rows[key] == whole, key


def test_a_choice_is_refused_with_its_keys_one_line_meaning():
    with pytest.raises(ConfigError) as e:
        load_config(None, ["network.graph=mesh"])
    assert e.value.fix.startswith("must be one of ['complete', 'erdos_renyi', 'file', 'regular', 'ring', "
                                  "'small_world']: who can reach whom each round: complete (everyone")
    assert "`" not in e.value.fix


def _range_calls():
    """``(key, kind, bound)`` of every within / at_least / finite call of schema.py on a literal key."""
    tree = ast.parse((ROOT / "fedclust" / "schema.py").read_text())
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.args
                and node.func.id in ("within", "at_least", "finite")):
            continue
        key = node.args[0]
        if not (isinstance(key, ast.Constant) and isinstance(key.value, str)):
            continue
        if node.func.id == "within":
            yield key.value, "within", node.args[2].value
        elif node.func.id == "at_least":
            yield key.value, "at_least", node.args[2].value
        else:
            low = next((k.value.value for k in node.keywords if k.arg == "low"), 0)
            strict = next((k.value.value for k in node.keywords if k.arg == "strict"), True)
            yield key.value, "finite", f"{'>' if strict else '>='} {low:g}"


def test_each_range_a_core_section_checks_is_stated_in_its_keys_docstring():
    fields = core_fields()
    calls = list(_range_calls())
    assert len(calls) >= 24   # every range check of the core keys but the seed's and the clients', below
    for key, kind, bound in calls:
        cls, f = fields[key]
        doc = field_doc(cls, f.name)
        stated = bound if kind in ("within", "finite") else f">= {bound}"
        assert stated in doc, f"{key}: checked {kind} {stated}, which its docstring does not say"
    assert "`0 <= seed < 2^32`" in field_doc(Config, "seed") and "`>= 2`" in field_doc(Config, "clients")


# ---------------------------------------------------------------------------
# A section's keys described by docstrings, by option(help) (a plug-in's, as today's guide writes them), or not


@dataclasses.dataclass
class _Base:
    inherited: int = 1
    """a key a subclass inherits, with its docstring.

    More about it, with a [link](algorithms.md) and `code`.
    """


@dataclasses.dataclass
class _PluginSection(_Base):
    documented: float = resumable(0.5)
    """a key described by its docstring."""
    helped: int = option(3, "a key described by option's help", doc="its `fuller` meaning")
    plain: int = 7
    kind: Literal["a", "b"] = "a"
    """`a` or `b`."""

    def validate(self, cfg):
        pass


def test_a_plugin_section_may_describe_its_keys_either_way(monkeypatch):
    monkeypatch.setitem(schema.SECTIONS, "doc_plugin", _PluginSection)
    rows = {k: (d, m) for k, d, m in schema.describe_keys() if k.startswith("doc_plugin.")}
    assert rows == {"doc_plugin.inherited": ("1", "a key a subclass inherits, with its docstring"),
                    "doc_plugin.documented": ("0.5", "a key described by its docstring"),
                    "doc_plugin.helped": ("3", "a key described by option's help"),
                    "doc_plugin.plain": ("7", ""),
                    "doc_plugin.kind": ("a", "a or b")}
    records = {r["key"]: r for r in key_records(_PluginSection, "doc_plugin.")}
    assert records["doc_plugin.inherited"]["doc"] == ("a key a subclass inherits, with its docstring. More about "
                                                      "it, with a [link](algorithms.md) and `code`")
    assert records["doc_plugin.helped"]["doc"] == "its `fuller` meaning"
    assert records["doc_plugin.documented"]["resumable"] and "doc_plugin.documented" in schema.resumable_keys()
    with pytest.raises(ConfigError) as e:
        schema.check_choices(_PluginSection(kind="c"), "doc_plugin.")
    assert e.value.field == "doc_plugin.kind" and e.value.fix == "must be one of ['a', 'b']: a or b"


def test_a_section_without_source_falls_back_to_options_help():
    namespace: dict = {}
    exec("import dataclasses\nfrom fedclust.schema import option\n"
         "@dataclasses.dataclass\nclass Made:\n    x: int = option(1, 'made by exec')\n    '''not read'''\n",
         namespace)
    assert [r["help"] for r in key_records(namespace["Made"])] == ["made by exec"]


def test_option_still_needs_a_meaning():
    with pytest.raises(ValueError, match="one-line meaning"):
        option(1)


# ---------------------------------------------------------------------------
# Each core section validates itself; validate_core runs the checks in a fixed order


@pytest.mark.parametrize("section,field,value", [
    (TrainConfig, "train.lr", {"lr": 0.0}),
    (TrainConfig, "train.momentum", {"momentum": 1.0}),
    (NetworkConfig, "network.p_edge", {"p_edge": float("nan")}),
    (NetworkConfig, "network.availability", {"p_offline": 0.5, "availability": "a.npy"}),
    (AttackConfig, "attack.fraction", {"fraction": 0.5}),
    (WandbConfig, "wandb.tags", {"tags": [""]}),
])
def test_each_core_section_checks_its_own_keys(section, field, value):
    section().validate(Config())
    with pytest.raises(ConfigError) as e:
        section(**value).validate(Config())
    assert e.value.field == field and e.value.fix


def test_the_top_level_keys_are_checked_by_config_validate():
    Config().validate()
    with pytest.raises(ConfigError) as e:
        Config(participation=0.0).validate()
    assert (e.value.field, e.value.fix) == ("participation", "must lie in (0, 1]: the share of clients per round")
    assert set(schema.CORE_SECTIONS) == {"algorithm", "data", "train", "wandb", "network", "attack", "share"}
    assert all(callable(getattr(getattr(Config(), s), "validate", None)) for s in schema.CORE_SECTIONS)


@pytest.mark.parametrize("faults,first", [
    (["device=gpu", "clients=1"], "device"),                        # every key's choices first
    (["clients=1", "train.lr=0"], "clients"),                       # then the top-level keys
    (["attack.fraction=0.5", "train.lr=0"], "train.lr"),            # then each section, in Config's order
    (["network.p_drop=1", "wandb.project=a/b"], "wandb.project"),
])
def test_the_first_of_several_faults_is_named(faults, first):
    load_algorithms({})
    with pytest.raises(ConfigError) as e:
        load_config(None, faults)
    assert e.value.field == first


def test_within_reads_its_interval():
    schema.within("x", 1.0, "(0, 1]", "why")
    schema.within("x", 0.0, "[0, 0.5)", "why")
    for value, interval in [(0.0, "(0, 1]"), (0.5, "[0, 0.5)"), (float("nan"), "[0, 1]"), (float("inf"), "[0, 1]")]:
        with pytest.raises(ConfigError):
            schema.within("x", value, interval, "why")
    with pytest.raises(ConfigError) as e:
        schema.within("x", 2.0, "[0, 1)", "(0: none)")
    assert e.value.fix == "must lie in [0, 1) (0: none)"


def test_a_section_may_not_hide_a_config_method():
    with pytest.raises(ValueError, match="validate"):
        schema.register_section("validate", _PluginSection)
    assert "validate" not in schema.SECTIONS


# ---------------------------------------------------------------------------
# The config file's reading lives in fedclust.configfile, above the schema; fedclust.config re-exports both


def test_the_config_file_names_are_reached_from_fedclust_config():
    import fedclust.config
    from fedclust import configfile

    for name in ("dump", "parse", "parse_override", "read_yaml", "set_key"):
        assert getattr(fedclust.config, name) is getattr(configfile, name), name
    for name in ("SECTIONS", "AlgorithmConfig", "Config", "DataConfig", "TrainConfig", "WandbConfig", "key_records",
                 "one_of", "to_dict", "valid_keys", "validate_core"):
        assert getattr(fedclust.config, name) is getattr(schema, name), name
    assert not hasattr(schema, "parse")   # the schema names no config file: nothing runs back up
