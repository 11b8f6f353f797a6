"""Several processes that never wait for each other forever: decisions taken once, collectives entered by all.

A collective (a barrier, a reduce, a broadcast, DDP's gradient all-reduce) returns only when every process
has entered it. So a branch whose condition may differ between processes must not contain one: if one
process looks at the disk, finds a file that another process has not written yet, and skips a barrier that
the others enter, both wait forever. Every such decision of a run is taken here, by the main process, and
sent to the others (:func:`agree`); work that only the main process does is followed by a collective that
every process enters whatever happened (:func:`on_main_process`), so that a failure on the main process
stops the others with a message instead of leaving them in a barrier.

Accelerate (considered) has ``main_process_first()`` and ``wait_for_everyone()``, which are barriers; it
has no way to carry the main process's decision or failure to the others, hence these helpers on top of
``torch.distributed``'s broadcast and all-reduce.

Test-only delays. ``VANILLA_TRANSFORMER_TEST_DELAYS`` makes chosen processes sleep at named points of a run,
so that tests can give the processes every order of arrival at those points, e.g.
``VANILLA_TRANSFORMER_TEST_DELAYS="tokenizer:1=2,save:0=0.5"``: process 1 sleeps 2 s before the tokenizer
is decided and process 0 sleeps 0.5 s before each checkpoint save. The points are :data:`DELAY_POINTS`.
Unset (always, outside tests), :func:`test_delay` does nothing.
"""

from __future__ import annotations

import os
import pickle
import time
from collections import deque
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = [
    "DELAY_POINTS",
    "DELAYS_VARIABLE",
    "MainProcessFailed",
    "agree",
    "any_process",
    "on_main_process",
    "sum_over_processes",
    "test_delay",
]

T = TypeVar("T")

DELAYS_VARIABLE = "VANILLA_TRANSFORMER_TEST_DELAYS"

#: Where a run calls :func:`test_delay`, in the order of a run.
DELAY_POINTS = {
    "data": "before reading the corpus",
    "tokenizer": "before the tokenizer is loaded or trained",
    "checkpoints": "before the run's checkpoints are listed",
    "resume": "before a checkpoint is loaded to resume",
    "step": "before each optimizer step's batches are read",
    "evaluate": "before each validation",
    "save": "before each checkpoint is saved",
    "finish": "before the last checkpoints are averaged and the final folder saved",
}


def _parse_delays(text: str) -> dict[tuple[str, int], float]:
    delays = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        try:
            where, seconds = item.split("=")
            point, rank = where.split(":")
            delays[(point.strip(), int(rank))] = float(seconds)
        except ValueError:
            raise ValueError(
                f"{DELAYS_VARIABLE}: cannot read {item!r}; write POINT:RANK=SECONDS items separated by commas, "
                f"e.g. 'tokenizer:1=2,save:0=0.5'."
            ) from None
        if point.strip() not in DELAY_POINTS:
            raise ValueError(
                f"{DELAYS_VARIABLE}: unknown point {point.strip()!r}; the points are {', '.join(DELAY_POINTS)}."
            )
    return delays


def test_delay(point: str, rank: int) -> None:
    """Sleep as ``VANILLA_TRANSFORMER_TEST_DELAYS`` asks for process ``rank`` at ``point`` (test-only; see above)."""
    text = os.environ.get(DELAYS_VARIABLE)
    if not text:
        return
    assert point in DELAY_POINTS, point
    seconds = _parse_delays(text).get((point, rank), 0.0)
    if seconds > 0:
        time.sleep(seconds)


test_delay.__test__ = False  # not a test, whatever pytest's name rules say


# Gloo's worker thread drops its references to a finished collective while it holds its queue lock. If that
# releases the last C++ reference to a Python tensor, it needs the GIL (seen with torch 2.13: the tensor's
# Python object is released from C++). A main thread that destroys the process group just then
# (``accelerator.end_training()``, or the DDP model freed at the end of ``train``) holds the GIL and waits for
# that lock: both wait forever (seen at the end of 2- and 3-process runs, after a final broadcast). So this
# module's collectives are issued with ``async_op=True`` and their work handles are kept here, by Python: the
# worker's release is then only a count, and the tensors are freed later by Python, with the GIL.
_RECENT_WORK: deque = deque(maxlen=64)


