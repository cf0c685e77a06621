"""The generated references of docs/reference, written from their sources so they cannot drift:

- `cli.md`: every product subcommand and flag, from the `gpuplace` argparse parser (the
  development environment's `cluster` and `demo` are left out: the wheel has no such commands);
- `values.md`: every chart value, from charts/gpuplace/values.schema.json (its descriptions, else
  the comment above the key in values.yaml) with the default from values.yaml;
- `crds.md`: every field of the PlacementMap and PlacementPolicy CRDs, from the models that
  generate charts/gpuplace/crds (`placement/crd.py`).

    python -m gpuplace_dev.docsref --write docs/reference    # make docs-ref
    python -m gpuplace_dev.docsref --check docs/reference    # exit 1 when a file is stale

The generation reads no environment: the variables that the component flags take their defaults
from (`GPUPLACE_*`, `KUBECONFIG`, `NODE_NAME`, ...) are set aside while the parser is built.
"""

from __future__ import annotations

import argparse
import html
import json
import os
import pkgutil
import re
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

import gpuplace.commands
from gpuplace.cli import build_parser
from gpuplace.commands._env import EnvFlags
from placement.crd import all_crds

REPO_ROOT = Path(__file__).resolve().parents[2]
CHART = REPO_ROOT / "charts" / "gpuplace"
REFERENCE = Path("docs") / "reference"


def _header(source: str) -> str:
    return (
        f"<!-- Generated from {source} by `python -m gpuplace_dev.docsref` (make docs-ref): "
        "do not edit. -->\n\n"
    )


#: Characters Markdown would read inside raw HTML, as entities.
_MARKDOWN = {ord(c): f"&#{ord(c)};" for c in "|[]()*_\\`#!{}"}


def _entities(text: str) -> str:
    return html.escape(text, quote=False).translate(_MARKDOWN)


def _cell(text: object) -> str:
    """One Markdown table cell: a single line, its pipes kept from splitting the row. Outside code
    a backslash does it; inside code only an HTML entity reads the same on GitHub and in MkDocs."""
    parts = re.split(r"(`[^`]*`)", " ".join(str(text).split()))
    return "".join(
        (f"<code>{_entities(part[1:-1])}</code>" if "|" in part else part)
        if part.startswith("`") and part.endswith("`") and len(part) > 1
        else part.replace("|", "\\|")
        for part in parts
    )


def _code(value: object) -> str:
    text = value if isinstance(value, str) else json.dumps(value)
    return f"`{text}`" if text else '`""`'


# The command line.

#: EnvFlags methods: each declares a flag whose default is an environment variable.
_ENV_METHODS = ("string", "integer", "number", "switch", "toggle", "repeated")


@contextmanager
def _quiet_environment(envs: dict[argparse.Action, str]) -> Iterator[None]:
    """Builds run without the environment (so the defaults are the code's; PATH stays, for
    imports that look for programs), and records in `envs` the variable of every flag declared
    through EnvFlags."""
    saved = {k: v for k, v in os.environ.items() if k != "PATH"}
    originals = {name: getattr(EnvFlags, name) for name in _ENV_METHODS}

    def recording(method: Callable[..., None]) -> Callable[..., None]:
        def declare(self: EnvFlags, *args: Any, **kwargs: Any) -> None:
            method(self, *args, **kwargs)
            env = kwargs.get("env", args[1] if len(args) > 1 else None)
            envs[self.parser._actions[-1]] = str(env)

        return declare

    for key in saved:
        del os.environ[key]
    for name, method in originals.items():
        setattr(EnvFlags, name, recording(method))
    try:
        yield
    finally:
        for name, method in originals.items():
            setattr(EnvFlags, name, method)
        os.environ.update(saved)


def _subparsers(parser: argparse.ArgumentParser) -> argparse._SubParsersAction[Any] | None:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action
    return None


