"""Docs that cannot drift: what docs/*.md and README.md write in backticks must exist in the tree.

    python -m gpuplace_dev.docscheck            # make docs; exit 1 and one line per drift

Each inline code span (fenced blocks are examples, not names) is read as one of:

- a file path: a span whose first component is a top-level entry of the tree (`controller/`,
  `tests/unit/...`, `Dockerfile`) must match a file or folder (`*` and `<placeholder>` match any
  name); a bare Python file name (`binder.py`) must be the name of some file in the tree;
- a module: a dotted name whose first component is one of the tree's Python packages
  (`bench.scale`, `gpuplace_dev.localcluster.network`) must be a module, or a name a module
  defines; when its first component is also a top-level key of the chart's values
  (`webhook.processes`), a chart value by that path is as good;
- a chart value: a dotted name whose first component is a top-level key of
  charts/gpuplace/values.yaml (`global.grants.defaultDeny`, `controller.web.enabled=true`);
- `Class.member`: a class of that name defined in the tree (Python) that has, itself or through
  a base class of the tree, a member by that name;
- a command: `gpuplace SUBCOMMAND ... --flag` must name subcommands and flags of the `gpuplace`
  parser (the development environment's `cluster` and `demo` included); `python -m MODULE ...
  --flag` a module of the tree and flags its package's parsers define; `make TARGET` a target of
  the Makefile; other tools' command lines (kubectl, helm, ...) are theirs;
- a flag (`--flag`, `--flag=value`): defined by some argparse parser of the tree, or one of
  `EXTERNAL_FLAGS`, the few flags of other tools the docs name.

Anything else (labels, condition reasons, YAML snippets) is prose and is not checked.
"""

from __future__ import annotations

import argparse
import ast
import fnmatch
import re
import subprocess
import sys
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import yaml

from gpuplace.cli import build_parser

REPO_ROOT = Path(__file__).resolve().parents[2]

#: Flags of other programs that the docs name on their own, by program. Kept small on purpose: a
#: flag of gpuplace's own must come from its parser, not from here.
EXTERNAL_FLAGS: dict[str, frozenset[str]] = {
    "kube-apiserver": frozenset(
        {"--enable-aggregator-routing", "--etcd-compaction-interval", "--runtime-config"}
    ),
    "kubectl": frozenset({"--validate", "--dry-run", "--server-side"}),
    "kube-controller-manager": frozenset({"--use-service-account-credentials"}),
    "workflow-controller (Argo Workflows)": frozenset({"--namespaced", "--managed-namespace"}),
    "gpuplace-dra-driver (hack/dra-driver, Go)": frozenset({"--taints"}),
    "helm": frozenset({"--set", "--namespace", "--create-namespace"}),
}

#: Programs whose command lines the docs quote; their words are theirs to check.
EXTERNAL_COMMANDS = frozenset(
    {
        "argocd",
        "ctr",
        "docker",
        "helm",
        "kubectl",
        "pip",
        "promtool",
        "skopeo",
        "source",
        "terraform",
    }
)

_INLINE = re.compile(r"(`+)(?!`)(.+?)(?<!`)\1(?!`)")
_FENCE = re.compile(r"^\s*(```|~~~)")
_FLAG = re.compile(r"(?<![\w-])--[A-Za-z][\w-]*")
_DOTTED = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+")
_CLASS_MEMBER = re.compile(r"([A-Z]\w*)\.([A-Za-z_]\w*)(?:\(\))?")
_PATHLIKE = re.compile(r"[\w.*<>@+-]+(?:/[\w.*<>@+-]*)*")
_PLACEHOLDER = re.compile(r"<[^>/]*>")
#: Endings that make a dotted word a file name (`placement.yaml`), not a module.
_FILE_ENDINGS = ("py", "yaml", "yml", "json", "md", "toml", "txt", "sh", "go", "lua", "log", "png")


@dataclass(frozen=True)
class Drift:
    doc: str
    line: int
    span: str
    reason: str

    def __str__(self) -> str:
        return f"{self.doc}:{self.line}: `{self.span}`: {self.reason}"


