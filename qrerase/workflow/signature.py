"""Optional signature of the provenance manifest with a user's SSH key (OpenSSH ``ssh-keygen -Y``).

The audit (:func:`qrerase.workflow.manifest.audit`) proves integrity against accidents and partial
edits, not against a consistent forgery: someone who edits an artifact, its record, ``manifest.json``
and the manifest's own record passes it. A signature closes that gap for the hashed graph: the
manifest holds the sha256 of every hashed artifact, so changing any of them means changing
``manifest.json``, which then no longer matches the signature made with a key the forger lacks.

``qrerase sign results/ --key ~/.ssh/id_ed25519`` writes ``results/provenance/manifest.json.sig``
(``ssh-keygen -Y sign``, namespace :data:`NAMESPACE`); ``qrerase audit results/ --verify-signature
--allowed-signers FILE --identity NAME`` checks it (``ssh-keygen -Y verify``). ``FILE`` is OpenSSH's
allowed-signers format: one ``NAME <public key>`` line per signer (``man ssh-keygen``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from ..io import write_text

__all__ = ["NAMESPACE", "signature_path", "sign_manifest", "verify_manifest"]

#: The signature's namespace: a signature made for another purpose (git, e-mail) does not verify here.
NAMESPACE = "qrerase-manifest"


def signature_path(manifest: str | os.PathLike) -> Path:
    """Where the signature of ``manifest`` lives: ``manifest.json.sig`` beside it."""
    manifest = Path(manifest)
    return manifest.with_name(manifest.name + ".sig")


def _ssh_keygen() -> str:
    found = shutil.which("ssh-keygen")
    if found is None:
        raise FileNotFoundError("ssh-keygen: not found (install OpenSSH's client, e.g. apt-get install openssh-client)")
    return found


def _reason(proc: subprocess.CompletedProcess) -> str:
    lines = [ln.strip() for ln in (proc.stderr + "\n" + proc.stdout).splitlines() if ln.strip()]
    return lines[0] if lines else f"exit status {proc.returncode}"


def sign_manifest(manifest: str | os.PathLike, key: str | os.PathLike) -> Path:
    """Sign ``manifest`` with the SSH private key ``key``; write the signature atomically; return its path.

    FileNotFoundError naming the manifest or the key when absent; ValueError with ssh-keygen's reason
    when it cannot sign (writing nothing)."""
    manifest, key = Path(manifest), Path(key).expanduser()
    if not manifest.is_file():
        raise FileNotFoundError(f"{manifest}: no manifest to sign (run the workflow's default target first)")
    if not key.is_file():
        raise FileNotFoundError(f"{key}: SSH private key not found")
    with manifest.open("rb") as data:
        proc = subprocess.run(
            [_ssh_keygen(), "-Y", "sign", "-f", str(key), "-n", NAMESPACE],
            stdin=data,
            capture_output=True,
            text=True,
        )
    if proc.returncode != 0 or "BEGIN SSH SIGNATURE" not in proc.stdout:
        raise ValueError(f"{manifest}: ssh-keygen could not sign with {key} ({_reason(proc)})")
    out = signature_path(manifest)
    write_text(out, proc.stdout)
    return out


def verify_manifest(manifest: str | os.PathLike, allowed_signers: str | os.PathLike, identity: str) -> str:
    """Check ``manifest.json.sig`` against ``manifest`` for ``identity`` of ``allowed_signers``.

    Returns ssh-keygen's line naming the good signature; a ValueError of one line naming the manifest
    when the signature does not verify (a manifest changed after signing, another signer, another
    namespace); FileNotFoundError naming a missing manifest, signature or allowed-signers file."""
    manifest, allowed = Path(manifest), Path(allowed_signers).expanduser()
    sig = signature_path(manifest)
    for path, what in (
        (manifest, "manifest"),
        (sig, "manifest signature (qrerase sign)"),
        (allowed, "allowed-signers file"),
    ):
        if not path.is_file():
            raise FileNotFoundError(f"{path}: {what} not found")
    with manifest.open("rb") as data:
        proc = subprocess.run(
            [_ssh_keygen(), "-Y", "verify", "-f", str(allowed), "-I", identity, "-n", NAMESPACE, "-s", str(sig)],
            stdin=data,
            capture_output=True,
            text=True,
        )
    if proc.returncode != 0:
        raise ValueError(
            f"{manifest}: signature {sig.name} does not verify for {identity!r} of {allowed} ({_reason(proc)})"
        )
    return proc.stdout.strip()