def _invocation(action: argparse.Action) -> str:
    if not action.option_strings:
        name = action.metavar or action.dest
        if isinstance(name, tuple):
            name = " ".join(name)
        shown = str(name) if action.choices is None else "{" + ",".join(action.choices) + "}"
        if action.nargs in ("+", "*"):
            shown += " ..."
        return shown if action.nargs not in ("?", "*") else f"[{shown}]"
    names = ", ".join(action.option_strings)
    if action.nargs == 0:
        return names
    if action.choices is not None:
        return f"{names} {{{','.join(str(c) for c in action.choices)}}}"
    metavar = action.metavar or action.dest.upper()
    return f"{names} {metavar}"


def _help(action: argparse.Action, prog: str) -> str:
    text = action.help or ""
    if "%(" in text:
        params = {**vars(action), "prog": prog}
        params = {
            k: v.__name__ if callable(v) and hasattr(v, "__name__") else v
            for k, v in params.items()
        }
        text = text % params
    return text


def _default(action: argparse.Action) -> str:
    default = action.default
    if default is None or default is argparse.SUPPRESS or (action.nargs == 0 and not default):
        return ""
    if isinstance(action, argparse.BooleanOptionalAction):
        return _code(action.option_strings[0 if default else 1])
    if isinstance(default, list | tuple):
        return _code(",".join(str(v) for v in default)) if default else ""
    if isinstance(default, Path):
        return _code(default.as_posix())
    return _code(default)


def _command_section(
    parser: argparse.ArgumentParser,
    words: list[str],
    summary: str,
    envs: Mapping[argparse.Action, str],
) -> list[str]:
    level = "#" * min(len(words) + 1, 4)
    out = [f"{level} `gpuplace {' '.join(words)}`", ""]
    if summary:
        out += [summary[:1].upper() + summary[1:] + ".", ""]
    if parser.description:
        description = parser.description.strip("\n")
        out += ["```text", description.rstrip(), "```", ""]
    rows = [
        a
        for a in parser._actions
        if a.help is not argparse.SUPPRESS
        and not isinstance(a, argparse._HelpAction | argparse._SubParsersAction)
    ]
    if rows:
        out += ["| argument | environment | default | description |", "| --- | --- | --- | --- |"]
        for action in rows:
            env = envs.get(action)
            out.append(
                f"| {_cell(f'`{_invocation(action)}`')} | {f'`{env}`' if env else ''} "
                f"| {_cell(_default(action))} | {_cell(_help(action, parser.prog))} |"
            )
        out.append("")
    sub = _subparsers(parser)
    if sub is not None:
        helps = {a.dest: a.help or "" for a in sub._choices_actions}
        for name, child in sorted(sub.choices.items()):
            if name in helps:
                out += _command_section(child, [*words, name], helps[name], envs)
    return out


def cli_reference() -> str:
    """docs/reference/cli.md: the product's subcommands, their flags, environment and defaults."""
    envs: dict[argparse.Action, str] = {}
    with _quiet_environment(envs):
        root = build_parser()
    product = {
        info.name
        for info in pkgutil.iter_modules(gpuplace.commands.__path__)
        if not info.name.startswith("_")
    }
    sub = _subparsers(root)
    assert sub is not None
    helps = {a.dest: a.help or "" for a in sub._choices_actions}
    out = [
        _header("the `gpuplace` parser (gpuplace/cli.py, gpuplace/commands)")
        + "# Command line reference",
        "",
        f"`gpuplace`: {root.description}",
        "",
        "`gpuplace --version` prints the version; `source <(gpuplace completion bash)` (or `zsh`)",
        "completes subcommands, flags and their values. A flag given on the command line wins over",
        "its environment variable, which wins over the default. The development environment's",
        "`gpuplace cluster` and `gpuplace demo` (dev/, [the local cluster](../local-cluster.md)) are",
        "not part of the product and not listed here.",
        "",
        "| command | what it does |",
        "| --- | --- |",
    ]
    names = sorted(name for name in sub.choices if name in product and name in helps)
    out += [f"| [`{name}`](#gpuplace-{name}) | {_cell(helps[name])} |" for name in names]
    out.append("")
    for name in names:
        out += _command_section(sub.choices[name], [name], helps[name], envs)
    return "\n".join(out).rstrip("\n") + "\n"


