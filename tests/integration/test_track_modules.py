"""A track is a module (issue 35): the generic workflow files hold no string switch on a track name,
every registered track supplies every field, and registering a track (standard library only) adds it.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
from support import REPO, track_rules_file

from qrerase import tracks
from qrerase.tracks import TRACKS, Track, TrackError, register_track, track
from qrerase.tracks.base import REQUIRED_ROLES, ROLES

ROOT = REPO
#: The files that must not switch on a track's name (the tracks' own are qrerase/tracks/<name>.py and
#: rules/<name>.smk, rules/<name>_common.smk).
GENERIC = [
    "Snakefile",
    "rules/common.smk",
    "rules/core/common.smk",
    "rules/studies/cost.smk",
    "rules/studies/cost_common.smk",
    "rules/studies/tradeoff.smk",
    "rules/studies/tradeoff_common.smk",
    "rules/studies/seeds.smk",
    "rules/studies/seeds_common.smk",
    "qrerase/reports/pages.py",
    "qrerase/smoke.py",
    *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "qrerase" / "workflow").glob("*.py")),
]


def switch_patterns(names: list[str]) -> list[re.Pattern]:
    """Regexes of a string switch on one of ``names``: ``x == "tofu"``, ``"tofu" != x``, ``"tofu" in x``,
    ``x in ("tofu", ...)``, a table keyed by a name (``"tofu": ...`` or a row ``("tofu", ...`` at a line
    start), a tuple of names, ``s.startswith("tofu")``, an alternation ``"tofu|..."``, a comparison with an
    experiment-name constant (``exp != TASK_LEVEL_EXP``)."""
    n = "|".join(map(re.escape, names))
    lit = rf"""["']({n})["']"""
    return [
        re.compile(rf"(==|!=)\s*{lit}"),
        re.compile(rf"{lit}\s*(==|!=)"),
        re.compile(rf"{lit}\s+(not\s+)?in\b"),
        re.compile(rf"\bin\s*[(\[{{][^)\]}}]*{lit}"),
        re.compile(rf"^\s*{lit}\s*:"),
        re.compile(rf"\(\s*{lit}\s*,\s*{lit}"),
        re.compile(rf"^\s*\(\s*{lit}\s*,"),
        re.compile(rf"\.startswith\(\s*{lit}"),
        re.compile(rf"[\"']({n})\|"),  # an alternation of names, "tofu|crosslingual"
        re.compile(r"(==|!=)\s*[A-Z_]+_EXP\b"),  # an experiment-name constant, exp == TASK_LEVEL_EXP
    ]


def find_switches(text: str, names: list[str]) -> list[tuple[int, str]]:
    """(line number, line) of each line of ``text`` holding a switch on one of ``names``; the scan is
    plain text (a ``#`` comment is left out, a docstring is not)."""
    patterns = switch_patterns(names)
    return [
        (i, line.strip())
        for i, line in enumerate(text.splitlines(), 1)
        if any(p.search(line.split("#", 1)[0]) for p in patterns)
    ]


def test_scan_finds_the_switches_it_must():
    names = ["tofu", "crosslingual"]
    text = "\n".join(
        [
            'if track == "tofu":',  # 1
            "    x = 1",
            '"crosslingual" not in cfg["tracks"]',  # 3
            'y = t in ("tofu", "crosslingual")',  # 4
            '    "tofu": None,',  # 5
            'config["tofu"]["data"]',
            'for t in cfg["tracks"]:  # == "tofu" in a comment',
            'format_exp("tofu", split)',
            'z = "speech" == t',
            'section.startswith("crosslingual")',  # 10
            '    ("tofu", "TOFU track", ("tofu",)),',  # 11
            'TEXT = ("crosslingual", "tofu")',  # 12
            "``Experiment('crosslingual', 'hi_R')``",
            "if wildcards.exp != TASK_LEVEL_EXP:",  # 14
            '        track="tofu|crosslingual",',  # 15
        ]
    )
    assert [i for i, _ in find_switches(text, names)] == [1, 3, 4, 5, 10, 11, 12, 14, 15]


@pytest.mark.parametrize("rel", GENERIC)
def test_generic_file_has_no_track_switch(rel):
    names = sorted({*TRACKS, *(t.prefix for t in TRACKS.values())})
    hits = find_switches((ROOT / rel).read_text(), names)
    assert not hits, "string switch on a track name: " + "; ".join(f"{rel}:{i}: {line}" for i, line in hits)


def _rules_functions(t: Track) -> set[str]:
    common = track_rules_file(t.name, "common")
    text = common.read_text() if common.exists() else ""
    return set(re.findall(r"^def (\w+)\(", text, flags=re.M))


@pytest.mark.parametrize("name", list(tracks.BUILTIN))
def test_builtin_track_module_supplies_every_field(name):
    t = TRACKS[name]
    assert t.__module__ == f"qrerase.tracks.{name}" or type(t) is Track
    folder = Path(tracks.__file__).with_name(name)  # a track in its folder (package), or a module
    assert (folder / "__init__.py").is_file() or folder.with_suffix(".py").is_file()
    for f in dataclasses.fields(Track):
        value = getattr(t, f.name)
        optional = ("sweep", "finetune_start", "cost_group_header", "rules", "schema", "runner_spec", "methods")
        assert value is not None or f.name in optional, f.name
    # a track in its folder names its rules file there (rules/<name>/rules.smk) and its section's schema
    # file beside its module, as a plug-in track names its own; another is included by name and has its
    # section in the schema file
    snakefile = (ROOT / "Snakefile").read_text()
    if folder.is_dir():
        assert t.rules == f"rules/{name}/rules.smk" and (ROOT / t.rules).is_file()
        assert f"rules/{name}" not in snakefile
        assert t.schema == folder / "schema.yaml" and t.schema.is_file()
    else:
        assert t.rules is None and f'include: "rules/{name}.smk"' in snakefile
        assert t.schema is None
    assert t.name == name and t.prefix and t.tables and t.title and t.page_prefixes
    for pattern in t.experiments.values():
        assert re.fullmatch(r"[\w\\{}()|?+\[\]-]+", pattern), pattern
    # its rules file binds the functions the generic rules call, each defined there (Track.bind)
    common = track_rules_file(name, "common").read_text()
    bound = re.search(rf'registry\.TRACKS\["{name}"\]\.bind\((.*?)\n\)', common, flags=re.S)
    assert bound, f"{track_rules_file(name, 'common')} binds no functions"
    roles = dict(re.findall(r"(\w+)=(\w+)", bound.group(1)))
    assert set(REQUIRED_ROLES) <= set(roles) <= set(ROLES), roles
    assert set(roles.values()) <= _rules_functions(t), sorted(set(roles.values()) - _rules_functions(t))
    module, _, attr = t.check.partition(":")
    assert callable(getattr(__import__(module, fromlist=[attr]), attr))
    assert track_rules_file(name, "rules").is_file()


def _toy(name: str, **over) -> Track:
    fields = dict(
        name=name,
        runner="text",
        prefix=name,
        experiments={name: name},
        tables=(name,),
        title="Toy track",
        check="builtins:print",
        overrides=(name,),
        baselines_section="baselines",
        eval_sections=(f"{name}.evaluate",),
        pretrain_text=True,
    )
    return Track(**{**fields, **over})


def test_a_track_gives_the_required_fields_and_the_rest_default():
    required = {
        f.name
        for f in dataclasses.fields(Track)
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    }
    assert required == {"name", "runner", "prefix", "experiments", "tables", "title", "check"}
    t = Track(
        name="toy", runner="own", prefix="toy", experiments={"toy": "toy"}, tables=("toy",), title="T", check="m:f"
    )
    assert (t.section, t.baselines_section, t.page_prefixes) == ("toy", "toy.baselines", ("toy",))
    assert (t.rules, t.schema, t.metrics, t.smoke, t.cost_group_header) == (None, None, False, False, None)
    named = Track(
        name="toy", runner="own", prefix="toy", experiments={}, tables=("toy",), title="T", check="m:f", section="s"
    )
    assert named.baselines_section == "s.baselines"
    # a track sharing a runner that a registered track brings: that runner's section (the text runner's)
    shared = Track(
        name="toy", runner="text", prefix="toy", experiments={}, tables=("toy",), title="T", check="m:f", section="s"
    )
    assert shared.baselines_section == "tofu.baselines" == tracks.TRACKS["tofu"].runner_spec.section
    assert tracks.TRACKS["crosslingual"].baselines_section == "tofu.baselines"
    with pytest.raises(TypeError):
        Track(name="toy", runner="text")  # the required fields have no default


@pytest.fixture
def restore_tracks():
    from qrerase.tracks import base

    before, bound = dict(TRACKS), dict(base._BOUND)
    yield
    TRACKS.clear()
    TRACKS.update(before)
    base._BOUND.clear()
    base._BOUND.update(bound)


def test_registering_a_toy_track(restore_tracks):
    from qrerase.workflow.naming import format_exp, model_exp, parse_exp

    toy = register_track(_toy("toy"))
    assert track("toy") is toy and list(TRACKS)[-1] == "toy"
    # its names parse, and its sections compose with its overrides over the shared ones
    assert parse_exp("toy") == ("toy", None) and format_exp("toy") == "toy" and model_exp("toy") == "toy"
    cfg = {"model": {}, "lora": {"r": 4, "alpha": 8}, "toy": {"lora": {"r": 2}}}
    assert toy.training_section(cfg, "lora") == {"r": 2, "alpha": 8}
    assert toy.chain(cfg, "lora") == [("toy.lora", {"r": 2}), ("lora", {"r": 4, "alpha": 8})]
    assert toy.erase_scale({"unlearn": {"scale": 0.5}}) == 0.5


def test_unknown_and_duplicate_tracks_are_one_line_errors(restore_tracks):
    with pytest.raises(TrackError, match=r"^unknown track 'nope'; registered: \['tofu', ") as err:
        track("nope")
    assert "\n" not in str(err.value)
    register_track(_toy("toy"))
    with pytest.raises(TrackError, match=r"^track 'toy' is already registered$"):
        register_track(_toy("toy"))
    with pytest.raises(TrackError, match=r"^track 'toy2': empty field\(s\) \['title'\]$"):
        register_track(_toy("toy2", title=""))
    with pytest.raises(TrackError, match="expected a Track"):
        register_track({"name": "toy3"})


def test_a_track_binds_its_rules_functions_by_role(restore_tracks):
    toy = register_track(_toy("toy"))
    with pytest.raises(TrackError, match=r"^track 'toy': its rules file binds no functions \(Track.bind\)$"):
        toy.function("targets")
    with pytest.raises(
        TrackError, match=r"^track 'toy': bind\(\) lacks the required role\(s\) \['costs', 'tradeoff_targets'\]$"
    ):
        toy.bind(targets=list)
    with pytest.raises(TrackError, match=r"^track 'toy': bind\(\) got unknown role\(s\) \['tables'\]"):
        toy.bind(targets=list, costs=dict, tradeoff_targets=list, tables=list)
    with pytest.raises(TrackError, match=r"^track 'toy': bind\(\) role\(s\) \['costs'\] must be functions$"):
        toy.bind(targets=list, costs="toy_costs", tradeoff_targets=list)
    toy.bind(targets=lambda: ["t"], costs=dict, tradeoff_targets=list)
    assert toy.function("targets")() == ["t"] and toy.function("sweep") is None and toy.function("robustness") is None
    with pytest.raises(TrackError, match="unknown track function role 'target'"):
        toy.function("target")


def test_a_tracks_path_patterns_join_the_shared_ones_and_may_not_redefine_one(restore_tracks):
    from qrerase.workflow.paths import SHARED, all_paths, fill

    table = all_paths(TRACKS)
    assert set(SHARED) < set(table) and table["speech_eval"] == TRACKS["speech"].paths["speech_eval"]
    assert fill(table["speech_eval"], exp="speech") == "results/speech/speech_eval/{model}.csv"
    register_track(_toy("toy", paths={"toy_counts": "results/toy/{name}.csv"}))
    assert all_paths(TRACKS)["toy_counts"] == "results/toy/{name}.csv"
    TRACKS.pop("toy")
    register_track(_toy("toy", paths={"table": "results/toy.csv"}))
    with pytest.raises(
        ValueError, match=r"^track 'toy': path key\(s\) \['table'\] are already defined \(Track.paths\)$"
    ):
        all_paths(TRACKS)


def test_extending_page_documents_every_track_field():
    text = (ROOT / "docs" / "extending.md").read_text()
    section = text[text.index("## Adding a track") :]
    documented = set(re.findall(r"^\| (.+?) \|", section, flags=re.M))
    names = {n.strip("` ") for row in documented for n in row.split(",")}
    assert {f.name for f in dataclasses.fields(Track)} | set(ROLES) == names - {"Field", "Role", "---"}


def test_a_config_with_the_old_top_level_baselines_key_names_the_new_one():
    from qrerase.workflow.validation import ConfigError, moved_keys, validate

    assert moved_keys() == {"baselines": "tofu.baselines"} == dict(tracks.TRACKS["tofu"].moved_keys)
    with pytest.raises(ConfigError) as err:
        validate({"tracks": ["tofu"], "baselines": {"ga": {"epochs": 1}}})
    assert str(err.value) == "config key 'baselines' moved to 'tofu.baselines'"
