"""The docs site builds with ``mkdocs build --strict`` (every nav page present, every link and anchor
resolved, every ``:::`` API block imported), its math is MathML in the built pages (docs/hooks/mathml.py;
no script, no CDN), and the README stays a short entry point into it."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from support import REPO

README = REPO / "README.md"
MATH_HOOK = REPO / "docs" / "hooks" / "mathml.py"


def _nav_files(node) -> list[str]:
    if isinstance(node, str):
        return [node]
    if isinstance(node, list):
        return [f for item in node for f in _nav_files(item)]
    if isinstance(node, dict):
        return [f for value in node.values() for f in _nav_files(value)]
    return []


def _mkdocs_config() -> dict:
    class Loader(yaml.SafeLoader):  # mkdocs.yml may use !!python/name tags; the nav needs none
        pass

    Loader.add_multi_constructor("tag:yaml.org,2002:python/", lambda loader, suffix, node: None)
    return yaml.load((REPO / "mkdocs.yml").read_text(encoding="utf-8"), Loader=Loader)


def test_mkdocs_build_strict(tmp_path):
    for module in ("mkdocs", "material", "mkdocstrings_handlers.python", "latex2mathml"):
        if importlib.util.find_spec(module.split(".")[0]) is None:
            pytest.skip(f"{module} is not installed (pip install -e '.[docs]'; the test extra includes it)")
    site = tmp_path / "site"
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site), "--config-file", "mkdocs.yml"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-4000:]}\n{proc.stderr[-6000:]}"
    for page in _nav_files(_mkdocs_config()["nav"]):  # directory URLs: a/b.md -> a/b/index.html
        stem = page[: -len(".md")]
        built = site / (f"{stem}.html" if stem == "index" or stem.endswith("/index") else f"{stem}/index.html")
        assert built.is_file(), f"{page}: not built ({built})"
    api = (site / "api/method/index.html").read_text(encoding="utf-8")
    for anchor in ("qrerase.method.decompose.decompose", "qrerase.method.discriminate.forget_update"):
        assert f'id="{anchor}"' in api, f"API page lacks {anchor}: mkdocstrings did not render the docstrings"
    # the math is MathML in the page itself: nothing left for a script to typeset, nothing loaded from a CDN
    home = (site / "index.html").read_text(encoding="utf-8")
    assert home.count('<math xmlns="http://www.w3.org/1998/Math/MathML" display="block">') == 2, "index.md: 2 displays"
    assert home.count("<mtr>") == 5, "index.md: the method's aligned display has 5 rows"
    for page in site.rglob("*.html"):
        text = page.read_text(encoding="utf-8")
        name = page.relative_to(site).as_posix()
        prose = re.sub(r"<(pre|code)\b.*?</\1>", "", text, flags=re.DOTALL)  # a regex in code may hold \(
        assert 'class="arithmatex"' not in text, f"{name}: math left for a script to typeset"
        for raw in ("\\begin{", "\\(", "\\["):
            assert raw not in prose, f"{name}: unconverted TeX ({raw!r})"
        remote = re.findall(r'<(?:script|link)\b[^>]*\b(?:src|href)="((?:https?:)?//[^"]+)"', text)
        assert not remote, f"{name}: loads {remote} (a CDN, web fonts: the site must render offline)"


def _math_hook():
    pytest.importorskip("latex2mathml", reason="pip install -e '.[docs]'")
    spec = importlib.util.spec_from_file_location("docs_mathml_hook", MATH_HOOK)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_math_hook_converts_aligned_norms_and_rejects_unknown_commands():
    hook = _math_hook()
    aligned = hook.tex_to_mathml(
        r"\begin{aligned} a &amp;= b \\ \lVert T \rVert_F &amp;\ge 1/|L| \end{aligned}", "block"
    )
    assert aligned.startswith('<math xmlns="http://www.w3.org/1998/Math/MathML" display="block">')
    assert aligned.count("<mtr>") == 2 and aligned.count("<mtd") == 4  # two rows, two & columns
    assert "&#x02016;" in aligned and "&#x02265;" in aligned  # ‖ and ≥ (the &amp; unescaped, not text)
    assert "<mo>rank</mo>" in hook.tex_to_mathml(r"\operatorname{rank}(T)")
    with pytest.raises(ValueError, match=r"page\.md: the formula .*\\foo"):
        hook.tex_to_mathml(r"\foo + 1", where="page.md")


def test_nav_lists_every_page_and_only_existing_ones():
    nav = set(_nav_files(_mkdocs_config()["nav"]))
    docs = {p.relative_to(REPO / "docs").as_posix() for p in (REPO / "docs").rglob("*.md")}
    generated = {d for d in docs if d.startswith("results/") and d != "results/index.md"}
    assert nav <= docs, f"nav entries without a file: {sorted(nav - docs)}"
    assert docs - generated <= nav, f"pages not in the nav: {sorted(docs - generated - nav)}"


def test_readme_is_short_and_links_into_the_docs():
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 200
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    local = [link for link in links if "://" not in link]
    assert any(link.startswith("docs/") for link in local)
    missing = [link for link in local if not (REPO / link).exists()]
    assert not missing, f"README links to missing files: {missing}"
    assert not re.search(r"\bissue \d+", text, re.IGNORECASE), "no issue numbers in the README"


def _anchors(page: Path) -> set[str]:
    """The heading ids MkDocs gives a page (toc's default slugify), fenced code blocks skipped."""
    slugify = pytest.importorskip("markdown.extensions.toc").slugify
    text = re.sub(r"^```.*?^```", "", page.read_text(encoding="utf-8"), flags=re.MULTILINE | re.DOTALL)
    return {slugify(h.replace("`", ""), "-") for h in re.findall(r"^#{1,6}\s+(.+?)\s*$", text, re.MULTILINE)}


@pytest.mark.parametrize("config", ["config.yaml", *sorted(p.name for p in (REPO / "config").glob("*.yaml"))])
def test_config_comments_point_to_existing_docs_sections(config):
    path = REPO / config if config == "config.yaml" else REPO / "config" / config
    text = path.read_text(encoding="utf-8")
    readme_headings = set(re.findall(r"^#+\s+(.+?)\s*$", README.read_text(encoding="utf-8"), re.MULTILINE))
    for section in re.findall(r'\bREADME(?: "([^"]*)")?', text):
        assert section in readme_headings, f"{config}: README section {section!r} does not exist (point to docs/)"
    for page, anchor in re.findall(r"\b(docs/[\w./-]+\.md)(?:#([\w-]+))?", text):
        assert (REPO / page).is_file(), f"{config}: {page} does not exist"
        assert not anchor or anchor in _anchors(REPO / page), f"{config}: {page} has no section #{anchor}"


def test_every_ready_config_is_planned_by_a_test():
    """docs/models.md: each `config/*.yaml` is planned (`snakemake -n`) by some test; a new config that no
    planning test names fails here."""
    planning = {
        path.relative_to(REPO).as_posix(): path.read_text(encoding="utf-8")
        for path in sorted((REPO / "tests").rglob("test_*.py"))
    }
    planning = {name: text for name, text in planning.items() if '"-n"' in text}
    for config in sorted((REPO / "config").glob("*.yaml")):
        named = [name for name, text in planning.items() if f'"{config.stem}"' in text or f"{config.stem}.yaml" in text]
        assert named, f"config/{config.name}: no test that plans with -n names it"
    models = " ".join((REPO / "docs" / "models.md").read_text(encoding="utf-8").split())
    assert "`tests/integration/test_docs.py` checks that a test plans each of them" in models


def test_contributing_names_only_files_that_exist():
    """CONTRIBUTING.md's recipes list exact files: each path it names (placeholders aside) exists."""
    text = (REPO / "CONTRIBUTING.md").read_text(encoding="utf-8")
    paths = set(
        re.findall(r"`((?:qrerase|tests|rules|docs|workflow_scripts|schemas|\.ci)/[^`\s:]*|config\.yaml)`", text)
    )
    assert len(paths) >= 10
    missing = sorted(p for p in paths if "<" not in p and not (REPO / p.rstrip("/")).exists())
    assert not missing, f"CONTRIBUTING.md names missing files: {missing}"
    for placeholder in sorted(p for p in paths if "<" in p):  # e.g. qrerase/tracks/<name>.py: its folder exists
        assert (REPO / placeholder.split("<")[0]).parent.is_dir() or (REPO / placeholder.split("<")[0]).is_dir()
