"""The run's keys as a user sees them: name, default, one-line description and allowed values,
generated from the config schema (``harness.config``: the dataclasses and ``CORE_FIELDS``, whose
source comments are the descriptions) and the validation rules (``harness.validate``), never
maintained by hand. ``python -m harness --help`` prints ``help_text()``; the command-line checks
use ``all_keys`` and ``closest_key`` to name a mistyped key's likely meaning.
"""
from __future__ import annotations

import dataclasses
import difflib
import inspect
import io
import re
import tokenize
import typing
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

from omegaconf import OmegaConf

from harness import config as config_mod
from harness.config import CONF_DIR, CORE_FIELDS, SWEEPS_DIR, run_config_class

#: config groups chosen with ``group=option`` (each also a node of keys, except ``sweep``)
YAML_GROUPS = ("model", "selection", "timing")


@dataclass(frozen=True)
class Key:
    name: str          # dotted key, e.g. hisparse.copy_engine
    default: str       # as written on the command line; "model's" for ${model.*} defaults
    description: str   # the schema's comment
    allowed: str       # what validation accepts


def _comment(line: str) -> str:
    """The trailing ``# ...`` comment of one source line ('' if none)."""
    try:
        for tok in tokenize.generate_tokens(io.StringIO(line).readline):
            if tok.type == tokenize.COMMENT:
                return tok.string.lstrip("#").strip()
    except (tokenize.TokenError, IndentationError, SyntaxError):
        pass
    return ""