def _collective(function: Callable, *args: Any, **kwargs: Any) -> None:
    work = function(*args, async_op=True, **kwargs)
    work.wait()
    _RECENT_WORK.append(work)


def sum_over_processes(accelerator: Any, tensor: Any) -> Any:
    """``tensor`` summed over the processes, in place (an all-reduce every process must enter); returned."""
    if accelerator.num_processes > 1:
        import torch.distributed as dist

        _collective(dist.all_reduce, tensor)
    return tensor


_CONTROL_GROUPS: dict = {}


def _control_group(accelerator: Any):
    """The process group for decisions: the default one where it is gloo (CPUs), else a gloo group made once,
    so that deciding never queues work behind the device's (NCCL's collectives run on the GPU's stream, and
    reading their result back waits for every step queued before them)."""
    import torch.distributed as dist

    if dist.get_backend() == "gloo":
        return None
    key = (dist.get_world_size(), accelerator.process_index)
    if key not in _CONTROL_GROUPS:  # every process gets here at the same decision: new_group is collective
        _CONTROL_GROUPS[key] = dist.new_group(backend="gloo")
    return _CONTROL_GROUPS[key]


def agree(accelerator: Any, value: T) -> T:
    """The main process's ``value`` (anything picklable), on every process: a broadcast every process must enter.

    Use it for each decision that reads something a process could see differently (the disk, a clock),
    so that all processes take the same branch. It travels through host memory (gloo), whatever the device.
    (``torch.distributed.broadcast_object_list`` does the same, but without ``async_op``; see ``_RECENT_WORK``.)
    """
    if accelerator.num_processes == 1:
        return value
    import torch
    import torch.distributed as dist

    group = _control_group(accelerator)
    if accelerator.is_main_process:
        payload = torch.frombuffer(bytearray(pickle.dumps(value)), dtype=torch.uint8)
        size = torch.tensor([payload.numel()], dtype=torch.int64)
    else:
        size = torch.zeros(1, dtype=torch.int64)
    _collective(dist.broadcast, size, src=0, group=group)
    if not accelerator.is_main_process:
        payload = torch.empty(int(size.item()), dtype=torch.uint8)
    _collective(dist.broadcast, payload, src=0, group=group)
    return value if accelerator.is_main_process else pickle.loads(payload.numpy().tobytes())


def any_process(accelerator: Any, flag: bool) -> bool:
    """Whether ``flag`` is true on at least one process: a sum over processes (through host memory, gloo) that
    every process must enter. It waits for the other processes, never for the device."""
    if accelerator.num_processes == 1:
        return bool(flag)
    import torch
    import torch.distributed as dist

    count = torch.tensor([float(flag)])
    _collective(dist.all_reduce, count, group=_control_group(accelerator))
    return bool(count.item() > 0)


class MainProcessFailed(RuntimeError):
    """Raised on the other processes when the main process's work failed (its own error says why)."""


def on_main_process(accelerator: Any, what: str, work: Callable[[], T]) -> T | None:
    """``work()`` on the main process while the others wait; then every process learns whether it failed.

    The main process re-raises its own error; the others raise :class:`MainProcessFailed`, which points to it. On the
    main process, returns ``work()``'s result; elsewhere ``None``.
    """
    result, error = None, None
    if accelerator.is_main_process:
        try:
            result = work()
        except BaseException as caught:  # noqa: BLE001 - re-raised below, after the others have been told
            error = caught
    failed = agree(accelerator, None if error is None else f"{type(error).__name__}: {error}")
    if error is not None:
        raise error
    if failed is not None:
        raise MainProcessFailed(f"The main process failed while {what} ({failed}); its message above says more.")
    return result
