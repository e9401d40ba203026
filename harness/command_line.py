"""The command line of ``python -m harness``, checked before Hydra runs anything, and the stable
directory of a sweep.

``check_command_line(argv)`` composes the configuration of every point the command line (and
a ``+sweep=NAME`` preset's swept values) asks for, without running anything, and turns Hydra's
and OmegaConf's own errors into one ``ConfigError`` naming the key and what it accepts: an
unknown key or a typo (with the closest known key), a value of the wrong type, an unknown group
option. ``with_sweep_dir(argv)`` gives a sweep the directory
``results/sweeps/<preset>-<hash of its overrides>`` unless ``hydra.sweep.dir`` is given, so the
same command finds (and resumes) the same directory.
"""
from __future__ import annotations

import hashlib
from typing import Dict, List, Optional, Sequence, Tuple

from hydra._internal.utils import get_args_parser
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override
from hydra.errors import HydraException, MissingConfigException
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException, ValidationError

from harness.config import CONF_DIR
from harness.keys import allowed_text, closest_key, key_types
from harness.validate import ConfigError

#: where sweeps go unless ``hydra.sweep.dir`` is given
SWEEPS_ROOT = "results/sweeps"
#: keys that do not change a sweep's points, left out of its directory's hash
NOT_HASHED = ("overwrite", "report")
HELP_HINT = "python -m harness --help lists every key"


def _key(ov: Override) -> str:
    return ov.key_or_group


def _is_hydra(ov: Override) -> bool:
    return _key(ov) == "hydra" or _key(ov).startswith(("hydra.", "hydra/"))


def parse_overrides(overrides: Sequence[str]) -> List[Override]:
    """Hydra's parse of each override; ConfigError naming the one that does not parse."""
    parser = OverridesParser.create()
    out = []
    for text in overrides:
        try:
            out.append(parser.parse_override(text))
        except HydraException as e:  # OverrideParseException, or the grammar's syntax error
            key = text.split("=", 1)[0].lstrip("+~")
            first = str(e).splitlines()[0]
            raise ConfigError(key, text.split("=", 1)[-1], f"cannot parse this override ({first}); "
                              "values with spaces or brackets need quotes, e.g. 'selection.path=\"a b.npz\"'") from None
    return out


def _as_override(ov: Override, value: Optional[str]) -> str:
    return ov.get_key_element() if value is None else f"{ov.get_key_element()}={value}"


def _values(ov: Override) -> List[Optional[str]]:
    """The value strings one (possibly swept) override takes."""
    if ov.is_sweep_override():
        return list(ov.sweep_string_iterator())
    return [None if ov.is_delete() and ov.value() is None else ov.get_value_element_as_str()]


def _explain(e: Exception, values: Dict[str, str]) -> ConfigError:
    """Hydra's or OmegaConf's composition error as a ConfigError naming the key."""
    cause = e.__cause__ if e.__cause__ is not None else e
    if isinstance(e, MissingConfigException) and e.missing_cfg_file and e.options:
        group, _, option = e.missing_cfg_file.rpartition("/")
        return ConfigError(group, option, f"no such option; allowed: {', '.join(e.options)}")
    key = getattr(cause, "full_key", None)
    if isinstance(cause, (ConfigAttributeError, ConfigKeyError)) and key:
        near = closest_key(key)
        hint = f"did you mean {near}? " if near else ""
        return ConfigError(key, values.get(key), f"unknown key; {hint}({HELP_HINT})")
    if isinstance(cause, ValidationError) and key:
        return ConfigError(key, values.get(key), f"must be {allowed_text(key)}")
    first = (str(e).splitlines() or [type(e).__name__])[0]
    return ConfigError("command line", " ".join(f"{k}={v}" for k, v in values.items()), first)


def _leaf_keys(node, prefix: str = "") -> List[str]:
    """Dotted keys of the leaves of a plain nested dict."""
    out = []
    for k, v in node.items():
        if isinstance(v, dict):
            out += _leaf_keys(v, f"{prefix}{k}.")
        else:
            out.append(f"{prefix}{k}")
    return out


