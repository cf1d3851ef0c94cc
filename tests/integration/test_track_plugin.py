"""A track added by a plug-in (issue 35): the toy track of tests/plugins/toy_track.py registers its module
(a :class:`Track` naming its rules file and its config section's schema), and with no file of the repository
changed the config schema accepts its name and section, the Snakefile's list of extra rules files names its
rules, the results pages know its page; bad registrations are one-line errors. Its plan and run through
snakemake: tests/workflow/test_toy_track_workflow.py."""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

import pytest
import yaml
from support import PLUGINS, REPO

from qrerase.metrics import registry as metrics
from qrerase.tracks import TRACKS, TrackError, register_track, track_rules
from qrerase.workflow.validation import ConfigError, load_schema, validate


@pytest.fixture
def plugin_path(monkeypatch):
    """tests/plugins importable; the registered tracks restored and the toy plug-in forgotten after the test."""
    before = dict(TRACKS)
    monkeypatch.syspath_prepend(str(PLUGINS))
    monkeypatch.delitem(sys.modules, "toy_track", raising=False)
    yield
    TRACKS.clear()
    TRACKS.update(before)
    sys.modules.pop("toy_track", None)


def _config(**changes) -> dict:
    """config.yaml updated by tests/configs/test.yaml as Snakemake merges them, then ``changes`` (top-level keys)."""
    from qrerase.workflow.plan_config import deep_update

    cfg = yaml.safe_load((REPO / "config.yaml").read_text())
    deep_update(cfg, yaml.safe_load((REPO / "tests" / "configs" / "test.yaml").read_text()))
    cfg["tofu"]["data"]["root"] = str(REPO / "data" / "tofu")
    cfg.update(changes)
    return cfg


TOY = {"plugins": ["toy_track"], "tracks": ["toy_count"], "toy_count": {"unit": "words"}}


#: The built-in tracks' rules files that the Snakefile includes through Track.rules (a track in its folder).
BUILTIN_RULES = [str(REPO / "rules" / name / "rules.smk") for name in ("tofu", "crosslingual", "speech", "task_level")]


def test_builtin_tracks_in_folders_name_their_rules_and_schema_files():
    """A built-in track in its folder takes a plug-in's path: its rules file and its section's schema file
    (``qrerase/tracks/<name>/schema.yaml``), which the schema file itself no longer holds."""
    import yaml

    from qrerase.workflow.validation import SCHEMA_PATH

    assert track_rules() == BUILTIN_RULES
    folders = [t.name for t in TRACKS.values() if t.rules is not None]
    assert [t.name for t in TRACKS.values() if t.schema is not None] == folders
    top = yaml.safe_load(SCHEMA_PATH.read_text(encoding="utf-8"))["properties"]
    schema = load_schema()["properties"]
    for name in folders:
        assert TRACKS[name].schema == REPO / "qrerase" / "tracks" / name / "schema.yaml"
        assert name not in top and schema[name]["properties"], name
    assert metrics.evaluating_tracks() == ["tofu", "speech"]  # Track.metrics


