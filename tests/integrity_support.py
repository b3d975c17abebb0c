"""Shared pieces of the integrity tests (test_bad_inputs.py, test_integrity.py): tiny IDX and
CIFAR datasets written on the spot, a tiny run config, planted pickle payloads, snapshots of
folders, the one-line error check and the processes of a running sweep (from /proc)."""

from __future__ import annotations

import hashlib
import pickle
import struct
from pathlib import Path

import numpy as np

TINY_IMAGE_SIDE = 28  # MNIST-shaped images (the loader refuses other sizes); training takes ms


def idx_bytes(arr: np.ndarray) -> bytes:
    """An IDX file holding uint8 ``arr`` (header: 00 00 08 ndim, big-endian dims)."""
    assert arr.dtype == np.uint8
    return bytes([0, 0, 0x08, arr.ndim]) + struct.pack(f">{arr.ndim}i", *arr.shape) \
        + arr.tobytes()


def write_idx_dataset(folder: Path, *, n_train: int = 64, n_test: int = 32, seed: int = 0,
                      side: int = TINY_IMAGE_SIDE) -> Path:
    """The four MNIST IDX files (raw) with random images and labels 0..9; returns ``folder``."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    arrays = {
        "train-images-idx3-ubyte": rng.integers(0, 256, (n_train, side, side), dtype=np.uint8),
        "train-labels-idx1-ubyte": rng.integers(0, 10, n_train).astype(np.uint8),
        "t10k-images-idx3-ubyte": rng.integers(0, 256, (n_test, side, side), dtype=np.uint8),
        "t10k-labels-idx1-ubyte": rng.integers(0, 10, n_test).astype(np.uint8),
    }
    for name, arr in arrays.items():
        (folder / name).write_bytes(idx_bytes(arr))
    return folder


def write_cifar10(parent: Path, *, per_batch: int = 4, seed: int = 0) -> Path:
    """An official-layout cifar-10-batches-py folder with ``per_batch`` images per file."""
    folder = parent / "cifar-10-batches-py"
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    names = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
    for name in names:
        batch = {b"batch_label": name.encode(),
                 b"data": rng.integers(0, 256, (per_batch, 3072), dtype=np.uint8),
                 b"labels": rng.integers(0, 10, per_batch).tolist()}
        (folder / name).write_bytes(pickle.dumps(batch))
    return folder


def tiny_config(data_dir: Path, out_dir: Path, **overrides: object) -> dict[str, object]:
    """Dotted overrides of a tiny MNIST-layout run (≈1 s to train one epoch)."""
    return {"data.name": "mnist", "data.data_dir": str(data_dir), "model.d": 16,
            "model.n_blocks": 2, "optim.epochs": 1, "optim.batch_size": 32,
            "diagnostics.eval_samples": 32, "diagnostics.rho_samples": 16,
            "diagnostics.rho_directions": 2, "diagnostics.null_draws": 2,
            "run.progress": False, "run.out_dir": str(out_dir), **overrides}


def toml_of(overrides: dict[str, object]) -> str:
    """A TOML config file of dotted overrides (``{"optim.lr": 0.1}`` → ``[optim] lr = 0.1``)."""
    sections: dict[str, list[str]] = {}
    for key, value in overrides.items():
        section, _, name = key.partition(".")
        if isinstance(value, bool):
            text = "true" if value else "false"
        elif isinstance(value, str):
            text = '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
        else:
            text = repr(value)
        sections.setdefault(section, []).append(f"{name} = {text}")
    return "\n".join(f"[{s}]\n" + "\n".join(lines) + "\n" for s, lines in sections.items())


def sweep_toml(overrides: dict[str, object], body: str = "") -> str:
    """A sweep file whose [base] is the run of ``overrides``, followed by ``body``."""
    base = toml_of(overrides).replace("\n[", "\n[base.")
    return "[base." + base[1:] + "\n" + body


class Payload:
    """A planted pickle payload: unpickling it calls ``open(marker, "w")``, so the marker
    file exists exactly when a reader ran code from the file."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):  # noqa: ANN204 - pickle protocol
        return (open, (self.marker, "w"))


def finished_dfa_run(root: Path):  # noqa: ANN201 - a SimpleNamespace
    """One finished tiny DFA run on tiny MNIST-layout IDX files under ``root``: its data
    folder, results folder, run (``train``'s result), overrides and config."""
    from types import SimpleNamespace

    from creditaudit.config import RunConfig
    from creditaudit.run.trainer import train

    data = write_idx_dataset(root / "mnist")
    overrides = tiny_config(data, root / "results", **{"method.name": "dfa"})
    config = RunConfig().replace(**overrides)
    run = train(config)
    assert run.status == "completed"
    return SimpleNamespace(root=root, data=data, results=root / "results", run=run,
                           overrides=overrides, config=config)