def _compose(overrides: List[str], values: Dict[str, str]) -> DictConfig:
    from hydra import compose
    try:
        cfg = compose(config_name="config", overrides=overrides, return_hydra_config=True)
    except (HydraException, OmegaConfBaseException) as e:
        raise _explain(e, values) from None
    known = set(key_types())
    tree = OmegaConf.to_container(cfg, resolve=False, throw_on_missing=False)
    for key in _leaf_keys({k: v for k, v in tree.items() if k != "hydra"}):
        if key not in known:  # appended with +KEY=VALUE
            near = closest_key(key)
            hint = f"did you mean {near}? " if near else ""
            raise ConfigError(key, values.get(key), f"unknown key; {hint}({HELP_HINT})")
    return cfg


def _sweeper_params(cfg: DictConfig) -> List[str]:
    params = OmegaConf.select(cfg, "hydra.sweeper.params") or {}
    out = []
    for k, v in params.items():
        v = ",".join(map(str, v)) if isinstance(v, ListConfig) else v
        out.append(f"{k}={v}")
    return out


def check_command_line(argv: Sequence[str]) -> None:
    """Composes every point of the command line ``argv`` (each value of each swept key, the
    others at their first value; a preset's swept values included) and raises ConfigError for
    the first unknown key, wrongly typed value or unknown group option. Help, completion and
    other config sources, and arguments Hydra's parser does not take, are left to Hydra."""
    args, unknown = get_args_parser().parse_known_args(list(argv))
    if unknown or args.help or args.hydra_help or args.shell_completion or args.info is not None \
            or args.config_name or args.config_path or args.config_dir:
        return
    from hydra import initialize_config_dir
    given = parse_overrides(args.overrides)
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3", job_name="harness"):
        first = [_as_override(ov, _values(ov)[0]) for ov in given]
        cfg = _compose(first, {_key(ov): _values(ov)[0] for ov in given})
        # the sweeper adds a preset's params; the command line's own keys take precedence
        swept: Dict[str, Tuple[Override, List[str]]] = {}
        for ov in parse_overrides(_sweeper_params(cfg)) + given:
            swept[_key(ov)] = (ov, _values(ov))
        if not any(len(vals) > 1 for _, vals in swept.values()) and not _sweeper_params(cfg):
            return
        point = {k: vals[0] for k, (_, vals) in swept.items()}
        base = {k: _as_override(ov, vals[0]) for k, (ov, vals) in swept.items()}
        _compose(list(base.values()), point)
        for key, (ov, vals) in swept.items():
            for v in vals[1:]:
                _compose([*(o for k, o in base.items() if k != key), _as_override(ov, v)], {**point, key: v})


def sweep_dir_name(overrides: Sequence[str]) -> str:
    """``<preset>-<hash>`` (``sweep-<hash>`` without a preset): the hash covers the command
    line's overrides, sorted, except Hydra's own (``hydra.*``, launchers) and ``NOT_HASHED``."""
    parsed = parse_overrides(overrides)
    task = sorted(text for text, ov in zip(overrides, parsed)
                  if not _is_hydra(ov) and _key(ov) not in NOT_HASHED)
    preset: Optional[str] = next((str(ov.value()) for ov in parsed if _key(ov) == "sweep"), None)
    digest = hashlib.sha256("\n".join(task).encode()).hexdigest()[:8]
    return f"{preset or 'sweep'}-{digest}"


def with_sweep_dir(argv: Sequence[str]) -> List[str]:
    """``argv`` plus ``hydra.sweep.dir=results/sweeps/<sweep_dir_name>`` unless it sets
    ``hydra.sweep.dir`` itself (used by a multirun only; a single run keeps results/runs/<time>)."""
    args, unknown = get_args_parser().parse_known_args(list(argv))
    if unknown or any(a.lstrip("+").startswith("hydra.sweep.dir=") for a in argv):
        return list(argv)
    extra = f"hydra.sweep.dir={SWEEPS_ROOT}/{sweep_dir_name(args.overrides)}"
    argv = list(argv)
    # beside the other overrides: argparse takes the positional overrides as one run of arguments
    at = max((i for i, a in enumerate(argv) if args.overrides and a == args.overrides[-1]), default=len(argv) - 1)
    return [*argv[: at + 1], extra, *argv[at + 1:]]
