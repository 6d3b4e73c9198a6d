"""Reading the deployment definitions under deploy/ for tests/unit/test_deploy.py: a Dockerfile's
instructions (line continuations joined, comments dropped, the final stage picked out), the
.dockerignore rules as Docker applies them, the Kubernetes manifests as YAML documents, and a
`zinc serve` command line parsed by zinc's own Typer app.

Owns: nothing the server uses; it only reads files of the repository.
Imports: zinc.cli (the Typer app), typer, yaml, the stdlib.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import typer
import yaml

from zinc.cli import app

REPO = Path(__file__).resolve().parent.parent
DEPLOY = REPO / "deploy"
K8S = DEPLOY / "k8s"
DOCKERFILES = (DEPLOY / "Dockerfile", DEPLOY / "Dockerfile.vulkan")


@dataclass(frozen=True)
class Instruction:
    keyword: str  # upper case: FROM, RUN, ...
    args: str  # the rest of the instruction, continuations joined with a space
    line: int  # where it starts (1-based)

    def exec_form(self) -> list[str] | None:
        """The JSON array of an exec-form CMD/ENTRYPOINT/RUN (or HEALTHCHECK's CMD); None for shell form."""
        text = self.args.split("CMD", 1)[1].strip() if self.keyword == "HEALTHCHECK" else self.args
        try:
            value = json.loads(text)
        except ValueError:
            return None
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return value
        return None


def instructions(path: Path) -> list[Instruction]:
    """The Dockerfile's instructions in order (parser directives and comments left out)."""
    result: list[Instruction] = []
    pending: list[str] = []
    start = 0
    for number, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if pending and line.startswith("#"):  # a comment inside a continued instruction
            continue
        if not pending:
            start = number
        continued = line.endswith("\\")
        pending.append(line[:-1].strip() if continued else line)
        if not continued:
            text = " ".join(part for part in pending if part)
            keyword, _, args = text.partition(" ")
            result.append(Instruction(keyword.upper(), args.strip(), start))
            pending = []
    assert not pending, f"{path}: the file ends inside a continued instruction"
    return result


def final_stage(items: list[Instruction]) -> list[Instruction]:
    """The instructions from the last FROM on: what the image that runs is made of."""
    last = max(i for i, item in enumerate(items) if item.keyword == "FROM")
    return items[last:]


def last(items: list[Instruction], keyword: str) -> Instruction:
    """The last instruction with this keyword (the one that counts for CMD, ENTRYPOINT, HEALTHCHECK)."""
    found = [item for item in items if item.keyword == keyword]
    assert found, f"no {keyword} instruction"
    return found[-1]


def env_values(items: list[Instruction]) -> dict[str, str]:
    """ENV KEY=VALUE pairs (the `KEY=VALUE ...` form), later ones winning."""
    env: dict[str, str] = {}
    for item in items:
        if item.keyword == "ENV":
            for pair in item.args.split():
                key, sep, value = pair.partition("=")
                assert sep, f"ENV at line {item.line}: use the KEY=VALUE form"
                env[key] = value
    return env


def _pattern_regex(pattern: str) -> re.Pattern[str]:
    """A .dockerignore pattern as a regex over a slash-separated path (Go's filepath.Match plus `**`)."""
    out = ""
    i = 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif pattern.startswith("**", i):
            out, i = out + ".*", i + 2
        elif pattern[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif pattern[i] == "?":
            out, i = out + "[^/]", i + 1
        else:
            out, i = out + re.escape(pattern[i]), i + 1
    return re.compile(out)


def dockerignore_excludes(ignore_file: Path, path: str) -> bool:
    """Whether Docker leaves `path` (relative to the context root) out of the build context: the last
    rule that matches the path or one of its parent directories decides, `!` rules include."""
    excluded = False
    parts = path.strip("/").split("/")
    prefixes = ["/".join(parts[: n + 1]) for n in range(len(parts))]
    for raw in ignore_file.read_text().splitlines():
        rule = raw.strip()
        if not rule or rule.startswith("#"):
            continue
        include = rule.startswith("!")
        regex = _pattern_regex(rule.lstrip("!").strip("/"))
        if any(regex.fullmatch(prefix) for prefix in prefixes):
            excluded = not include
    return excluded


def manifests() -> dict[str, list[dict[str, Any]]]:
    """Every YAML file under deploy/k8s, by file name, as its list of documents."""
    result: dict[str, list[dict[str, Any]]] = {}
    for path in sorted(K8S.glob("*.yaml")):
        docs = [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]
        assert docs, f"{path} holds no document"
        result[path.name] = docs
    return result


def one(kind: str) -> dict[str, Any]:
    """The only manifest of this kind."""
    found = [doc for docs in manifests().values() for doc in docs if doc.get("kind") == kind]
    assert len(found) == 1, f"{len(found)} {kind} manifests, expected 1"
    return found[0]


def serve_params(argv: list[str]) -> dict[str, Any]:
    """`argv` (starting with `zinc serve`) parsed by zinc's own CLI, without running it: an unknown
    option or a bad value raises Typer's UsageError (a TyperException). Returns the parameters by name."""
    assert argv[:2] == ["zinc", "serve"], f"not a `zinc serve` command line: {argv}"
    group = typer.main.get_command(app)
    assert isinstance(group, typer.core.TyperGroup)
    serve = group.commands["serve"]
    with serve.make_context("serve", list(argv[2:])) as ctx:
        return dict(ctx.params)