# The chart's values.


def _value_comments(text: str) -> dict[str, str]:
    """Dotted key path -> the comment block right above that key in values.yaml."""
    out: dict[str, str] = {}
    stack: list[tuple[int, str]] = []
    comment: list[str] = []
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            comment.append(stripped.lstrip("#").strip())
            continue
        match = re.match(r"^( *)([A-Za-z0-9_.-]+):(\s|$)", line)
        if not match:
            comment = []
            continue
        indent = len(match.group(1))
        while stack and stack[-1][0] >= indent:
            stack.pop()
        stack.append((indent, match.group(2)))
        path = ".".join(key for _, key in stack)
        if comment:
            out.setdefault(path, " ".join(c for c in comment if c))
        comment = []
    return out


def _schema_type(node: Mapping[str, Any]) -> str:
    if "$ref" in node:
        return str(node["$ref"]).rsplit("/", 1)[-1]
    kind = node.get("type", "")
    kind = " or ".join(kind) if isinstance(kind, list) else str(kind)
    if node.get("x-kubernetes-int-or-string"):
        kind = "integer or string"
    elif not kind and "anyOf" in node:
        kind = " or ".join(_schema_type(choice) for choice in node["anyOf"])
    if kind == "array" and isinstance(node.get("items"), Mapping):
        kind = f"array of {_schema_type(node['items']) or 'any'}"
    if "enum" in node:
        kind += ": " + ", ".join(_code(v) for v in node["enum"])
    low = node.get("minimum", node.get("exclusiveMinimum"))
    high = node.get("maximum")
    if low is not None or high is not None:
        kind += f" ({'' if low is None else low}..{'' if high is None else high})"
    return kind


def _lookup(values: Any, path: Sequence[str]) -> tuple[bool, Any]:
    for key in path:
        if not isinstance(values, Mapping) or key not in values:
            return False, None
        values = values[key]
    return True, values


def values_reference(chart: Path = CHART) -> str:
    """docs/reference/values.md: each value of the chart, its type, default and meaning."""
    schema = json.loads((chart / "values.schema.json").read_text())
    values_text = (chart / "values.yaml").read_text()
    values = yaml.safe_load(values_text)
    comments = _value_comments(values_text)
    out = [
        _header("charts/gpuplace/values.schema.json and values.yaml") + "# Chart values",
        "",
        "Every value of `charts/gpuplace`, as its `values.schema.json` declares it (an unknown key",
        "fails `helm install`), with its default from `values.yaml`. Types named after a definition",
        "of the schema (`resources`, `tolerations`, `duration`, ...) take the Kubernetes field of",
        "that name. Set them with `--set key=value` or a values file.",
        "",
    ]

    def rows(node: Mapping[str, Any], path: list[str]) -> Iterator[str]:
        for key, child in node.get("properties", {}).items():
            here = [*path, key]
            dotted = ".".join(here)
            description = child.get("description") or comments.get(dotted, "")
            nested = "properties" in child
            if not nested or description:
                found, default = _lookup(values, here)
                shown = _code(default) if found and not nested else ""
                yield (
                    f"| `{dotted}` | {_cell(_schema_type(child))} | {_cell(shown)} "
                    f"| {_cell(description)} |"
                )
            if nested:
                yield from rows(child, here)

    for section, node in schema.get("properties", {}).items():
        out += [f"## `{section}`", ""]
        intro = node.get("description") or comments.get(section, "")
        if intro:
            out += [intro, ""]
        out += ["| value | type | default | description |", "| --- | --- | --- | --- |"]
        out += list(rows(node, [section]))
        out.append("")
    return "\n".join(out).rstrip("\n") + "\n"


# The custom resources.


