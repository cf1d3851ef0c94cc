"""Errors name the thing (issue 34): a write that finds no room and a corrupt (truncated) safetensors
file give one line naming the artifact's path, and leave nothing behind."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from support import REPO
from support.tiny_llama import save_random_lora

from qrerase import io
from qrerase.method.adapters import checkpoint_shapes, task_matrices
from qrerase.method.decompose import decompose
from qrerase.method.formats import load_decompositions, save_decompositions

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")


def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


@pytest.mark.skipif(sys.platform != "linux", reason="RLIMIT_FSIZE / SIGXFSZ as on Linux")
def test_a_write_that_finds_no_room_names_the_artifact(tmp_path):
    # A real "file too large" (EFBIG) from the kernel: the process may write at most 4 KiB per file
    # (SIGXFSZ ignored, so the write fails instead of killing the process), as a full disk would.
    script = textwrap.dedent(
        """
        import resource, signal, sys
        import numpy as np
        from qrerase import io
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
        out = sys.argv[1]

        def model_dir():
            with io.atomic_dir(out + "/model") as tmp:
                (tmp / "model.safetensors").write_bytes(b"x" * 10000)

        for write in (
            model_dir,
            lambda: io.write_text(out + "/table.md", "x" * 10000),
            lambda: io.save_arrays(out + "/factors.safetensors", {"a": np.zeros(5000)}),
            lambda: io.write_text(out + "/small.txt", "fits"),
        ):
            try:
                write()
            except OSError as exc:
                print(exc.errno, exc)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path)],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
    )
    lines = done.stdout.splitlines()
    assert lines[0] == f"27 {tmp_path}/model: could not write (File too large)"
    assert lines[1] == f"27 {tmp_path}/table.md: could not write (File too large)"
    assert lines[2].startswith(f"27 {tmp_path}/factors.safetensors: could not write (") and len(lines) == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["small.txt"]  # no temporaries, no partial files


def test_a_truncated_safetensors_file_is_named(tmp_path):
    rng = np.random.default_rng(0)
    factors = tmp_path / "factors.safetensors"
    save_decompositions(factors, {"m.q_proj": decompose(rng.standard_normal((6, 5)), None, 2, "cpqr")})
    _truncate(factors)
    with pytest.raises(ValueError, match=rf"^{factors}: not a readable safetensors file \(.*\)$"):
        io.load_arrays(factors)
    with pytest.raises(ValueError, match=rf"^{factors}: not a readable safetensors file"):
        load_decompositions(factors)
    with pytest.raises(ValueError, match=rf"^{factors}: not a readable safetensors file"):
        with io.open_safetensors(factors):
            pass
    with pytest.raises(FileNotFoundError, match=r"absent\.safetensors: no such safetensors file"):
        with io.open_safetensors(tmp_path / "absent.safetensors"):
            pass
    # a model checkpoint and a LoRA adapter with a truncated weights file
    model = tmp_path / "model"
    model.mkdir()
    io.save_arrays(model / "model.safetensors", {"w.weight": np.ones((4, 4), np.float32)})
    _truncate(model / "model.safetensors")
    with pytest.raises(ValueError, match=rf"^{model}/model\.safetensors: not a readable safetensors file"):
        checkpoint_shapes(model)
    adapter, _ = save_random_lora(tmp_path / "adapter", seed=3, target_modules=["q_proj"])
    _truncate(Path(adapter) / "adapter_model.safetensors")
    with pytest.raises(ValueError, match=r"adapter_model\.safetensors: not a readable safetensors file"):
        task_matrices(adapter)
