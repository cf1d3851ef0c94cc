"""The multi-node launcher's main-node address from SLURM_JOB_NODELIST, expanded by Slurm's own
``scontrol show hostnames`` (qrerase.workflow.multinode.slurm_hostnames); the expansion test skips,
naming the package, where Slurm's client commands are not installed."""

from __future__ import annotations

import shutil

import pytest

from qrerase.workflow.multinode import main_address, node_command, slurm_hostnames

needs_scontrol = pytest.mark.skipif(
    shutil.which("scontrol") is None,
    reason="Slurm's scontrol is not installed (apt-get install slurm-client, or slurm-wlm as .ci/run does)",
)


@needs_scontrol
def test_the_main_node_is_the_first_host_slurm_expands(tmp_path, monkeypatch):
    conf = tmp_path / "slurm.conf"  # scontrol show hostnames reads only a config, no controller
    conf.write_text("ClusterName=t\nSlurmctldHost=localhost\nNodeName=localhost CPUs=1\nPartitionName=p Nodes=ALL\n")
    monkeypatch.setenv("SLURM_CONF", str(conf))
    assert slurm_hostnames("gpu[07-08],cpu1") == ["gpu07", "gpu08", "cpu1"]
    env = {"SLURM_NODEID": "1", "SLURM_NNODES": "2", "SLURM_JOB_ID": "123456", "SLURM_JOB_NODELIST": "gpu[07-08]"}
    argv = node_command(env, 2, 8, "accelerate", "c.yaml", ["train.py"])
    assert argv[argv.index("--main_process_ip") + 1] == "gpu07"  # the first host: machine rank 0
    with pytest.raises(
        ValueError, match=r"^multinode: scontrol show hostnames 'gpu\[09-07\]' failed: Invalid hostlist"
    ):
        slurm_hostnames("gpu[09-07]")


def test_without_scontrol_the_address_error_names_the_variable_to_set(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty folder: no scontrol on the PATH
    with pytest.raises(ValueError, match="scontrol \\(Slurm\\) is not installed here.*set QRERASE_MAIN_ADDR") as info:
        main_address({"SLURM_JOB_NODELIST": "gpu[07-08]"})
    assert "\n" not in str(info.value)
