"""Load a config: schema defaults <- YAML file <- command-line dotlist, then validate.

One path for every entry point. Unknown keys, wrong types, out-of-range values (integers beyond
`fields.INT_MAX` included), interpolations that cannot be resolved and files that are not a YAML
mapping raise `ConfigError`: one line naming the offending key or file, raised before anything is
written. `to_yaml` / `config_difference` define what a run stores (resolved values) and what a
resume compares.
"""

import dataclasses
import hashlib
import io
import math
import re
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TypeVar

import yaml
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException, ValidationError

from .checks import MAX_TOTAL_STEPS, validate  # noqa: F401  (MAX_TOTAL_STEPS: re-exported)
from .errors import ConfigError
from .fields import flagged_keys
from .schema import Config

CONFIG_DIR = Path(__file__).resolve().parent
DEFAULT_CONFIG = CONFIG_DIR / "default.yaml"


def _section_keys(full_key: str, schema: type = Config) -> str:
    """The valid keys next to `full_key` (e.g. 'train.batchsize' -> the fields of TrainConfig)."""
    node: object = schema
    parts = full_key.split(".")[:-1]
    for part in parts:
        fields = {f.name: f for f in dataclasses.fields(node)}
        if part not in fields:
            break
        node = fields[part].default_factory  # every section is a dataclass default_factory
    names = [f.name for f in dataclasses.fields(node)]
    where = ".".join(parts) or "top level"
    return f"valid keys in {where}: {', '.join(names)}"


def _one_line(e: BaseException) -> str:
    """An exception's message as one line (OmegaConf appends 'full_key: ...' lines; YAML errors span
    several)."""
    text = " ".join((str(e) or type(e).__name__).split())
    return text.split(" full_key: ")[0][:300]


def _merge(base: DictConfig, other: DictConfig, source: str, schema: type = Config) -> DictConfig:
    try:
        return OmegaConf.merge(base, other)
    except ConfigKeyError as e:
        key = getattr(e, "full_key", "") or ""
        raise ConfigError(
            f"{source}: unknown config key '{key}'. {_section_keys(key, schema)}"
        ) from None
    except ValidationError as e:
        key = getattr(e, "full_key", "") or ""
        if not key:  # a value given for a whole section
            key = next(
                (str(k) for k in other.keys() if not isinstance(other._get_node(k), DictConfig)), ""
            )
        raise ConfigError(
            f"{source}: wrong type for '{key or '(top level)'}': {_one_line(e)}"
        ) from None
    except OmegaConfBaseException as e:
        key = getattr(e, "full_key", "") or ""
        raise ConfigError(f"{source}: {key + ': ' if key else ''}{_one_line(e)}") from None


def _parse_dotlist(overrides: Sequence[str]) -> DictConfig:
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"command-line override '{item}' is not of the form key=value")
        if not item.split("=", 1)[0].strip():
            raise ConfigError(f"command-line override '{item}' names no key (key=value)")
    for item in overrides:  # one at a time, to name the one that does not parse (its value is YAML)
        try:
            item.encode("utf-8")
        # bytes the command line could not decode (a path in another encoding)
        except UnicodeEncodeError:
            key = item.split("=", 1)[0]
            raise ConfigError(
                f"command line: the value of {key} holds bytes that are not UTF-8 text "
                f"({ascii(item.split('=', 1)[1])[:80]}): config files and records are UTF-8; "
                f"rename "
                "the path or give it through a link whose name is UTF-8"
            ) from None
        try:
            OmegaConf.from_dotlist([item])
        except (OmegaConfBaseException, yaml.YAMLError) as e:
            shown = item if len(item) <= 120 else f"{item[:100]}... ({len(item)} characters)"
            raise ConfigError(f"command line: '{shown}' cannot be parsed: {_one_line(e)}") from None
    try:
        return OmegaConf.from_dotlist(list(overrides))
    except (OmegaConfBaseException, yaml.YAMLError) as e:
        key = getattr(e, "full_key", "") or ""
        raise ConfigError(f"command line: {key + ': ' if key else ''}{_one_line(e)}") from None


