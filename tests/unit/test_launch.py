"""How training jobs are launched (qrerase.workflow.launch), rank-0-only writing, inference placement."""

from __future__ import annotations

import json
import shlex

import pytest
from snakemake.iocontainers import InputFiles, OutputFiles, Wildcards

from qrerase.engine.placement import inference_placement
from qrerase.workflow import provenance
from qrerase.workflow.job import job
from qrerase.workflow.launch import LaunchedJob, NamedList, job_spec, launcher, load_job, shell_word

CONFIG = {
    "seed": 3,
    "threads": 2,
    "model": {"name_or_path": None, "dtype": "float32", "device": "cpu"},
    "finetune": {"epochs": 2, "lr": 0.01, "batch_size": 4},
    "tofu": {"data": {"split": "forget10"}},
    "unlearn": {"rank": 4},
}


def test_one_process_runs_the_interpreter_itself():
    assert launcher(1, "cpu", "/venv/bin/python", "/venv/bin/accelerate", "cfg.yaml") == "/venv/bin/python"


def test_several_processes_use_accelerate_launch_with_gloo_workers_on_cpu():
    cmd = launcher(4, "cpu", "python", "/venv/bin/accelerate", "/repo/envs/accelerate/multi_process.yaml")
    assert cmd.startswith("ACCELERATE_USE_CPU=true ")
    words = shlex.split(cmd.split(" ", 1)[1])
    assert words[:4] == ["/venv/bin/accelerate", "launch", "--num_processes", "4"]
    assert words[words.index("--config_file") + 1] == "/repo/envs/accelerate/multi_process.yaml"
    assert words[words.index("--main_process_port") + 1] == "0"  # a free port: jobs on one node never collide
    assert "--cpu" not in words  # accelerate's --cpu picks its single-process launcher
    gpu = launcher(8, "cuda", "python", "accelerate", "c.yaml")
    assert gpu.startswith("accelerate launch --num_processes 8 ") and "ACCELERATE_USE_CPU" not in gpu


def test_every_word_is_quoted_and_environment_variables_stay_expandable():
    assert (
        shell_word("$QRERASE_WORKFLOW/workflow_scripts/core/finetune.py")
        == '"$QRERASE_WORKFLOW/workflow_scripts/core/finetune.py"'
    )
    assert shell_word("/home/me/my runs/qr-érase/x.py") == "'/home/me/my runs/qr-érase/x.py'"
    assert shell_word("$(rm -rf ~)") == "'$(rm -rf ~)'" and shell_word("$HOME/a b") == "'$HOME/a b'"
    assert launcher(1, "cpu", "$QRERASE_PYTHON", "$QRERASE_ACCELERATE", "c.yaml") == '"$QRERASE_PYTHON"'
    cmd = launcher(2, "cpu", "python", "$QRERASE_ACCELERATE", "$QRERASE_WORKFLOW/envs/accelerate/multi_process.yaml")
    env = {"QRERASE_ACCELERATE": "/my runs/accelerate", "QRERASE_WORKFLOW": "/my runs/qr-érase"}
    words = shlex.split(
        cmd.split(" ", 1)[1]
        .replace("$QRERASE_ACCELERATE", env["QRERASE_ACCELERATE"])
        .replace("$QRERASE_WORKFLOW", env["QRERASE_WORKFLOW"])
    )
    assert words[0] == "/my runs/accelerate" and words[-1] == "/my runs/qr-érase/envs/accelerate/multi_process.yaml"


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2"])
def test_bad_process_counts_are_refused_naming_the_key(bad):
    with pytest.raises(ValueError, match=r"resources.<class>.processes"):
        launcher(bad, "cpu", "python", "accelerate", "c.yaml")


def test_a_job_over_several_nodes_starts_one_launcher_per_node_under_srun():
    cmd = launcher(16, "cuda", "$QRERASE_PYTHON", "$QRERASE_ACCELERATE", "$QRERASE_WORKFLOW/envs/a.yaml", nodes=2)
    words = shlex.split(cmd)
    assert words[:8] == ["srun", "--nodes", "2", "--ntasks-per-node", "1", "--overlap", "--kill-on-bad-exit", "1"]
    assert words[8:11] == ["$QRERASE_PYTHON", "-m", "qrerase.workflow.multinode"]
    assert words[words.index("--processes-per-node") + 1] == "8" and words[-1] == "--"
    assert '"$QRERASE_ACCELERATE"' in cmd  # still expanded by the shell, per node
    assert launcher(4, "cpu", "p", "a", "c", nodes=2).startswith("ACCELERATE_USE_CPU=true srun ")
    with pytest.raises(ValueError, match="divides the 12 processes"):
        launcher(12, "cuda", "p", "a", "c", nodes=8)