def test_the_config_accepts_a_plugin_track_its_section_and_its_methods(plugin_path):
    # without its plug-in: neither its name nor its section is known
    with pytest.raises(ConfigError, match=r"^config key 'tracks.0': 'toy_count' is not one of \['tofu', "):
        validate(_config(tracks=["toy_count"]))
    with pytest.raises(ConfigError, match=r"^config key 'toy_count': unknown key \(keys here: seed, "):
        validate(_config(tracks=["toy_count"], toy_count={"unit": "words"}))
    assert "toy_count" not in load_schema()["properties"]
    validate(_config(**TOY))  # imports the plug-in: its track, section and methods entry are in the schema
    schema = load_schema()
    assert schema["properties"]["toy_count"]["properties"]["unit"]["enum"] == ["words", "chars"]
    assert schema["properties"]["methods"]["properties"]["toy_count"]["items"] == {"enum": []}
    assert track_rules() == [*BUILTIN_RULES, str(PLUGINS / "toy_track.smk")]
    with pytest.raises(ConfigError) as err:
        validate(_config(**{**TOY, "toy_count": {"unit": "bytes"}}))
    assert str(err.value).startswith("config key 'toy_count.unit': 'bytes' is not one of ['words', 'chars']")
    with pytest.raises(ConfigError, match=r"^config key 'toy_count.units': unknown key \(did you mean 'unit'\?"):
        validate(_config(**{**TOY, "toy_count": {"units": "words"}}))
    with pytest.raises(ConfigError, match=r"^config key 'methods.toy_count.0': 'qr_erase' is not one of \[\]"):
        validate(_config(**TOY, methods={"tofu": ["qr_erase"], "toy_count": ["qr_erase"]}))
    with pytest.raises(ConfigError, match="^config key 'tofu.data.source': the toy_count track reads the vendored"):
        cfg = _config(**TOY)
        cfg["tofu"]["data"] = {**cfg["tofu"]["data"], "source": "hub"}
        validate(cfg)  # its own check (Track.check), run because it is configured


def test_a_plugin_track_whose_rules_file_is_missing_is_refused_naming_it(plugin_path, tmp_path, monkeypatch):
    toy = (PLUGINS / "toy_track.py").read_text().replace("toy_count", "toy_bad")
    (tmp_path / "toy_bad_track.py").write_text(toy.replace('with_name("toy_track.smk")', 'with_name("nope.smk")'))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "toy_bad_track", raising=False)
    with pytest.raises(ConfigError) as err:
        validate(_config(plugins=["toy_bad_track"]))
    assert str(err.value) == (
        f"config key 'plugins.0': track 'toy_bad': rules file {tmp_path / 'nope.smk'} not found (Track.rules)"
    )
    assert "toy_bad" not in TRACKS
    sys.modules.pop("toy_bad_track", None)


def test_bad_track_registrations_are_one_line_errors(plugin_path):
    import dataclasses

    import toy_track

    with pytest.raises(TrackError, match=r"^track 'toy_rel': rules file .*/no/such\.smk not found \(Track.rules\)$"):
        register_track(dataclasses.replace(toy_track.TRACK, name="toy_rel", rules="no/such.smk"))
    with pytest.raises(TrackError, match=r"^track 'toy_s': schema must be a mapping \(a JSON schema\) or the Path "):
        register_track(dataclasses.replace(toy_track.TRACK, name="toy_s", schema=[]))
    with pytest.raises(TrackError, match=r"^track 'toy_f': schema file no/such\.yaml not found \(Track.schema\)$"):
        register_track(dataclasses.replace(toy_track.TRACK, name="toy_f", schema=Path("no/such.yaml")))
    # a track whose section the schema file already holds: the schema cannot be built
    register_track(dataclasses.replace(toy_track.TRACK, name="toy_dup", section="tofu", prefix="toy_dup"))
    with pytest.raises(ValueError, match=r"^schema: track 'toy_dup': section 'tofu' is in the schema file$"):
        load_schema()


def test_a_track_schema_file_is_its_section(plugin_path, tmp_path):
    """Track.schema as a YAML file (a built-in track's form) gives the section its mapping would give; a file
    holding no mapping stops the schema in one line."""
    import dataclasses

    import toy_track

    register_track(dataclasses.replace(toy_track.TRACK, name="toy_map", section="toy_map", prefix="toy_map"))
    as_mapping = load_schema()["properties"]["toy_map"]
    path = tmp_path / "schema.yaml"
    path.write_text(yaml.safe_dump(dict(toy_track.TRACK.schema)))
    register_track(
        dataclasses.replace(toy_track.TRACK, name="toy_yaml", section="toy_yaml", prefix="toy_yaml", schema=path)
    )
    assert load_schema()["properties"]["toy_yaml"] == as_mapping
    bad = tmp_path / "bad.yaml"
    bad.write_text("- a list\n")
    register_track(
        dataclasses.replace(toy_track.TRACK, name="toy_bad_yaml", section="toy_bad_yaml", prefix="tb", schema=bad)
    )
    with pytest.raises(ValueError, match=rf"^schema: {bad} holds no mapping \(a track's section schema\)$"):
        load_schema()