def code_spans(text: str) -> Iterator[tuple[int, str]]:
    """(line, content) of each inline code span outside fenced code blocks."""
    fenced = False
    for number, line in enumerate(text.splitlines(), start=1):
        if _FENCE.match(line):
            fenced = not fenced
            continue
        if fenced:
            continue
        for match in _INLINE.finditer(line):
            yield number, match.group(2).strip()


@dataclass
class _Class:
    members: set[str] = field(default_factory=set)
    bases: set[str] = field(default_factory=set)


def _class_of(node: ast.ClassDef) -> _Class:
    found = _Class(bases={b.id if isinstance(b, ast.Name) else ast.unparse(b) for b in node.bases})
    found.bases = {base.rsplit(".", 1)[-1].split("[")[0] for base in found.bases}
    for item in node.body:
        if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            found.members.add(item.name)
        elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
            found.members.add(item.target.id)
        elif isinstance(item, ast.Assign):
            found.members.update(t.id for t in item.targets if isinstance(t, ast.Name))
    # Attributes set in methods (self.x = ...) are members a reader can name too.
    for sub in ast.walk(node):
        if (
            isinstance(sub, ast.Attribute)
            and isinstance(sub.ctx, ast.Store)
            and isinstance(sub.value, ast.Name)
            and sub.value.id in ("self", "cls")
        ):
            found.members.add(sub.attr)
    return found


