"""The documents keep pointing at what exists: every relative link and anchor in the Markdown files
resolves, and every nbrgc command the README shows uses only flags its parser accepts."""
import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = sorted([ROOT / "README.md", *ROOT.glob("docs/*.md"), ROOT / "benchmarks" / "README.md"])
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def anchors(path):
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    out = set()
    for line in path.read_text().splitlines():
        m = re.match(r"#{1,6}\s+(.*)", line)
        if m:
            text = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower())
            out.add(text.replace(" ", "-"))
    return out


def links():
    for doc in DOCS:
        in_code = False
        for n, line in enumerate(doc.read_text().splitlines(), 1):
            if line.startswith("```"):
                in_code = not in_code
            if in_code:
                continue
            for target in LINK.findall(line):
                if not re.match(r"[a-z]+:", target):
                    yield doc, n, target


@pytest.mark.parametrize("doc,line,target", list(links()),
                         ids=lambda v: v if isinstance(v, str) else str(v)[-30:])
def test_relative_links_resolve(doc, line, target):
    path, _, anchor = target.partition("#")
    dest = (doc.parent / path).resolve() if path else doc
    assert dest.exists(), f"{doc.name}:{line}: {target} points at nothing"
    if anchor and dest.suffix == ".md":
        assert anchor in anchors(dest), f"{doc.name}:{line}: no heading #{anchor} in {dest.name}"


def readme_commands():
    text = (ROOT / "README.md").read_text()
    for block in re.findall(r"```(?:bash|sh)?\n(.*?)```", text, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            try:
                words = shlex.split(line, comments=True)
            except ValueError:  # not a shell line (a Python block)
                continue
            cmd = []
            for w in words + ["&&"]:
                if w in ("&&", ";", "|", "||"):
                    tool = next((v for v in cmd if re.search(r"(^|/)nbrgc-\w+$", v)), None)
                    if tool:
                        yield tool.split("/")[-1], cmd[cmd.index(tool) + 1:]
                    cmd = []
                else:
                    cmd.append(w)


@pytest.mark.parametrize("tool,args", list(readme_commands()), ids=lambda v: str(v)[:40])
def test_readme_commands_parse(tool, args):
    import importlib
    mod = importlib.import_module(f"nbrgc.cli.{tool.split('-', 1)[1]}")
    parser = mod.build_parser() if hasattr(mod, "build_parser") else None
    if parser is None:
        pytest.skip(f"{tool} has no build_parser")
    flags = {o for a in parser._actions for o in a.option_strings}
    used = [a.split("=")[0] for a in args if a.startswith("--")]
    unknown = [f for f in used if f not in flags]
    assert not unknown, f"README uses {tool} {' '.join(unknown)}, which it does not accept"
