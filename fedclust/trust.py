"""Code that a run directory or an export names, and when reading them may import it (docs/running.md, "Sharing
runs and exports").

Reading a run or an export (``fedclust evaluate``, ``fedclust export``, :func:`fedclust.load_client_model`) never
imports a Python file unless the user allows it (``--trust-code``, ``trust_code=True``), as Hugging Face's
``trust_remote_code``: a checkpoint's config may name plugins and a user model, a manifest a user model, and a
directory handed over by someone else may name any file.  Without trust, the error names each file that would be
imported.  With trust, a user model's file is imported only when it is the run's own: its definition in the file
(:func:`fedclust.models.definition_sha256`, read from the text) or its bytes match the record; once built, its
fingerprint (the one a resume compares) must match too.  A checksum proves a file whole, not who wrote it: it
is no reason to trust the code a run names.
"""

from __future__ import annotations

from pathlib import Path

from fedclust.errors import FedclustError
from fedclust.models import definition_sha256, file_sha256, is_user_model, model_fingerprint, source_file


class UntrustedCode(FedclustError):
    """Reading a run or an export would import code the user has not allowed, or code that is not the run's."""


ALLOW = "fedclust evaluate/export --trust-code, or trust_code=True in Python (fedclust.load_client_model)"


def code_in_config(raw: dict) -> list[tuple[str, str]]:
    """``(key, target)`` of every piece of code a saved config names: each of its ``plugins`` and a user model."""
    plugins = raw.get("plugins") or []
    named = [("plugins", str(p)) for p in ([plugins] if isinstance(plugins, str) else plugins)]
    model = raw.get("model")
    if isinstance(model, str) and is_user_model(model):
        named.append(("model", model))
    return named


def _shown(target: str) -> str:
    """A target as a user finds it: a ``.py`` file with the absolute path it resolves to here."""
    path = target.rpartition(":")[0] if is_user_model(target) else target
    if not path.endswith(".py"):
        return f"{target} (a Python module)"
    full = str(Path(path).expanduser().resolve())
    return target if full == path else f"{target} ({full})"


def require_trust(where: str, named: list[tuple[str, str]], trust_code: bool) -> None:
    """Refuse to read ``where`` when it names code (``named``, :func:`code_in_config`) and the user has not
    allowed it: the error names each file."""
    if not named or trust_code:
        return
    each = "; ".join(f"{key}: {_shown(target)}" for key, target in named)
    raise UntrustedCode(f"{where} names code that reading it would import and run ({each}); fedclust imports "
                        f"code named by a run or an export only when you allow it: read those files, then use "
                        f"{ALLOW}")


def check_model_file(spec: str, record: dict | None, where: str) -> None:
    """Before a trusted user model's ``.py`` file is imported: it must be the one the run used.  ``record``: what
    the run kept of it (a checkpoint's ``inputs["model"]``, a manifest's ``model``: ``sha256`` of the file,
    ``definition_sha256``).  Passes when the bytes match, or the definition does (an edit elsewhere in the file);
    a record of neither (a run of an earlier fedclust) leaves the fingerprint check after the import."""
    path = source_file(spec)
    if path is None or not record:   # a module name: Python finds it; its fingerprint is checked once built
        return
    if not path.is_file():
        raise UntrustedCode(f"{where}: the user model's file {path} is not there; put the run's model file back at "
                            "that path (it is named relative to where you run fedclust)")
    if record.get("sha256") == file_sha256(str(path)):
        return
    want = record.get("definition_sha256")
    if want is None:
        return
    if definition_sha256(path, spec.rpartition(":")[2]) != want:
        raise UntrustedCode(f"{where}: the user model in {path} is not the run's: its definition changed since the "
                            f"run (definition sha256 {want[:12]}... recorded); nothing was imported. Restore the "
                            "run's file, or read the run where it is")


def check_fingerprint(spec: str, shape: tuple[int, ...], classes: int, record: dict | None, where: str) -> None:
    """After a trusted user model is built: its fingerprint (definition and parameter shapes) must match the
    record's, where the record has one."""
    want = (record or {}).get("fingerprint")
    if not is_user_model(spec) or want is None:
        return
    got = model_fingerprint(spec, shape, classes)
    if got != want:
        raise UntrustedCode(f"{where}: the user model {spec} is not the run's: its fingerprint (definition and "
                            f"parameter shapes) is {got[:12]}..., the run recorded {want[:12]}...; restore the run's "
                            "model file")