def _top_level_names(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return names


def _flag_strings(tree: ast.AST) -> set[str]:
    """The flags a module's source spells out: argparse's add_argument("--x"), and the flags a
    module reads itself (bench.placement's `("--only", "creates")`)."""
    return {
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and _FLAG.fullmatch(node.value)
    }


class Tree:
    """What the docs may name: the tree's files, Python modules, classes, parsers, chart values
    and Makefile targets."""

    def __init__(self, root: Path = REPO_ROOT, files: Iterable[str] | None = None) -> None:
        self.root = root
        self.files = sorted(set(files if files is not None else self._listed_files()))

    def _listed_files(self) -> list[str]:
        """The files git tracks or would track (new files count before they are committed)."""
        try:
            out = subprocess.run(
                ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
                cwd=self.root,
                capture_output=True,
                check=True,
            ).stdout.decode()
            return [f for f in out.split("\0") if f and (self.root / f).exists()]
        except (OSError, subprocess.CalledProcessError):
            return [str(p.relative_to(self.root)) for p in self.root.rglob("*") if p.is_file()]

    @cached_property
    def folders(self) -> set[str]:
        return {"/".join(f.split("/")[:i]) for f in self.files for i in range(1, f.count("/") + 1)}

    @cached_property
    def top_level(self) -> set[str]:
        return {f.split("/")[0] for f in self.files}

    @cached_property
    def basenames(self) -> set[str]:
        return {f.rsplit("/", 1)[-1] for f in self.files}

    @cached_property
    def modules(self) -> dict[str, str]:
        """Dotted module name -> file, for the product's packages (root) and dev/'s."""
        found: dict[str, str] = {}
        for path in self.files:
            if not path.endswith(".py"):
                continue
            name = path.removeprefix("dev/")[: -len(".py")].replace("/", ".")
            if "-" in name:
                continue
            found[name.removesuffix(".__init__")] = path
        return found

    @cached_property
    def packages(self) -> set[str]:
        return {m.split(".")[0] for m, f in self.modules.items() if f.endswith("__init__.py")}

    def _parsed(self, path: str) -> ast.Module | None:
        try:
            return ast.parse((self.root / path).read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, OSError):
            return None

    def _tree(self, path: str) -> ast.Module | None:
        if path not in self._trees:
            self._trees[path] = self._parsed(path)
        return self._trees[path]

    @cached_property
    def _trees(self) -> dict[str, ast.Module | None]:
        return {}

    @cached_property
    def classes(self) -> dict[str, list[_Class]]:
        """The classes of the product, its tooling and its benchmarks (not the tests')."""
        found: dict[str, list[_Class]] = {}
        for path in self.files:
            tree = self._tree(path) if path.endswith(".py") and path[:6] != "tests/" else None
            for node in ast.walk(tree) if tree is not None else ():
                if isinstance(node, ast.ClassDef):
                    found.setdefault(node.name, []).append(_class_of(node))
        return found

    def has_member(self, cls: str, member: str, seen: frozenset[str] = frozenset()) -> bool:
        for found in self.classes.get(cls, []):
            if member in found.members:
                return True
            if any(self.has_member(b, member, seen | {cls}) for b in found.bases - seen - {cls}):
                return True
        return False

    def package_flags(self, package: str) -> set[str]:
        files = {f for m, f in self.modules.items() if m.split(".")[0] == package}
        trees = (self._tree(f) for f in files)
        return {flag for tree in trees if tree is not None for flag in _flag_strings(tree)}

    @cached_property
    def parser_flags(self) -> set[str]:
        """Every flag of the `gpuplace` command line, its subcommands' at every depth."""
        found: set[str] = set()
        parsers = [self.parser]
        while parsers:
            parser = parsers.pop()
            found |= _options(parser)
            parsers.extend(_subcommands(parser).values())
        return found

    @cached_property
    def known_flags(self) -> set[str]:
        """What a flag on its own may be: the CLI's, the benchmarks' or another tool's known one."""
        return (
            self.parser_flags | self.package_flags("bench") | set().union(*EXTERNAL_FLAGS.values())
        )

    @cached_property
    def values(self) -> dict[str, object]:
        loaded = yaml.safe_load((self.root / "charts/gpuplace/values.yaml").read_text())
        return loaded if isinstance(loaded, dict) else {}

    @cached_property
    def make_targets(self) -> set[str]:
        text = (self.root / "Makefile").read_text()
        return {
            target
            for line in text.splitlines()
            if (m := re.match(r"^([\w. -]+):(?!=)", line))
            for target in m.group(1).split()
        }

    @cached_property
    def parser(self) -> argparse.ArgumentParser:
        return build_parser()

    def has_path(self, span: str) -> bool:
        pattern = _PLACEHOLDER.sub("*", span.rstrip("/"))
        if "*" not in pattern:
            return pattern in self.folders or (pattern in self.files and not span.endswith("/"))
        return any(fnmatch.fnmatchcase(p, pattern) for p in (*self.files, *self.folders))

    def has_value(self, dotted: str) -> bool:
        node: object = self.values
        for key in dotted.split("."):
            if not isinstance(node, dict) or key not in node:
                return False
            node = node[key]
        return True

    def has_module_name(self, dotted: str) -> bool:
        """A module, or a name defined at the top of one (a class then its members)."""
        parts = dotted.split(".")
        for cut in range(len(parts), 0, -1):
            module = ".".join(parts[:cut])
            if module not in self.modules:
                continue
            rest = parts[cut:]
            if not rest:
                return True
            tree = self._tree(self.modules[module])
            if tree is None or rest[0] not in _top_level_names(tree):
                return False
            return len(rest) == 1 or (len(rest) == 2 and self.has_member(rest[0], rest[1]))
        return False


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _options(parser: argparse.ArgumentParser) -> set[str]:
    return {option for action in parser._actions for option in action.option_strings}


def _check_gpuplace(tree: Tree, words: list[str]) -> str | None:
    parser, path = tree.parser, ["gpuplace"]
    for word in words:
        if word.startswith("-"):
            break
        commands = _subcommands(parser)
        if not commands:
            break
        if word not in commands:
            return f"{' '.join(path)} has no subcommand {word!r}"
        parser, path = commands[word], [*path, word]
    missing = sorted(set(_FLAG.findall(" ".join(words))) - _options(parser))
    return f"{' '.join(path)} has no flag {', '.join(missing)}" if missing else None


def _check_python_m(tree: Tree, words: list[str]) -> str | None:
    if len(words) < 2 or words[0] != "-m":
        return None
    module = words[1]
    if module.split(".")[0] not in tree.packages:
        return None
    if module not in tree.modules:
        return f"no module {module} in the tree"
    flags = tree.package_flags(module.split(".")[0])
    missing = sorted(set(_FLAG.findall(" ".join(words[2:]))) - flags)
    return f"{module} has no flag {', '.join(missing)}" if missing else None


def check_span(tree: Tree, span: str) -> str | None:
    """Why `span` names something the tree lacks, or None (it exists, or it is prose)."""
    command = span.split("|", maxsplit=1)[0].split()
    if not command:
        return None
    head, words = command[0], command[1:]
    if head == "gpuplace" and len(command) > 1:
        return _check_gpuplace(tree, words)
    if head in ("python", "python3") and words:
        return _check_python_m(tree, words)
    if head == "make" and words:
        missing = [w for w in words if not w.startswith("-") and w not in tree.make_targets]
        return f"the Makefile has no target {', '.join(missing)}" if missing else None
    if head in EXTERNAL_COMMANDS:
        return None
    if head.startswith("--"):
        missing = sorted(set(_FLAG.findall(span)) - tree.known_flags)
        return f"no parser of the tree defines {', '.join(missing)}" if missing else None
    if len(command) > 1:
        return None
    return _check_word(tree, span)


def _check_word(tree: Tree, span: str) -> str | None:
    word = re.split(r"[=:(\[{]", span, maxsplit=1)[0]
    if m := _CLASS_MEMBER.fullmatch(span):
        cls, member = m.groups()
        if cls not in tree.classes:
            return f"no class {cls} in the tree"
        return None if tree.has_member(cls, member) else f"class {cls} has no member {member}"
    if _PATHLIKE.fullmatch(span) and ("/" in span or "." in span):
        first = span.split("/", maxsplit=1)[0]
        if ("/" in span and first in tree.top_level) or span in tree.top_level:
            return None if tree.has_path(span) else "no such file or folder in the tree"
        if "/" not in span and span.endswith(".py") and "*" not in span:
            return None if span in tree.basenames else "no file of that name in the tree"
    if _DOTTED.fullmatch(word) and word.rsplit(".", 1)[1] not in _FILE_ENDINGS:
        first = word.split(".")[0]
        if first in tree.packages and tree.has_module_name(word):
            return None
        if first in tree.values:
            return None if tree.has_value(word) else "no such chart value (values.yaml)"
        if first in tree.packages:
            return f"no module or name {word} in the tree"
    return None


#: Pages that record the past: what they name was there at the commit each row gives.
HISTORY = frozenset({"performance-history.md"})

#: Where the tree may not point: the project's working notes outside the repository. Code and
#: docs cite docs/ pages, which ship and are checked here.
_OUTSIDE = re.compile(r"\bDESIGN\.md\b|\.\./shared/")
_TEXT_ENDINGS = (".py", ".md", ".yaml", ".yml", ".toml", ".sh", ".go", ".cfg", ".txt", ".json")


def documents(root: Path = REPO_ROOT) -> list[Path]:
    """docs/*.md but the history, and README.md."""
    pages = [p for p in sorted((root / "docs").glob("*.md")) if p.name not in HISTORY]
    return [*pages, root / "README.md"]


def outside_citations(tree: Tree) -> list[Drift]:
    """Each line of the tree's text files that cites a page outside the repository."""
    found: list[Drift] = []
    for path in tree.files:
        if not path.endswith(_TEXT_ENDINGS) and path.rsplit("/", 1)[-1] not in (
            "Makefile",
            "Dockerfile",
        ):
            continue
        try:
            text = (tree.root / path).read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        for number, line in enumerate(text.splitlines(), start=1):
            if match := _OUTSIDE.search(line):
                reason = "cites a page outside the repository: cite the docs/ page that says it"
                found.append(Drift(path, number, match.group(0), reason))
    return found


def drifts(tree: Tree, docs: Sequence[Path]) -> list[Drift]:
    found: list[Drift] = []
    for doc in docs:
        name = str(doc.relative_to(tree.root)) if doc.is_relative_to(tree.root) else str(doc)
        for line, span in code_spans(doc.read_text(encoding="utf-8")):
            reason = check_span(tree, span)
            if reason is not None:
                found.append(Drift(name, line, span, reason))
    return found


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gpuplace_dev.docscheck", description=__doc__)
    parser.add_argument("docs", nargs="*", type=Path, help="default: docs/*.md and README.md")
    args = parser.parse_args(argv)
    tree = Tree()
    found = drifts(tree, args.docs or documents())
    if not args.docs:
        found += outside_citations(tree)
    for drift in found:
        print(drift, file=sys.stderr)
    if found:
        print(f"docscheck: {len(found)} drifts between the docs and the tree", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