def _resolve_each(merged: DictConfig) -> None:
    """Resolve every interpolation on its own, so that a bad one (unset variable, missing or
    self-referencing key, bad syntax) is a ConfigError naming its key instead of an error raised
    later by whatever reads it first."""
    for key, text in _interpolated_values(merged).items():
        try:
            node = OmegaConf.select(merged, key, throw_on_resolution_failure=True)
            if isinstance(node, (DictConfig, ListConfig)):
                OmegaConf.to_container(node, resolve=True)
        except OmegaConfBaseException as e:
            raise ConfigError(f"{key}={text} cannot be resolved: {_one_line(e)}") from None


def read_config_text(path: Path) -> str:
    """A config file's text; a directory, a FIFO or other non-regular file (never opened: it could
    block), a missing, unreadable or non-UTF-8 file are ConfigErrors naming the file."""
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"{path}: is a directory, not a YAML config file")
    if path.exists() and not path.is_file():
        raise ConfigError(
            f"{path}: is not a regular file (a FIFO, socket or device), not a YAML config file"
        )
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        return path.read_bytes().decode("utf-8")
    except OSError as e:
        raise ConfigError(f"{path}: cannot read it ({e.strerror or e})") from None
    except UnicodeDecodeError as e:
        raise ConfigError(
            f"{path}: not a text (UTF-8) file (byte {e.start} is 0x{e.object[e.start]:02x})"
        ) from None


def _load_yaml(path: Path, schema: type = Config) -> DictConfig:
    """A YAML file as a mapping of sections; a directory, an unreadable or non-UTF-8 file, syntax
    errors, duplicate keys, alias bombs (OmegaConf's expansion limit) and a non-mapping top level
    are ConfigErrors naming the file."""
    text = read_config_text(path)
    mapping = f"a config is a mapping of sections ({_section_keys('x', schema)})"
    try:
        node = OmegaConf.load(
            io.StringIO(text)
        )  # its loader: duplicate keys and alias bombs are errors, no tags
    except (yaml.YAMLError, OmegaConfBaseException) as e:
        raise ConfigError(f"{path}: not a valid YAML config ({_one_line(e)})") from None
    except OSError as e:  # OmegaConf's "Invalid loaded object type: int" for a scalar file
        raise ConfigError(f"{path}: {mapping}, not {_one_line(e).rsplit(' ', 1)[-1]}") from None
    if not isinstance(node, DictConfig):
        raise ConfigError(f"{path}: {mapping}, not a {type(node).__name__}")
    sections = {
        f.name for f in dataclasses.fields(schema) if dataclasses.is_dataclass(f.default_factory)
    }
    for key in node.keys():
        if key in sections and not isinstance(node._get_node(key), DictConfig):
            raise ConfigError(
                f"{path}: '{key}' is a section ({_section_keys(f'{key}.x', schema)}), "
                f"not the value {node._get_node(key)._value()!r}"
            )
    return node


def _merged(schema: type, path: Path | None, overrides: Iterable[str]) -> DictConfig:
    """Schema defaults <- YAML at `path` <- `overrides`, every interpolation resolvable, nothing
    missing."""
    merged = OmegaConf.structured(schema)
    if path is not None:
        merged = _merge(merged, _load_yaml(path, schema), str(path), schema)
    merged = _merge(merged, _parse_dotlist(list(overrides)), "command line", schema)
    _resolve_each(merged)
    missing = sorted(OmegaConf.missing_keys(merged))
    if missing:
        raise ConfigError(
            f"required config values not set: {', '.join(missing)} (set them as key=value)"
        )
    return merged


def _to_object(merged: DictConfig, source: str):
    try:
        cfg = OmegaConf.to_object(merged)
    except OmegaConfBaseException as e:  # e.g. an interpolation whose value has the wrong type
        key = getattr(e, "full_key", "") or ""
        raise ConfigError(f"{source}: {key + ': ' if key else ''}{_one_line(e)}") from None
    cfg._interpolations = _interpolated_values(
        merged
    )  # to_yaml keeps free-text ones as written (see there)
    return cfg


def load_config(path: Path | str | None = None, overrides: Iterable[str] = ()) -> Config:
    """Schema defaults, then the YAML at `path` (default: the embedded default), then
    `overrides`."""
    path = Path(path) if path is not None else DEFAULT_CONFIG
    cfg = _to_object(_merged(Config, path, overrides), str(path))
    assert isinstance(cfg, Config)
    validate(cfg)
    return cfg


def _flatten(node, prefix: str = "") -> dict:
    out = {}
    for key, value in node.items():
        name = f"{prefix}{key}"
        out.update(_flatten(value, name + ".") if isinstance(value, dict) else {name: value})
    return out