def _crd_rows(node: Mapping[str, Any], path: str, required: bool) -> Iterator[str]:
    kind = _schema_type(node)
    extras = []
    if "default" in node:
        extras.append(f"default {_code(node['default'])}")
    for key in ("minLength", "maxLength", "minItems", "maxItems", "pattern", "format"):
        if key in node:
            extras.append(f"{key} {_code(node[key])}")
    if kind and extras:
        kind += "; " + ", ".join(extras)
    yield (
        f"| `{path}` | {_cell(kind)} | {'yes' if required else ''} "
        f"| {_cell(node.get('description', ''))} |"
    )
    children = node.get("properties", {})
    inner = node.get("items", {}) if node.get("type") == "array" else {}
    if isinstance(inner, Mapping) and "properties" in inner:
        children, path = inner["properties"], f"{path}[]"
        node = inner
    wanted = set(node.get("required", []))
    for key, child in children.items():
        yield from _crd_rows(child, f"{path}.{key}", key in wanted)


def crds_reference() -> str:
    """docs/reference/crds.md: every field of each CRD's schema, with its type and meaning."""
    out = [
        _header("placement/crd.py (the CRDs of charts/gpuplace/crds)") + "# Custom resources",
        "",
        "The fields of the CRDs the chart installs, generated from the same models that validate",
        "map and policy files (`gpuplace crds` prints the CRDs themselves). `kubectl explain`",
        "shows the same descriptions in a cluster. What a schema cannot check (a device listed",
        "twice, grants) the validating webhook and the controller check: see",
        "[the PlacementMap reference](../placementmap.md) and [trust and grants](../trust.md).",
        "",
    ]
    for crd in all_crds():
        spec = crd["spec"]
        names = spec["names"]
        out += [f"## {names['kind']}", ""]
        facts = [
            f"`{crd['metadata']['name']}`",
            f"group `{spec['group']}`",
            f"scope {spec['scope']}",
            f"plural `{names['plural']}`",
        ]
        if names.get("shortNames"):
            facts.append("short names " + ", ".join(f"`{n}`" for n in names["shortNames"]))
        out += ["; ".join(facts) + ".", ""]
        for version in spec["versions"]:
            schema = version["schema"]["openAPIV3Schema"]
            served = "served" if version.get("served") else "not served"
            storage = ", stored" if version.get("storage") else ""
            subresources = ", ".join(sorted(version.get("subresources", {})))
            out += [f"### `{spec['group']}/{version['name']}` ({served}{storage})", ""]
            if schema.get("description"):
                out += [schema["description"], ""]
            if subresources:
                out += [f"Subresources: {subresources}.", ""]
            columns = version.get("additionalPrinterColumns", [])
            if columns:
                out += ["| printer column | JSON path | type |", "| --- | --- | --- |"]
                for column in columns:
                    name, path, kind = column["name"], f"`{column['jsonPath']}`", column["type"]
                    out.append(f"| {_cell(name)} | {_cell(path)} | {_cell(kind)} |")
                out.append("")
            out += ["| field | type | required | description |", "| --- | --- | --- | --- |"]
            wanted = set(schema.get("required", []))
            for key in ("spec", "status"):
                if key in schema.get("properties", {}):
                    out += list(_crd_rows(schema["properties"][key], key, key in wanted))
            out.append("")
    return "\n".join(out).rstrip("\n") + "\n"


def reference_files() -> dict[str, str]:
    """File name -> Markdown text, for docs/reference."""
    return {
        "cli.md": cli_reference(),
        "values.md": values_reference(),
        "crds.md": crds_reference(),
    }


def stale_files(directory: Path) -> list[str]:
    """The reference files in `directory` that are missing or differ from the generated ones."""
    return [
        name
        for name, text in reference_files().items()
        if not (directory / name).is_file() or (directory / name).read_text() != text
    ]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m gpuplace_dev.docsref",
        description="Write or check docs/reference from the parser, the chart and the CRDs.",
    )
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--write", metavar="DIR", type=Path, help="write the files into DIR")
    group.add_argument("--check", metavar="DIR", type=Path, help="exit 1 if DIR's files differ")
    args = parser.parse_args(argv)
    if args.check is not None:
        stale = stale_files(args.check)
        for name in stale:
            print(f"{args.check / name}: stale; run make docs-ref", file=sys.stderr)
        return 1 if stale else 0
    args.write.mkdir(parents=True, exist_ok=True)
    for name, text in reference_files().items():
        (args.write / name).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
