"""Checkpoints: averaging (Vaswani et al., 2017, §6.1) and atomic, rotating saves of a training run.

"For the base models, we used a single model obtained by averaging the last 5 checkpoints, which
were written at 10-minute intervals. For the big models, we averaged the last 20 checkpoints."

No well-kept library offers this for safetensors checkpoints: fairseq's ``scripts/average_checkpoints.py``
does it for fairseq's own ``.pt`` format, and neither transformers nor accelerate has it. So it is
written here, for the two layouts this project produces:

* a folder holding ``model.safetensors`` — what both ``model.save_pretrained(folder)`` and
  ``accelerate.Accelerator.save_state(folder)`` write (a sharded ``save_pretrained`` folder, with
  ``model.safetensors.index.json``, works too);
* a ``.safetensors`` file.

Tied weights. Our model shares one matrix between the source embedding, the target embedding and the
pre-softmax layer (§3.4). Both ``save_pretrained`` and ``Accelerator.save_state`` store it once, as
``model.shared.weight``, and drop the tied names ``model.encoder.embed_tokens.weight``,
``model.decoder.embed_tokens.weight`` and ``lm_head.weight``. :func:`average_into_model` fills them in
from whichever name of a tied group the file holds, then loads with strict key matching, so that the
tied parameters remain one tensor.

Wrapper prefixes. ``Accelerator.save_state`` saves the *prepared* model without unwrapping it, so under
DDP the keys start with ``module.`` and for a ``torch.compile``-d model with ``_orig_mod.``. A
checkpoint whose keys *all* carry such a prefix is read without it.

Saving. :func:`save_checkpoint` writes ``accelerator.save_state`` into a temporary folder and renames it
to ``checkpoint-<step>``, so that the newest checkpoint is always complete; :func:`list_checkpoints` lists
the complete ones. The package's other writes that must never be seen half-done go through the same
pieces: :func:`save_folder_atomically` (the final model, the tokenizer, a CTranslate2 export),
:func:`write_text_atomically` (a hypotheses file) and :func:`write_json_atomically` (settings and results).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from .distributed import any_process, on_main_process

__all__ = [
    "average_checkpoints",
    "average_into_model",
    "incomplete_checkpoints",
    "list_checkpoints",
    "resolve_checkpoint_files",
    "save_checkpoint",
    "save_folder_atomically",
    "write_json_atomically",
    "write_text_atomically",
]

CHECKPOINT_PREFIX = "checkpoint-"
STATE_FILE = "trainer_state.json"
SAFE_WEIGHTS_NAME = "model.safetensors"
SAFE_WEIGHTS_INDEX_NAME = "model.safetensors.index.json"
_WRAPPER_PREFIXES = ("module.", "_orig_mod.")


def _few(names: Iterable[str], k: int = 5) -> str:
    names = sorted(names)
    shown = ", ".join(repr(n) for n in names[:k])
    return shown + (f" (and {len(names) - k} more)" if len(names) > k else "")


def resolve_checkpoint_files(path: str | os.PathLike) -> list[Path]:
    """The safetensors file(s) of one checkpoint: ``path`` itself, or the weights inside the folder ``path``."""
    path = Path(path)
    expected = (
        f"expected a checkpoint folder holding {SAFE_WEIGHTS_NAME} (as written by save_pretrained or "
        f"Accelerator.save_state) or a .safetensors file"
    )
    if path.is_dir():
        single = path / SAFE_WEIGHTS_NAME
        if single.is_file():
            return [single]
        index = path / SAFE_WEIGHTS_INDEX_NAME
        if index.is_file():
            try:
                weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
            except (OSError, ValueError, KeyError, TypeError) as error:
                raise ValueError(f"{index} is not a valid safetensors index ({error}).") from None
            return [path / name for name in sorted(set(weight_map.values()))]
        contents = sorted(p.name for p in path.iterdir())
        found = _few(contents, 8) if contents else "nothing"
        raise ValueError(f"Checkpoint folder {path} has no {SAFE_WEIGHTS_NAME}: {expected}. It contains {found}.")
    if path.is_file():
        return [path]
    raise ValueError(f"Checkpoint {path} does not exist: {expected}.")


def _strip_wrapper_prefixes(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    changed = True
    while changed and state:
        changed = False
        for prefix in _WRAPPER_PREFIXES:
            if all(key.startswith(prefix) for key in state):
                state = {key[len(prefix) :]: value for key, value in state.items()}
                changed = True
    return state


def _load_checkpoint(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    state: dict[str, torch.Tensor] = {}
    for file in resolve_checkpoint_files(path):
        if not file.is_file():
            raise ValueError(f"Checkpoint {path}: shard {file} listed in its index does not exist.")
        try:
            part = load_file(str(file), device="cpu")
        except Exception as error:  # safetensors raises SafetensorError (or OSError) on a bad file
            raise ValueError(
                f"{file} is not a valid safetensors file (truncated, corrupt, or another format such as a "
                f"torch .bin/.pt pickle): {error}"
            ) from None
        state.update(part)
    return _strip_wrapper_prefixes(state)


def average_checkpoints(paths: list[str | os.PathLike]) -> dict[str, torch.Tensor]:
    """Element-wise mean of several checkpoints of the same model (the paper's checkpoint averaging).

    Float tensors are summed in float64 and the mean is cast back to each tensor's own dtype, so the
    average of identical checkpoints is bit-exact. Non-float tensors (integer buffers and the like)
    must be equal in every checkpoint and are copied. Checkpoints are read one at a time, so memory
    holds one checkpoint plus the float64 sums.

    Args:
        paths: checkpoint folders holding ``model.safetensors`` (``save_pretrained`` or
            ``Accelerator.save_state``) and/or ``.safetensors`` files, e.g. the last 5 (base model)
            or 20 (big model) checkpoints of a run.

    Returns:
        The averaged state dict (CPU tensors), with the keys of the files (tied weights appear once,
        as saved; :func:`average_into_model` loads it into a model).

    Raises:
        ValueError: no paths; a path that does not exist or a folder without ``model.safetensors``;
            a file that is not valid safetensors; checkpoints with different key sets, shapes, or
            (for non-float tensors) values.
    """
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    paths = list(paths)
    if not paths:
        raise ValueError("average_checkpoints() needs at least one checkpoint path, got an empty list.")

    first_path = paths[0]
    first = _load_checkpoint(first_path)
    sums: dict[str, torch.Tensor] = {}
    result: dict[str, torch.Tensor] = {}
    for key, tensor in first.items():
        if tensor.is_floating_point():
            sums[key] = tensor.to(torch.float64, copy=True)
        else:
            result[key] = tensor
    dtypes = {key: tensor.dtype for key, tensor in first.items()}
    shapes = {key: tuple(tensor.shape) for key, tensor in first.items()}
    del first

    for path in paths[1:]:
        state = _load_checkpoint(path)
        if state.keys() != shapes.keys():
            only_first = shapes.keys() - state.keys()
            only_here = state.keys() - shapes.keys()
            parts = []
            if only_first:
                parts.append(f"{len(only_first)} key(s) only in {first_path}: {_few(only_first)}")
            if only_here:
                parts.append(f"{len(only_here)} key(s) only in {path}: {_few(only_here)}")
            raise ValueError(
                f"Checkpoints {first_path} and {path} have different key sets, so they are not checkpoints "
                f"of the same model: " + "; ".join(parts) + "."
            )
        for key, tensor in state.items():
            if tuple(tensor.shape) != shapes[key]:
                raise ValueError(
                    f"Checkpoints {first_path} and {path} have different shapes for {key!r}: "
                    f"{shapes[key]} vs {tuple(tensor.shape)}."
                )
            if key in sums:
                if not tensor.is_floating_point():
                    raise ValueError(
                        f"{key!r} is a float tensor ({dtypes[key]}) in {first_path} but {tensor.dtype} in {path}."
                    )
                sums[key] += tensor.to(torch.float64)
            elif not torch.equal(tensor, result[key]):
                raise ValueError(
                    f"Non-float tensor {key!r} ({dtypes[key]}) differs between {first_path} and {path}; "
                    f"only float tensors are averaged, others must be equal in every checkpoint."
                )
        del state

    n = len(paths)
    for key, total in sums.items():
        result[key] = (total / n).to(dtypes[key])
    return {key: result[key] for key in shapes}  # the files' key order


def _tied_groups(model: torch.nn.Module) -> list[list[str]]:
    """State-dict names that refer to the same parameter/buffer object (e.g. the shared embedding)."""
    by_tensor: dict[int, list[str]] = {}
    for name, tensor in model.state_dict(keep_vars=True).items():
        by_tensor.setdefault(id(tensor), []).append(name)
    return [names for names in by_tensor.values() if len(names) > 1]


def average_into_model(model: torch.nn.Module, paths: list[str | os.PathLike]) -> Any:
    """Load the average of the checkpoints ``paths`` into ``model`` (in place) and return it.

    Keys must match the model's exactly (``strict``), except for tied weights: a checkpoint stores a
    tied group (``model.shared.weight`` = ``model.encoder.embed_tokens.weight`` =
    ``model.decoder.embed_tokens.weight`` = ``lm_head.weight``) under at least one of its names, and
    the others are filled in from it. The values are copied into the model's existing tensors, so tied
    parameters remain one tensor (``model.lm_head.weight is model.model.shared.weight``).

    Raises:
        ValueError: any error of :func:`average_checkpoints`; a tied group absent from the checkpoint,
            or stored under several names with different values; keys missing from or unexpected by
            the model; shape mismatches.
    """
    averaged = average_checkpoints(paths)
    expected = model.state_dict()
    for group in _tied_groups(model):
        present = [name for name in group if name in averaged]
        if not present:
            continue  # reported below as missing keys
        source = averaged[present[0]]
        for other in present[1:]:
            if not torch.equal(averaged[other], source):
                raise ValueError(
                    f"The checkpoint stores the tied weights {present[0]!r} and {other!r} with different values, "
                    f"but in this model they are one tensor (config.tie_word_embeddings="
                    f"{getattr(getattr(model, 'config', None), 'tie_word_embeddings', None)})."
                )
        for name in group:
            averaged.setdefault(name, source)

    missing = expected.keys() - averaged.keys()
    unexpected = averaged.keys() - expected.keys()
    if missing or unexpected:
        parts = []
        if missing:
            parts.append(f"{len(missing)} missing from the checkpoint: {_few(missing)}")
        if unexpected:
            parts.append(f"{len(unexpected)} not in the model: {_few(unexpected)}")
        raise ValueError(
            "The averaged checkpoints do not match the model's parameters (" + "; ".join(parts) + "). Were they "
            "saved from a model with the same configuration?"
        )
    mismatched = [
        f"{key!r}: checkpoint {tuple(value.shape)} vs model {tuple(expected[key].shape)}"
        for key, value in averaged.items()
        if tuple(value.shape) != tuple(expected[key].shape)
    ]
    if mismatched:
        raise ValueError("Shape mismatch between the averaged checkpoints and the model: " + "; ".join(mismatched[:5]))

    model.load_state_dict(averaged, strict=True)
    return model


# --------------------------------------------------------------------------------------------
# Saving: written to a temporary folder, then renamed, so the newest checkpoint is always complete.
# --------------------------------------------------------------------------------------------
def list_checkpoints(checkpoint_dir: Path) -> list[Path]:
    """Complete checkpoints, oldest first. Half-written ``.tmp-*`` folders are not listed."""
    if not checkpoint_dir.is_dir():
        return []
    found = [p for p in checkpoint_dir.iterdir() if p.is_dir() and p.name.startswith(CHECKPOINT_PREFIX)]
    found = [p for p in found if (p / STATE_FILE).is_file()]
    return sorted(found, key=lambda p: int(p.name[len(CHECKPOINT_PREFIX) :]))


def incomplete_checkpoints(checkpoint_dir: Path) -> list[Path]:
    """Leftovers of an interrupted save (``.tmp-checkpoint-N``) or deletion (``.tmp-deleting-checkpoint-N``)."""
    if not checkpoint_dir.is_dir():
        return []
    return sorted(p for p in checkpoint_dir.iterdir() if p.name.startswith(".tmp-"))


def save_checkpoint(accelerator: Any, checkpoint_dir: Path, state: dict, keep: int) -> Path:
    """``accelerator.save_state`` into ``.tmp-checkpoint-N``, then an atomic rename to ``checkpoint-N``;
    the oldest checkpoints beyond ``keep`` are deleted only after the new one is complete.

    A process killed at any moment leaves the previous checkpoints complete (tested with SIGKILL in
    ``benchmarks/kill_resume.py``). A failed write (for example a full disk) removes the half-written
    folder and raises an ``OSError`` that names the newest complete checkpoint. With several processes,
    every process enters the same collectives whatever happens, and all of them raise if any write failed
    (see :mod:`~vanilla_transformer.distributed`).
    """
    final = checkpoint_dir / f"{CHECKPOINT_PREFIX}{state['step']}"
    tmp = checkpoint_dir / f".tmp-{final.name}"

    def clear() -> None:
        checkpoint_dir.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)

    on_main_process(accelerator, f"preparing {tmp}", clear)
    error = None
    try:
        with tied_weights_warning_silenced():
            accelerator.save_state(str(tmp))  # every process writes its own RNG states
    except OSError as caught:
        error = caught
    if any_process(accelerator, error is not None):
        on_main_process(accelerator, f"removing {tmp}", lambda: shutil.rmtree(tmp, ignore_errors=True))
        raise _write_failed(final, checkpoint_dir, error) from error

    def complete() -> None:
        try:
            write_json_atomically(tmp / STATE_FILE, state)
        except OSError as caught:
            shutil.rmtree(tmp, ignore_errors=True)
            raise _write_failed(final, checkpoint_dir, caught) from caught
        _fsync_files(tmp)  # the data reach the disk before the rename does (a power cut, not only a kill)
        if final.exists():  # same step saved again (e.g. after a resume): replace it
            _delete_atomically(final)
        os.replace(tmp, final)
        _fsync_dir(checkpoint_dir)
        for old in list_checkpoints(checkpoint_dir)[:-keep]:
            _delete_atomically(old)

    on_main_process(accelerator, f"completing {final}", complete)
    return final


def _write_failed(final: Path, checkpoint_dir: Path, error: OSError | None) -> OSError:
    previous = list_checkpoints(checkpoint_dir)
    kept = f"the newest complete checkpoint, {previous[-1]}, is intact" if previous else "no earlier checkpoint exists"
    reason = (error.strerror or str(error)) if error is not None else "on another process; its message says why"
    return OSError(
        getattr(error, "errno", None),
        f"Writing checkpoint {final.name} failed ({reason}); the half-written folder was removed "
        f"and {kept}. Free disk space (or lower save_total_limit) and rerun with --resume_from_checkpoint.",
    )


#: What accelerate says at every save of a model with tied weights (logger ``accelerate.utils.other``).
TIED_WEIGHTS_WARNING = "Removed shared tensor"


@contextlib.contextmanager
def tied_weights_warning_silenced():
    """Drop accelerate's "Removed shared tensor ... while saving" warning for the duration, and nothing else.

    The model shares one matrix between both embeddings and the output layer (§3.4): a saved file that
    holds it once is what is meant, and the warning would otherwise print at every checkpoint.
    """

    def expected(record: logging.LogRecord) -> bool:
        return TIED_WEIGHTS_WARNING not in record.getMessage()

    logger = logging.getLogger("accelerate.utils.other")
    logger.addFilter(expected)
    try:
        yield
    finally:
        logger.removeFilter(expected)


def save_folder_atomically(folder: str | os.PathLike, write: Callable[[Path], Any]) -> Path:
    """``write(tmp)`` fills a temporary sibling folder, which then replaces ``folder``: a crash leaves
    either the old folder or the new one, never a mixture. If ``write`` raises, the temporary folder is
    removed and ``folder`` is left as it was. Returns ``folder``."""
    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = folder.with_name(f".tmp-{folder.name}")
    shutil.rmtree(tmp, ignore_errors=True)  # what a killed writer left
    try:
        write(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if folder.exists():
        _delete_atomically(folder)
    os.replace(tmp, folder)
    return folder


def write_text_atomically(path: str | os.PathLike, text: str) -> None:
    """``text`` in ``path`` (UTF-8, line endings as given), through a temporary file in the same folder that
    is synced and then renamed: readers, and a crash, see the old file or the new one, never a partial one.
    The folder is made if it is missing."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")  # one writer per process; the file mode as open() makes it
    try:
        with open(tmp, "w", encoding="utf-8", newline="") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def write_json_atomically(path: str | os.PathLike, data: dict) -> None:
    """``data`` as JSON in ``path`` (:func:`write_text_atomically`): a crash leaves the old file or the new one."""
    write_text_atomically(path, json.dumps(data, indent=2))


def _delete_atomically(folder: Path) -> None:
    """Rename, then delete: a process killed half-way leaves a ``.tmp-`` folder that no one reads,
    never a ``checkpoint-N`` with some of its files gone."""
    doomed = folder.with_name(f".tmp-deleting-{folder.name}")
    os.replace(folder, doomed)
    shutil.rmtree(doomed)


def _fsync_files(folder: Path) -> None:
    for path in folder.rglob("*"):
        if path.is_file():
            with open(path, "rb") as f:
                os.fsync(f.fileno())


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