def _has_interpolation(value) -> bool:
    if isinstance(value, list):
        return any(map(_has_interpolation, value))
    return isinstance(value, str) and "${" in value


def _interpolated_values(merged: DictConfig) -> dict:
    """{key: '${...}'} for every value given as an interpolation (e.g. `${oc.env:TOKEN}`,
    `${optim.base_lr}`)."""
    raw = _flatten(OmegaConf.to_container(merged, resolve=False))
    return {k: v for k, v in raw.items() if _has_interpolation(v)}


T = TypeVar("T")


def load_structured(
    schema: type[T],
    path: Path | str | None = None,
    overrides: Iterable[str] = (),
    validator: Callable[[T], None] | None = None,
) -> T:
    """The same merge and checks as `load_config` for any dataclass schema (e.g. `EvalConfig`): its
    defaults, then the YAML at `path` if given, then `overrides`; `validator` adds range checks."""
    path = Path(path) if path is not None else None
    cfg = _to_object(
        _merged(schema, path, overrides), str(path) if path is not None else "command line"
    )
    if validator is not None:
        validator(cfg)
    return cfg


def load_structured_text(schema: type[T], text: str, what: str = "saved settings") -> T:
    """A `schema` object from YAML text that `to_yaml` wrote (e.g. the eval_config inside a result),
    merged over the schema's defaults as a file would be; `ConfigError` naming `what` where it
    cannot be."""
    try:
        node = OmegaConf.load(io.StringIO(text))
    except (OmegaConfBaseException, yaml.YAMLError, OSError) as e:
        raise ConfigError(f"{what} cannot be read: {_one_line(e)}") from None
    if not isinstance(node, DictConfig):
        raise ConfigError(f"{what} is not a mapping of sections")
    return _to_object(_merge(OmegaConf.structured(schema), node, what, schema), what)


# The one key in which seeds of one configuration differ (tables group runs by the others; loss
# comparisons check it).
SEED_KEY = "train.seed"

# What may differ between a run's saved config and the config it is resumed with: how the run is
# executed and observed, never what it computes (the fields flagged `execution=True` in schema.py;
# the global batch has its own check, see Trainer._check_resumable).
RESUMABLE_CHANGES = flagged_keys(Config, "execution")


def _free_text(key: str, schema: type) -> bool:
    """A str field without choices (a path, a URL, a regex): the only kind of value that can carry a
    credential."""
    node, f = schema, None
    for part in key.split("."):
        fields = (
            {x.name: x for x in dataclasses.fields(node)} if dataclasses.is_dataclass(node) else {}
        )
        if part not in fields:
            return False
        f = fields[part]
        node = f.default_factory if dataclasses.is_dataclass(f.default_factory) else None
    rng = f.metadata.get("range") if f is not None else None
    return node is None and f.type in (str, "str") and (rng is None or rng.choices is None)


FINGERPRINT = re.compile(r"^# resolved sha256 (\S+) ([0-9a-f]{16})$", re.MULTILINE)


def _fingerprint(key: str, value) -> str:
    return hashlib.sha256(f"{key}={value}".encode()).hexdigest()[:16]


def to_yaml(cfg) -> str:
    """The config as YAML for config.yaml and checkpoints: the resolved values the run computes
    with, so that a resume, an evaluation or a report never depends on the environment they run in.
    A free-text value (path, URL, regex) given as an interpolation (`${oc.env:TOKEN}`) is the
    exception: it may carry a credential, so it is written as the interpolation, followed by a
    comment with a fingerprint of its value that a resume compares."""
    node = OmegaConf.structured(cfg)
    notes = []
    for key, text in sorted(getattr(cfg, "_interpolations", {}).items()):
        if _free_text(key, type(cfg)):
            notes.append(
                f"# resolved sha256 {key} {_fingerprint(key, OmegaConf.select(node, key))}\n"
            )
            OmegaConf.update(node, key, text, force_add=False)
    return OmegaConf.to_yaml(node) + "".join(notes)