def field_comments(cls) -> Dict[str, str]:
    """Field -> description of a dataclass, from its source: the comment after the field, or
    the ``#:`` lines right above it."""
    lines, _ = inspect.getsourcelines(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    out: Dict[str, str] = {}
    for i, line in enumerate(lines):
        m = re.match(r"\s+(\w+)\s*:", line)
        if not m or m.group(1) not in names or m.group(1) in out:
            continue
        text = _comment(line)
        j = i - 1
        above: List[str] = []
        while not text and j >= 0 and lines[j].strip().startswith("#:"):
            above.insert(0, lines[j].strip()[2:].strip())
            j -= 1
        out[m.group(1)] = text or " ".join(above)
    return out


def core_comments() -> Dict[str, str]:
    """Key -> description of the run's own keys (the comments of ``CORE_FIELDS``' entries)."""
    src = inspect.getsource(config_mod)
    body = src[src.index("CORE_FIELDS = ["):]
    body = body[: body.index("\n]")]
    out = {}
    for line in body.splitlines():
        m = re.match(r'\s*\(\s*"(\w+)"', line)
        if m:
            out[m.group(1)] = _comment(line)
    return out


def _default(f: dataclasses.Field) -> str:
    if f.default is not dataclasses.MISSING:
        v = f.default
    elif f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        v = f.default_factory()  # type: ignore[misc]
    else:
        return "required"
    if isinstance(v, str) and v.startswith("${model."):
        return f"the model's {v[len('${model.'):-1]}"
    if v is None:
        return "null"
    if isinstance(v, bool):
        return str(v).lower()
    return str(v)


def _type_text(tp) -> str:
    """Allowed values from a field's type, for keys validation has no rule for."""
    args = typing.get_args(tp)
    if typing.get_origin(tp) is typing.Union and type(None) in args:
        inner = [a for a in args if a is not type(None)]
        return f"{_type_text(inner[0])} or null"
    if typing.get_origin(tp) in (list, List):
        return f"a list [{_type_text(args[0]) if args else 'value'}, ...]"
    return {bool: "true or false", int: "an integer", float: "a number", str: "a string"}.get(tp, str(tp))


def allowed_text(key: str, tp=None) -> str:
    """What ``key`` accepts, in words: the validation rule when there is one, else its type."""
    from harness import validate as v
    if key in v.CHOICES:
        return "one of " + ", ".join(map(str, v.CHOICES[key]))
    if key == "page_size":
        return "a power of two"
    if key in v.POSITIVE_INTS:
        return "an integer >= 1"
    if key in v.FRACTIONS:
        return "a fraction in [0, 1]"
    if key in v.NON_NEGATIVE:
        return "a number >= 0"
    if tp is None:
        tp = key_types().get(key)
    return _type_text(tp) if tp is not None else "see README.md"


def key_types() -> Dict[str, object]:
    """Dotted key -> declared type, for every key of the run's schema."""
    out: Dict[str, object] = {}

    def walk(cls, prefix: str) -> None:
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            tp = hints.get(f.name, f.type)
            if dataclasses.is_dataclass(tp):
                walk(tp, f"{prefix}{f.name}.")
            else:
                out[prefix + f.name] = tp
    walk(run_config_class(), "")
    return out


def keys() -> List[Key]:
    """Every key of the run's schema, the run's own keys first, then each node's."""
    run_cls = run_config_class()
    core = core_comments()
    out: List[Key] = []
    nested = []
    hints = typing.get_type_hints(run_cls)
    for f in dataclasses.fields(run_cls):
        tp = hints.get(f.name, f.type)
        if dataclasses.is_dataclass(tp):
            nested.append((f.name, tp))
            continue
        if f.name == "phase":  # the old name of scenario, kept working but not advertised
            continue
        out.append(Key(f.name, _default(f), core.get(f.name, ""), allowed_text(f.name, tp)))
    for node, cls in nested:
        comments = field_comments(cls)
        sub_hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            key = f"{node}.{f.name}"
            if key == "selection.source":  # chosen with the group: selection=synthetic|trace|indexer
                continue
            out.append(Key(key, _default(f), comments.get(f.name, ""),
                           allowed_text(key, sub_hints.get(f.name, f.type))))
    return out


def all_keys() -> List[str]:
    """Every dotted key and group name a command line may set (for suggestions)."""
    return [k.name for k in keys()] + list(YAML_GROUPS) + ["sweep"]


def closest_key(key: str) -> Optional[str]:
    """The known key most like ``key`` (a typo's likely meaning), or None."""
    names = all_keys()
    hit = difflib.get_close_matches(key, names, n=1, cutoff=0.6)
    if not hit and "." in key:  # e.g. hisparse.copy_engin: match within the node first
        node = key.split(".")[0]
        hit = difflib.get_close_matches(key, [n for n in names if n.startswith(node + ".")], n=1, cutoff=0.5)
    return hit[0] if hit else None


def group_options() -> Dict[str, Tuple[str, ...]]:
    """Config group -> its options (``model=tiny``, ``+sweep=page_topk``, ...)."""
    from harness.scenarios import SCENARIOS
    out = {g: tuple(sorted(p.stem for p in (CONF_DIR / g).glob("*.yaml"))) for g in YAML_GROUPS}
    out["scenario"] = tuple(SCENARIOS)
    out["sweep"] = tuple(sorted(p.stem for p in SWEEPS_DIR.glob("*.yaml")))
    return out


def _preset_summary(name: str, width: int = 100) -> str:
    """``sweeps/NAME.yaml`` in one line: the keys it sweeps, then the first sentence of its
    leading comment (cut at ``width`` characters)."""
    path = SWEEPS_DIR / f"{name}.yaml"
    comment = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        comment.append(line.lstrip("#").strip())
    text = " ".join(comment).split(". ")[0].rstrip(".")
    if len(text) > width:
        text = text[: width - 3].rsplit(" ", 1)[0] + "..."
    params = OmegaConf.select(OmegaConf.load(path), "hydra.sweeper.params") or {}
    axes = " x ".join(str(k) for k, v in params.items() if "," in str(v))
    return f"sweeps {axes}: {text}" if axes else text


def help_text() -> str:
    """The body of ``python -m harness --help``: usage, groups, presets and every key."""
    groups = group_options()
    lines = [
        "Usage:",
        "  python -m harness [KEY=VALUE ...]               one point (results/runs/<time>/)",
        "  python -m harness -m KEY=A,B,C [KEY=VALUE ...]  a sweep over the listed values",
        "  python -m harness +sweep=NAME [KEY=VALUE ...]   a preset sweep (sweeps/NAME.yaml)",
        "A sweep's directory is results/sweeps/<preset>-<hash of its overrides>: the same command",
        "resumes it (points already done are skipped), overwrite=true re-runs every point,",
        "results/sweeps/latest links the last one. Exit codes: 0 every point ran and none is",
        "error or incorrect; 1 some point is error or incorrect; 2 bad input, nothing ran.",
        "",
        "== Presets (+sweep=NAME) ==",
    ]
    width = max(len(n) for n in groups["sweep"]) + 2
    lines += [f"  {n:<{width}}{_preset_summary(n)}" for n in groups["sweep"]]
    lines += ["", "== Config groups (GROUP=OPTION) =="]
    lines += [f"  {g:<11}{', '.join(opts)}" for g, opts in groups.items() if g != "sweep"]
    lines += ["", "== Keys (KEY=VALUE; default in brackets) =="]
    ks = keys()
    width = max(len(k.name) for k in ks) + 2
    for k in ks:
        lines.append(f"  {k.name:<{width}}{k.description} [{k.default}]; allowed: {k.allowed}")
    return "\n".join(lines).replace("$", "$$")  # Hydra fills its help template with string.Template