def as_written(raw: dict, *, digest: bool = True) -> str:
    """The record.json text of a record dict a test edited (as ``json.loads`` reads it),
    with its content digest recomputed, as if creditaudit had written it (a state a test
    plants: a killed run, a copy), or, with ``digest`` False, without one (a record written
    before digests were kept). A record edited and not rewritten this way is refused."""
    import json

    from creditaudit.files import strict_json
    from creditaudit.records import CONTENT_KEY, content_digest

    try:
        record = strict_json.decode(json.loads(json.dumps(raw)))
    except (ValueError, KeyError, IndexError, TypeError):
        return json.dumps(raw)  # a malformed non_finite block: refused before any digest
    record.pop(CONTENT_KEY, None)
    if digest:
        record[CONTENT_KEY] = content_digest(record)
    return strict_json.dumps(record)


def snapshot(*folders: Path) -> dict[str, str]:
    """path → sha256 of every file below ``folders`` (what a command must leave unchanged)."""
    out = {}
    for folder in folders:
        for path in sorted(folder.rglob("*")):
            if path.is_file():
                out[str(path)] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def assert_one_line_error(out: str, err: str, *fragments: str, progress: str | None = None
                          ) -> str:
    """``err`` is exactly one line ``creditaudit: error: …`` containing every fragment, and
    no traceback was printed anywhere. ``progress``: a prefix of progress lines a command
    prints on stderr once its inputs were accepted (``"sweep: "``), allowed before it."""
    assert "Traceback" not in out + err, err
    lines = [line for line in err.strip().splitlines()
             if progress is None or not line.startswith(progress)]
    assert len(lines) == 1, f"expected one line on stderr, got {len(lines)}:\n{err}"
    assert lines[0].startswith("creditaudit: error: "), lines[0]
    for fragment in fragments:
        assert fragment in lines[0], f"{fragment!r} not in {lines[0]!r}"
    return lines[0]


# --- processes ----------------------------------------------------------------------------
def children(pid: int) -> list[int]:
    """Live processes whose parent is ``pid`` (from /proc; zombies count as gone)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[0] != "Z" and int(fields[1]) == pid:
                found.append(int(entry.name))
    return found


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def nan_weights_after(epoch: int):  # noqa: ANN201 - a Trainer.train_epoch replacement
    """A ``Trainer.train_epoch`` that trains as usual, then, after epoch ``epoch``, fills
    every weight with NaN: the epoch's steps were finite but its last update overflowed, so
    its evaluation is the NaN network's (a run diverged in that epoch)."""
    import torch

    from creditaudit.run.trainer import Trainer

    original = Trainer.train_epoch

    def overflow(self, n):  # noqa: ANN001, ANN202
        stats = original(self, n)
        if n == epoch:
            with torch.no_grad():
                for parameter in self.model.parameters():
                    parameter.fill_(float("nan"))
        return stats

    return overflow


def nan_weights_before(epoch: int):  # noqa: ANN201 - a Trainer.train_epoch replacement
    """A ``Trainer.train_epoch`` that fills every weight with NaN as epoch ``epoch`` starts:
    its first step's loss is not finite, so the run diverges there, unevaluated."""
    import torch

    from creditaudit.run.trainer import Trainer

    original = Trainer.train_epoch

    def overflow(self, n):  # noqa: ANN001, ANN202
        if n == epoch:
            with torch.no_grad():
                for parameter in self.model.parameters():
                    parameter.fill_(float("nan"))
        return original(self, n)

    return overflow


def interrupted_at(monkeypatch, epoch: int) -> None:  # noqa: ANN001 - pytest's MonkeyPatch
    """Ctrl-C when the trainer starts epoch ``epoch`` (a KeyboardInterrupt out of
    ``Trainer.train_epoch``)."""
    from creditaudit.run.trainer import Trainer

    original = Trainer.train_epoch

    def train_epoch(self, current: int):  # noqa: ANN001, ANN202
        if current == epoch:
            raise KeyboardInterrupt
        return original(self, current)

    monkeypatch.setattr(Trainer, "train_epoch", train_epoch)


def tiny_own_loop():  # noqa: ANN201 - (adapted model, x (32, 8), y (32,) in 4 classes)
    """A user's tiny net adapted for its own loop (states after both Tanh layers), with a
    batch to train and record it on."""
    import torch

    from creditaudit import adapt

    x = torch.randn(32, 8, generator=torch.Generator().manual_seed(0))
    y = torch.arange(32) % 4
    net = adapt(torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh(),
                                    torch.nn.Linear(8, 8), torch.nn.Tanh(),
                                    torch.nn.Linear(8, 4)), ["1", "3"], example=x)
    return net, x, y
