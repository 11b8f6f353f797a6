"""``vanilla-transformer train`` as one process of several (started by torchrun), for tests/test_distributed.py.

Before the last checkpoints are averaged, each process writes the SHA-256 of its trained weights to
``OUTPUT_DIR/weights-rank<R>.sha256``, so that a test can check that every process holds the same model.
With ``FAIL_ON_MAIN_PROCESS=1`` the main process fails while writing the final folder's model card (an
injected ``OSError``), to test that the other processes stop too instead of waiting for it.
"""

import hashlib
import os
import sys
from pathlib import Path

from vanilla_transformer import cli, training

_finish = training._finish


def _finish_after_recording_the_weights(config, accelerator, model, *args, **kwargs):
    digest = hashlib.sha256()
    for name, tensor in sorted(accelerator.unwrap_model(model).state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    Path(config.output_dir, f"weights-rank{accelerator.process_index}.sha256").write_text(digest.hexdigest())
    return _finish(config, accelerator, model, *args, **kwargs)


def _failing_model_card(*args, **kwargs):
    raise OSError(28, "No space left on device (injected)")


training._finish = _finish_after_recording_the_weights
if os.environ.get("FAIL_ON_MAIN_PROCESS") == "1":
    training.write_model_card = _failing_model_card
sys.exit(cli.main(sys.argv[1:]))