def _resolved_leaves(text: str, what: str, schema: type) -> dict:
    """{key: value} of a saved or new config's YAML, interpolations resolved against this
    environment (a config written by an older version kept them all; a free-text one stays as
    written, see `to_yaml`)."""
    try:
        node = OmegaConf.load(io.StringIO(text))
        if not isinstance(node, DictConfig):
            raise ConfigError(f"{what} is not a mapping of sections")
        leaves = _flatten(OmegaConf.to_container(node, resolve=False))
    except (OmegaConfBaseException, yaml.YAMLError, OSError) as e:  # OSError: a scalar
        raise ConfigError(f"{what} cannot be read: {_one_line(e)}") from None
    for key, value in leaves.items():
        if _has_interpolation(value) and not _free_text(key, schema):
            try:
                value = OmegaConf.select(node, key, throw_on_resolution_failure=True)
                leaves[key] = (
                    OmegaConf.to_container(value, resolve=True)
                    if isinstance(value, ListConfig)
                    else value
                )
            except OmegaConfBaseException:
                pass  # unresolvable now: compared as written, so it differs from any resolved value
    return leaves


def _same(old, new) -> bool:
    # ${oc.env:...} of an older config resolves to a str
    if isinstance(old, str) and not isinstance(new, str):
        try:
            return yaml.safe_load(old) == new
        except yaml.YAMLError:
            return False
    return old == new


def saved_value_matches(saved_yaml: str, key: str, value, same: Callable | None = None) -> bool:
    """Whether `value` is what `key` held when `saved_yaml` (a run's config.yaml) was written: for a
    free-text value saved as an interpolation (`to_yaml`), the fingerprint of the value it resolved
    to then; else the saved value, compared by `same(saved, value)` if given (e.g. two spellings of
    one path). ConfigError for a YAML that cannot be read."""
    fingerprints = dict(FINGERPRINT.findall(saved_yaml))
    if key in fingerprints:
        return fingerprints[key] == _fingerprint(key, value)
    leaves = _resolved_leaves(saved_yaml, "the saved config", Config)
    return key in leaves and (
        _same(leaves[key], value) or (same is not None and bool(same(leaves[key], value)))
    )


def config_difference(
    old_yaml: str, new_yaml: str, allowed: Sequence[str] = (), schema: type = Config
) -> list[str]:
    """'key: old -> new' for every resolved value of `new_yaml` that differs from `old_yaml`, except
    the `allowed` keys; a free-text interpolation whose value changed (its fingerprint, see
    `to_yaml`) names both fingerprints. A key of the schema that one config lacks (written by a
    version before the key) counts as its schema default, the behaviour every key is added with;
    keys the schema no longer has are ignored (a key since removed). Raises ConfigError for a YAML
    that cannot be read or is not a mapping."""
    old = _resolved_leaves(old_yaml, "the saved config", schema)
    new = _resolved_leaves(new_yaml, "the new config", schema)
    if not old.keys() & new.keys():  # e.g. a bare word, which YAML reads as a mapping {word: None}
        raise ConfigError(
            f"the saved config holds none of the config's keys: {_one_line(ValueError(old_yaml))}"
        )
    defaults = _flatten(OmegaConf.to_container(OmegaConf.structured(schema), resolve=False))
    old.update({k: defaults[k] for k in new.keys() - old.keys() if k in defaults})
    new.update({k: defaults[k] for k in old.keys() - new.keys() if k in defaults})
    old_fp, new_fp = dict(FINGERPRINT.findall(old_yaml)), dict(FINGERPRINT.findall(new_yaml))
    out = []
    for k, v in sorted(new.items()):
        if k in allowed or k not in old:
            continue
        if not _same(old[k], v):
            out.append(f"{k}: {old[k]!r} -> {v!r}")
        elif old_fp.get(k, new_fp.get(k)) != new_fp.get(k):
            out.append(
                f"{k}: {v} resolves to another value than when the run was saved (sha256 "
                f"{old_fp[k]} -> "
                f"{new_fp.get(k)}: only fingerprints of free-text interpolations are stored)"
            )
    return out


def scaled_lr(cfg: Config, world_size: int) -> float:
    """The peak learning rate for this global batch, by `optim.scaling_rule` (the reference's only
    rule is sqrt)."""
    ratio = cfg.train.batch_size_per_gpu * world_size / 1024.0
    rule = cfg.optim.scaling_rule
    if rule == "sqrt_wrt_1024":
        return cfg.optim.base_lr * math.sqrt(ratio)
    if rule == "linear_wrt_1024":
        return cfg.optim.base_lr * ratio
    return cfg.optim.base_lr