def test_the_snakefile_refuses_a_rules_file_gone_since_registration(plugin_path, tmp_path):
    """track_rules() (the Snakefile's include list) checks every file again: a rules file removed after its
    track registered (or a relative one an installed package could not check) stops the planning in one line."""
    import dataclasses

    import toy_track

    rules = tmp_path / "gone.smk"
    rules.write_text(PLUGINS.joinpath("toy_track.smk").read_text())
    register_track(dataclasses.replace(toy_track.TRACK, name="toy_gone", rules=str(rules)))
    assert track_rules()[-1] == str(rules)
    rules.unlink()
    with pytest.raises(TrackError, match=rf"^track 'toy_gone': rules file {rules} not found \(Track.rules\)$"):
        track_rules()


def test_a_metric_names_only_tracks_whose_evaluations_compute_metrics(plugin_path, monkeypatch):
    monkeypatch.setattr(metrics, "_METRICS", dict(metrics._METRICS))
    import toy_track  # noqa: F401  (registers toy_count, Track.metrics False)

    kw = dict(label="Toy", direction="lower", needs=("forget",), aggregate="mean", fn="toy_metric:f")
    with pytest.raises(metrics.MetricError) as err:
        metrics.register_metric("toy_m", tracks=("tofu", "toy_count"), **kw)
    assert str(err.value) == (
        "metric 'toy_m': track(s) ['toy_count'] compute no registered metric (their evaluations compute their own "
        "measures); registered metrics apply to ['tofu', 'speech']"
    )


def test_the_results_pages_know_a_plugin_tracks_page(plugin_path, tmp_path):
    from qrerase.reports.pages import collect, page_of

    assert page_of("toy_count.csv") is None
    import toy_track  # noqa: F401

    assert page_of("toy_count.csv") == "toy_count"
    (tmp_path / "tables").mkdir()
    (tmp_path / "tables" / "toy_count.csv").write_text("field,n,mean,max\n")
    pages, other = collect(tmp_path)
    assert [(p.name, p.title, list(p.tables)) for p in pages] == [("toy_count", "Toy count track", ["toy_count"])]
    assert other == []


def test_the_toy_table_counts_words_and_characters(plugin_path, tmp_path):
    import toy_track

    records = [{"prompt": "Who wrote  it?", "response": "A B C."}, {"prompt": "Why?", "response": "Because it rains"}]
    src = tmp_path / "qa.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in records))
    # by hand: question words 3, 1; answer words 3, 3; question chars 14, 4; answer chars 6, 16
    toy_track.count_table(src, tmp_path / "w.csv", "words")
    toy_track.count_table(src, tmp_path / "c.csv", "chars")
    read = {u: list(csv.DictReader(open(tmp_path / f"{u}.csv"))) for u in ("w", "c")}
    assert read["w"] == [
        {"field": "question", "n": "2", "mean": "2.0", "max": "3"},
        {"field": "answer", "n": "2", "mean": "3.0", "max": "3"},
    ]
    assert read["c"] == [
        {"field": "question", "n": "2", "mean": "9.0", "max": "14"},
        {"field": "answer", "n": "2", "mean": "11.0", "max": "16"},
    ]
    with pytest.raises(ValueError, match=r"^toy_count.unit: expected one of \['words', 'chars'\], got 'bytes'$"):
        toy_track.count_table(src, tmp_path / "b.csv", "bytes")
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(ValueError, match="empty.jsonl: no records$"):
        toy_track.count_table(tmp_path / "empty.jsonl", tmp_path / "e.csv", "words")