def test_each_node_runs_accelerate_launch_with_its_slurm_machine_rank():
    """The argv of each node's launcher from Slurm's variables; the main node's address from
    QRERASE_MAIN_ADDR (SLURM_JOB_NODELIST's expansion by Slurm's scontrol: tests/integration/test_multinode.py)."""
    from qrerase.workflow.multinode import main_address, node_command

    env = {"SLURM_NODEID": "1", "SLURM_NNODES": "2", "SLURM_JOB_ID": "123456", "QRERASE_MAIN_ADDR": "gpu07"}
    argv = node_command(env, 2, 8, "accelerate", "c.yaml", ["train.py", "--job", "{}"])
    flags = dict(zip(argv[2:16:2], argv[3:16:2]))
    assert argv[:2] == ["accelerate", "launch"] and argv[-3:] == ["train.py", "--job", "{}"]
    assert flags["--num_machines"] == "2" and flags["--machine_rank"] == "1" and flags["--num_processes"] == "16"
    assert flags["--main_process_ip"] == "gpu07"
    assert flags["--main_process_port"] == str(20000 + 123456 % 20000) and flags["--rdzv_backend"] == "static"
    local = {"SLURM_NODEID": "0", "QRERASE_MAIN_ADDR": "127.0.0.1", "QRERASE_MAIN_PORT": "29512"}
    assert main_address(local) == "127.0.0.1" and "29512" in node_command(local, 2, 1, "a", "c", ["t.py"])
    for bad, msg in [
        ({**env, "SLURM_NNODES": "3"}, "the job has 3 nodes"),
        ({**env, "SLURM_NODEID": "2"}, "SLURM_NODEID 2 is not in 0..1"),
        ({"SLURM_NODEID": "0", "SLURM_JOB_ID": "1"}, "neither QRERASE_MAIN_ADDR nor SLURM_JOB_NODELIST"),
        ({"SLURM_NODEID": "0", "QRERASE_MAIN_ADDR": "h"}, "neither QRERASE_MAIN_PORT nor SLURM_JOB_ID"),
    ]:
        with pytest.raises(ValueError, match=msg):
            node_command(bad, 2, 8, "a", "c", ["t.py"])


def _spec(tmp_path):
    inp = InputFiles([str(tmp_path / "init"), str(tmp_path / "data.jsonl")])
    inp._set_name("init", 0)
    inp._set_name("data", 1)
    out = OutputFiles([str(tmp_path / "out" / "model"), str(tmp_path / "out" / "loss.csv")])
    out._set_name("model", 0)
    out._set_name("curve", 1)
    wc = Wildcards(["tofu_forget10", "full"])
    wc._set_name("exp", 0)
    wc._set_name("which", 1)
    params = {"model": CONFIG["model"], "train": CONFIG["finetune"], "seed": 3}
    return job_spec("finetune", input=inp, output=out, wildcards=wc, params=params, config=CONFIG)


