"""The API reference covers the public API, and every public name has a docstring.

The reference pages (docs/reference/*.md) are ``::: dotted.path`` blocks that
mkdocstrings renders from the docstrings; these tests read the docstrings with griffe,
the parser mkdocstrings uses, so "documented" means what the built page shows.
"""

from __future__ import annotations

import importlib
import inspect
import re
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import griffe
import pytest

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = ROOT / "docs" / "reference"
PACKAGE = "django_pgqueue"

#: The modules users import from; each states its public names in ``__all__``.
PUBLIC_MODULES = [
    "django_pgqueue",
    "django_pgqueue.backends",
    "django_pgqueue.cron",
    "django_pgqueue.enqueue",
    "django_pgqueue.exceptions",
    "django_pgqueue.limits",
    "django_pgqueue.models",
    "django_pgqueue.options",
    "django_pgqueue.periodic",
    "django_pgqueue.queues",
    "django_pgqueue.rate_limits",
    "django_pgqueue.rates",
    "django_pgqueue.recovery",
    "django_pgqueue.rollups",
    "django_pgqueue.registry",
    "django_pgqueue.routers",
    "django_pgqueue.signals",
    "django_pgqueue.stored_schedules",
    "django_pgqueue.testing",
    "django_pgqueue.worker",
]

_DIRECTIVE = re.compile(r"^::: (?P<path>[\w.]+)\s*$")
_MEMBERS = re.compile(r"^\s+members:\s*(?P<value>.+?)\s*$")


@dataclass(frozen=True)
class Directive:
    page: str
    path: str
    #: ``None``: every public member; ``()``: none (``members: false``).
    members: tuple[str, ...] | None


def _directives() -> list[Directive]:
    found = []
    for page in sorted(REFERENCE.glob("*.md")):
        lines = page.read_text().splitlines()
        for index, line in enumerate(lines):
            match = _DIRECTIVE.match(line)
            if not match:
                continue
            members: tuple[str, ...] | None = None
            for option in lines[index + 1 :]:
                if not option.startswith(" "):
                    break
                value = _MEMBERS.match(option)
                if value:
                    text = value["value"]
                    members = () if text == "false" else tuple(re.findall(r"\w+", text))
            found.append(Directive(page.name, match["path"], members))
    return found


@pytest.fixture(scope="module")
def package() -> griffe.Module:
    return griffe.load(PACKAGE, search_paths=[str(ROOT)], docstring_parser="google")


def _lookup(package: griffe.Module, path: str) -> griffe.Object:
    found: Any = package if path == PACKAGE else package[path.removeprefix(PACKAGE + ".")]
    return found.final_target if isinstance(found, griffe.Alias) else found


def _canonical_path(module: ModuleType, name: str) -> str:
    """Where ``module.name`` is defined (a function or class is documented there)."""
    value = getattr(module, name)
    if inspect.ismodule(value):
        return value.__name__
    if inspect.isclass(value) or inspect.isfunction(value):
        return f"{value.__module__}.{value.__qualname__}"
    return f"{module.__name__}.{name}"  # a signal, a constant: documented where it lives


def _has_docstring(obj: griffe.Object) -> bool:
    return obj.docstring is not None and bool(obj.docstring.value.strip())


def _public_names() -> list[tuple[str, str]]:
    return [
        (module_name, name)
        for module_name in PUBLIC_MODULES
        for name in importlib.import_module(module_name).__all__
    ]


def test_every_public_module_states_its_names_in_all():
    for module_name in PUBLIC_MODULES:
        module = importlib.import_module(module_name)
        assert module.__all__, module_name
        for name in module.__all__:
            assert hasattr(module, name), f"{module_name}.__all__ names {name!r}, not defined"


def test_every_reference_block_names_a_documented_object(package):
    directives = _directives()
    assert any(directive.page == "api.md" for directive in directives)
    for directive in directives:
        obj = _lookup(package, directive.path)
        assert _has_docstring(obj), f"{directive.page}: {directive.path} has no docstring"
        for member in directive.members or ():
            assert _has_docstring(obj[member]), (
                f"{directive.page}: {directive.path}.{member} is listed but has no docstring"
            )


def _is_rendered_member(member: griffe.Object | griffe.Alias) -> bool:
    """A method or property the class defines itself (not an inherited or private one)."""
    if member.name.startswith("_") or member.is_alias or member.inherited:
        return False
    return member.is_function or "property" in member.labels


def test_public_methods_of_referenced_classes_have_docstrings(package):
    """mkdocstrings leaves out a member without a docstring: it would vanish silently."""
    for directive in _directives():
        obj = _lookup(package, directive.path)
        if not obj.is_class or directive.members == ():
            continue
        for name, member in obj.members.items():
            if directive.members is not None and name not in directive.members:
                continue
            if _is_rendered_member(member):
                assert _has_docstring(member), f"{obj.path}.{name} has no docstring"


@pytest.mark.parametrize(("module_name", "name"), _public_names())
def test_public_name_is_in_the_reference_with_a_docstring(package, module_name, name):
    canonical = _canonical_path(importlib.import_module(module_name), name)
    target = _lookup(package, canonical)
    parent = canonical.rpartition(".")[0]
    rendered = {_lookup(package, d.path).path: d for d in _directives()}
    if canonical in rendered:
        assert _has_docstring(target), f"{canonical} has no docstring"
        return
    holder = rendered.get(parent)
    assert holder is not None, f"{module_name}.{name} ({canonical}) is in no reference page"
    if holder.members is None or name in holder.members:
        assert _has_docstring(target), f"{canonical} has no docstring"
    else:
        # An object without a docstring of its own (a signal): the module's describes it.
        docstring = _lookup(package, parent).docstring
        assert docstring is not None and f"``{name}``" in docstring.value, (
            f"{canonical} is neither rendered nor described in {parent}'s docstring"
        )