def test_the_job_spec_round_trips_to_the_attributes_of_snakemakes_object(tmp_path, monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    spec = _spec(tmp_path)
    j = load_job(["--threads", "2", "--log", str(tmp_path / "x.log"), "--job", spec])
    assert j.rule == "finetune" and j.threads == 2 and j.job_threads == 2 and j.world_size == 1
    assert j.input.init == str(tmp_path / "init") and j.input[1] == str(tmp_path / "data.jsonl")
    assert list(j.input) == [str(tmp_path / "init"), str(tmp_path / "data.jsonl")]
    assert "init" in j.input.keys() and "tokenizer" not in j.input.keys()
    with pytest.raises(AttributeError):
        _ = j.input.tokenizer
    shadowing = NamedList(["a.csv"], {"index": "a.csv"})  # a name that is a list method: the entry
    assert shadowing.index == "a.csv" and shadowing["index"] == "a.csv"
    assert j.output.model.endswith("out/model") and j.output[1].endswith("loss.csv")
    assert j.params.seed == 3 and j.params.train == CONFIG["finetune"] and j.params.get("adapter") is None
    assert j.wildcards.get("which") == "full" and j.wildcards.exp == "tofu_forget10"
    assert list(j.log) == [str(tmp_path / "x.log")]
    # the config entries the params come from, nested: the record's subset is the script: job's
    assert provenance.config_subset(j.config, dict(j.params.items())) == provenance.config_subset(
        CONFIG, dict(j.params.items())
    )
    assert "tofu" not in j.config and j.config["model"] == CONFIG["model"]


def test_a_process_gets_its_share_of_the_threads(tmp_path, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    j = LaunchedJob(json.loads(_spec(tmp_path)), threads=5, log=[], scriptdir=str(tmp_path))
    assert (j.threads, j.job_threads, j.world_size) == (2, 5, 2)
    j = LaunchedJob(json.loads(_spec(tmp_path)), threads=1, log=[], scriptdir=str(tmp_path))
    assert j.threads == 1


def test_a_broken_job_spec_is_a_one_line_error(tmp_path):
    with pytest.raises(ValueError, match="--job: not a JSON job spec"):
        load_job(["--threads", "1", "--job", "{nope"])
    with pytest.raises(ValueError, match="--job: the job spec lacks config"):
        load_job(
            [
                "--threads",
                "1",
                "--job",
                json.dumps({"rule": "r", "input": {}, "output": {}, "wildcards": {}, "params": {}}),
            ]
        )


def _run(tmp_path, monkeypatch, rank):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RANK", str(rank))
    monkeypatch.setenv("WORLD_SIZE", "2")
    (tmp_path / "init").mkdir(exist_ok=True)
    (tmp_path / "init" / "w.txt").write_text("w")
    (tmp_path / "data.jsonl").write_text("{}\n")
    log_file = tmp_path / "job.log"
    j = load_job(["--threads", "2", "--log", str(log_file), "--job", _spec(tmp_path)])
    with job(j, seed=3):
        if rank == 0:  # the scripts' rank-0 guard
            (tmp_path / "out" / "model").mkdir(parents=True)
            (tmp_path / "out" / "model" / "w.txt").write_text("trained")
            (tmp_path / "out" / "loss.csv").write_text("step,loss\n")
    return j, log_file


def test_only_rank_0_writes_the_log_and_the_provenance_record_with_world_size(tmp_path, monkeypatch):
    j, log_file = _run(tmp_path, monkeypatch, rank=1)
    assert not log_file.exists() and not (tmp_path / provenance.RECORD_DIR).exists()
    j, log_file = _run(tmp_path, monkeypatch, rank=0)
    assert "rule finetune finished" in log_file.read_text()
    record = json.loads(provenance.record_path(j.output.model).read_text())
    assert record["world_size"] == 2 and record["threads"] == 2 and record["rule"] == "finetune"
    assert record["params"]["train"] == CONFIG["finetune"]
    assert record["config"] == {"finetune": CONFIG["finetune"], "model": CONFIG["model"], "seed": 3}


GIB = 1 << 30


@pytest.mark.parametrize("device", ["cpu", "cuda:1"])
def test_inference_on_the_cpu_or_a_named_gpu_is_loaded_whole(device):
    assert inference_placement(device, [80 * GIB, 80 * GIB]) == {}


@pytest.mark.parametrize("device", ["auto", "cuda"])
def test_inference_spreads_over_several_gpus_with_max_memory(device):
    assert inference_placement(device, [80 * GIB]) == {}  # one GPU holds it or nothing does
    assert inference_placement(device, []) == {}
    kwargs = inference_placement(device, [80 * GIB, 40 * GIB], fraction=0.5)
    assert kwargs == {"device_map": "auto", "max_memory": {0: 40 * GIB, 1: 20 * GIB}}
    assert inference_placement(device, [10, 10, 10])["max_memory"] == {0: 9, 1: 9, 2: 9}
    with pytest.raises(ValueError, match="fraction"):
        inference_placement(device, [10, 10], fraction=0)
