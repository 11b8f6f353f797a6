"""The paper's training recipe (§5) on Accelerate: one loop for a laptop CPU, one GPU or many.

    §5.1  batches of sentence pairs with similar lengths, capped in tokens  -> data.TokenBucketBatchSampler
    §5.3  Adam(β1 0.9, β2 0.98, ε 1e-9);
          lrate = d_model^-0.5 · min(step^-0.5, step · warmup^-1.5)        -> schedule.make_optimizer_and_schedule
    §5.4  residual dropout (config.dropout) and label smoothing ε_ls = 0.1  -> the model's loss (smoothing=)
    §6.1  average the last 5 checkpoints                                    -> checkpoints.average_into_model

Accelerate (considered against transformers' Trainer, which ``finetuning`` sets up) gives device
placement, DDP across processes and nodes, bf16/fp16 autocast, trackers, and ``save_state`` /
``load_state`` of model, optimizer, scheduler and every RNG. This module adds what it does not
have: token-bucketed batches sharded per process, loss normalised over the whole global batch,
atomic rotating checkpoints, exact resumption in the middle of an epoch, and checkpoint averaging.
The settings of a run are a :class:`~vanilla_transformer.training_config.TrainConfig`.
"""

import dataclasses
import json
import math
import os
import shutil
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.utils import set_seed
from tqdm.auto import tqdm

from .cards import write_model_card
from .checkpoints import (
    STATE_FILE,
    average_into_model,
    incomplete_checkpoints,
    list_checkpoints,
    save_checkpoint,
    save_folder_atomically,
    write_json_atomically,
)
from .data import TokenBucketBatchSampler, collate_pairs, load_parallel_corpus, local_corpus_readers
from .distributed import agree, any_process, on_main_process, sum_over_processes, test_delay
from .evaluation import evaluate_model, loss_sums, perplexity, score, translate
from .loading import load_model, load_tokenizer, new_model
from .modeling_vanilla_transformer import VanillaTransformerForConditionalGeneration
from .prepared import (
    PreparedSplit,
    file_digest,
    is_prepared,
    load_prepared_split,
    mark_absent,
    prepare_split,
    prepared_split_folder,
)
from .schedule import make_optimizer_and_schedule
from .tokenization import check_tokenizer_matches_model, match_model_max_length, save_tokenizer, train_joint_bpe
from .training_config import TrainConfig
from .visualization import draw_attention_maps, require_matplotlib

__all__ = ["TrainConfig", "cpu_has_bf16_units", "push_folder_to_hub", "resolve_mixed_precision", "train"]


# --------------------------------------------------------------------------------------------
# Data
# --------------------------------------------------------------------------------------------
def _prepare_data(config: TrainConfig, accelerator, output_dir: Path):
    """The tokenizer (loaded, or the joint BPE trained) and each split tokenised once into a prepared corpus
    (:mod:`~vanilla_transformer.prepared`), pairs that are empty or too long dropped. Only the main process reads
    the corpus, streaming it from its files, and writes, and only what is not ready yet; then every process
    memory-maps the same files."""
    test_delay("data", accelerator.process_index)
    tokenizer_dir = Path(config.tokenizer_name) if config.tokenizer_name is not None else output_dir / "tokenizer"
    needed = [name for name in dict.fromkeys((config.train_split, config.validation_split, config.test_split)) if name]
    test_delay("tokenizer", accelerator.process_index)
    progress = not config.disable_tqdm

    def prepare() -> dict:
        corpus = _corpus_readers(config)
        for split in (config.train_split, config.validation_split):
            if split not in corpus:
                raise ValueError(
                    f"The corpus {config.dataset_name!r} has splits {sorted(corpus)}, not {split!r}. Set "
                    f"train_split / validation_split to existing ones, or give the pairs as files: "
                    f"--train_file, --validation_file, --test_file."
                )
        if config.tokenizer_name is not None:
            load_tokenizer(tokenizer_dir)  # a clear error now for a folder without tokenizer.json
        elif not (tokenizer_dir / "tokenizer.json").is_file():  # else a resume: the run's own tokenizer
            train_pairs = corpus[config.train_split]
            total = sum(1 for _ in train_pairs()) if config.bpe_train_pairs else None
            if total is not None and total > config.bpe_train_pairs:
                accelerator.print(
                    f"the BPE learns from {config.bpe_train_pairs:,} of the {total:,} training pairs, spread evenly "
                    f"(--bpe_train_pairs; 0: all)"
                )
            bpe = train_joint_bpe(
                _texts(train_pairs, config.bpe_train_pairs, total),
                vocab_size=config.vocab_size,
                show_progress=progress,
            )
            save_folder_atomically(tokenizer_dir, lambda folder: save_tokenizer(bpe, folder))
        tokenizer = load_tokenizer(tokenizer_dir)
        folders = {}
        for split in needed:
            identity = corpus[split].identity if split in corpus else f"{config.dataset_name}:{split}:absent"
            folder = prepared_split_folder(identity, tokenizer_dir / "tokenizer.json", config.max_length)
            if is_prepared(folder) is None:
                if split in corpus:
                    prepare_split(corpus[split](), tokenizer, config.max_length, folder, progress=progress)
                else:
                    mark_absent(folder)
            if is_prepared(folder):
                folders[split] = str(folder)
        return {"folders": folders}

    plan = agree(accelerator, on_main_process(accelerator, "preparing the corpus", prepare))
    tokenizer = load_tokenizer(tokenizer_dir)
    splits = {name: load_prepared_split(Path(folder)) for name, folder in plan["folders"].items()}
    return tokenizer, splits, {name: split.dropped for name, split in splits.items()}


class _Split:
    """A split's pairs, read anew on each call (see :class:`~vanilla_transformer.data.PairReader`), and its
    ``identity``: what a prepared copy of it is keyed by (its files' bytes, or a Hub dataset's fingerprint)."""

    def __init__(self, read, identity: str):
        self.read, self.identity = read, identity

    def __call__(self):
        return self.read()


def _corpus_readers(config: TrainConfig) -> dict[str, _Split]:
    """The splits of ``dataset_name``, or of ``train_file`` alone; ``validation_file`` and ``test_file`` replace
    (or add) the validation and test splits. Local files are streamed (only file names are checked here); a Hub
    dataset is loaded through ``datasets``, whose Arrow files are memory-mapped."""
    langs = (config.source_lang, config.target_lang)

    def splits_of(source: str, split: str | None = None) -> dict[str, _Split]:
        readers = local_corpus_readers(source, *langs, split=split)
        if readers is not None:
            return {
                name: _Split(reader, json.dumps([file_digest(reader.files), name, *langs]))
                for name, reader in readers.items()
            }
        loaded = load_parallel_corpus(source, *langs, split=split, hub_config=config.dataset_config_name)
        loaded = {split: loaded} if split is not None else dict(loaded)
        return {
            name: _Split(lambda ds=ds: _dataset_pairs(ds), json.dumps([ds._fingerprint, *langs]))
            for name, ds in loaded.items()
        }

    if config.train_file is not None:
        corpus = splits_of(config.train_file, config.train_split)
    else:
        corpus = splits_of(config.dataset_name)
    for split, path in ((config.validation_split, config.validation_file), (config.test_split, config.test_file)):
        if path is not None and split is not None:
            corpus.update(splits_of(path, split))
    return corpus


def _dataset_pairs(dataset, batch_size: int = 10_000):
    for batch in dataset.iter(batch_size=batch_size):
        yield from zip(batch["source"], batch["target"], strict=True)


def _texts(split: _Split, limit: int = 0, total: int | None = None):
    """Both sides of the pairs the BPE learns from, as its trainer reads them: every pair, or, of a corpus of
    ``total`` pairs above ``limit`` (> 0), ``limit`` pairs spread evenly over it (pair ``i`` when
    ``i * limit mod total < limit``: exactly ``limit`` of them, none drawn at random). SentencePiece bounds its
    sample the same way (``input_sentence_size``); the ``tokenizers`` trainer has no such option. On the 4.5M-pair
    benchmark corpus, preparing took 379 s instead of 405 s with a sample of a million (docs/performance-log.md)."""
    sample = limit > 0 and total is not None and total > limit
    for i, (source, target) in enumerate(split()):
        if not sample or (i * limit) % total < limit:
            yield source
            yield target


def _target_tokens(split: PreparedSplit, indices: list[int]) -> int:
    return int(split.labels.lengths[indices].sum())


# --------------------------------------------------------------------------------------------
# The loop
# --------------------------------------------------------------------------------------------
def _build_model(config: TrainConfig, tokenizer) -> VanillaTransformerForConditionalGeneration:
    if config.model_name_or_path is None:
        return new_model(config.preset, tokenizer, **config.config_overrides)
    model = load_model(config.model_name_or_path)
    check_tokenizer_matches_model(tokenizer, model.config)
    return model


def _validation_loss(model, split: PreparedSplit, config: TrainConfig, accelerator, pad_token_id: int) -> dict:
    result = perplexity(
        model,
        split.input_ids,
        split.labels,
        pad_token_id=pad_token_id,
        max_tokens=config.max_tokens,
        label_smoothing=config.label_smoothing_factor,
        accelerator=accelerator,
    )
    return {"valid_loss": result["loss"], "valid_nll": result["nll"], "valid_ppl": result["ppl"]}


def _validation_bleu(model, tokenizer, split: PreparedSplit, config: TrainConfig, accelerator) -> dict:
    n = min(config.eval_bleu_sentences, len(split.sources))
    if n == 0 or not accelerator.is_main_process:
        return {}
    unwrapped = accelerator.unwrap_model(model)
    unwrapped.eval()
    hypotheses = translate(unwrapped, tokenizer, split.sources[:n], num_beams=config.generation_num_beams)
    unwrapped.train()
    result = score(hypotheses, split.targets[:n])
    return {"valid_bleu": result["bleu"], "valid_chrf": result["chrf"], "example": hypotheses[0]}


def _attention_pictures(model, tokenizer, split: PreparedSplit, config: TrainConfig, accelerator, folder: Path) -> None:
    """Main process, at an evaluation: the attention maps (last layer, every head) of validation pair
    ``config.attention_pictures``, its reference translation read by the decoder as in training, so
    that the pictures of successive evaluations are comparable."""
    i = config.attention_pictures
    draw_attention_maps(accelerator.unwrap_model(model), tokenizer, split.sources[i], folder, target=split.targets[i])


def _progress_bar(config: TrainConfig, step: int, start_time: float, show: bool) -> tqdm:
    """Steps out of ``max_steps``; with ``max_minutes``, seconds out of that budget, which is what stops
    such a run (its ``max_steps`` is only a ceiling), and the step in the description."""
    if config.max_minutes is None:
        return tqdm(total=config.max_steps, initial=step, desc="training", disable=not show)
    budget = config.max_minutes * 60
    return tqdm(
        total=budget,
        initial=min(time.monotonic() - start_time, budget),
        desc=f"training, step {step}",
        bar_format="{l_bar}{bar}| {n:.0f}/{total:.0f} s{postfix}",
        disable=not show,
    )


def _advance(bar: tqdm, config: TrainConfig, step: int, start_time: float) -> None:
    """Show that ``step`` is done: one step more, or the seconds spent so far and the step."""
    if config.max_minutes is None:
        bar.update(1)
    else:
        bar.set_description(f"training, step {step}", refresh=False)
        bar.update(min(time.monotonic() - start_time, bar.total) - bar.n)


def train(config: TrainConfig) -> dict:
    """Train, checkpoint, average the last checkpoints, save a Hub-ready folder; returns a summary.

    Layout of ``config.output_dir``: ``tokenizer/``, ``checkpoints/checkpoint-<step>/`` (accelerate
    state + ``trainer_state.json``), ``final/`` (model, tokenizer, generation config, model card),
    ``train_config.json``, ``results.json`` (the summary, whose ``history`` holds every logged record: the
    training loss of each ``logging_steps`` and the validation scores of each evaluation, as the log printed
    them); with ``attention_pictures``, ``pictures/step-<step>/``.
    """
    start_time = time.monotonic()
    if config.push_to_hub:
        _check_hub_upload_possible(config.hub_model_id)  # before training, not after hours of it
    on_cpu = config.use_cpu or not _has_accelerator()
    config = dataclasses.replace(config, mixed_precision=resolve_mixed_precision(config.mixed_precision, on_cpu))
    output_dir = Path(config.output_dir)
    checkpoint_dir = output_dir / "checkpoints"
    accelerator = Accelerator(
        # without a GPU (or other accelerator), cpu=True lets accelerate see torchrun's processes (gloo)
        cpu=on_cpu,
        mixed_precision=config.mixed_precision,
        log_with=config.report_to,
        project_dir=str(output_dir),
        step_scheduler_with_optimizer=False,  # one scheduler step per optimizer step, whatever the process count
    )
    _refuse_sharding(accelerator)
    log = accelerator.print
    log(f"{accelerator.num_processes} process(es) on {accelerator.device}, mixed precision {config.mixed_precision}")
    if (warning := emulated_bf16_warning(config.mixed_precision, accelerator.device)) is not None:
        log(warning)
    if accelerator.is_main_process:
        output_dir.mkdir(parents=True, exist_ok=True)
    test_delay("checkpoints", accelerator.process_index)
    # What the main process finds on disk, for all: a process that looked itself could see another's new files.
    existing = [
        checkpoint_dir / name for name in agree(accelerator, [p.name for p in list_checkpoints(checkpoint_dir)])
    ]
    if existing and not config.resume_from_checkpoint:
        raise ValueError(
            f"{checkpoint_dir} already holds checkpoints ({existing[-1].name}); pass --resume_from_checkpoint to "
            f"continue that run or choose another --output_dir."
        )
    resume_from = _checkpoint_to_resume(config.resume_from_checkpoint, existing, checkpoint_dir)
    set_seed(config.seed)

    tokenizer, splits, dropped = _prepare_data(config, accelerator, output_dir)
    log(f"data ready in {time.monotonic() - start_time:.0f} s")
    train_split, valid_split = splits[config.train_split], splits[config.validation_split]
    if config.attention_pictures is not None:  # fail now, not at the first evaluation
        require_matplotlib()
        if config.attention_pictures >= len(valid_split.sources):
            raise ValueError(
                f"attention_pictures={config.attention_pictures}: the validation split has "
                f"{len(valid_split.sources)} pairs (valid: 0..{len(valid_split.sources) - 1})."
            )
    for name, n in dropped.items():
        log(
            f"{name}: {len(splits[name].input_ids):,} pairs kept, {n:,} dropped (empty or > {config.max_length} tokens)"
        )
    if not len(train_split.input_ids):
        raise ValueError("No training pairs left after filtering; check the corpus and max_length.")

    model = _build_model(config, tokenizer)
    attention = config.attn_implementation
    if attention == "auto":
        attention = "eager" if accelerator.device.type == "cpu" and config.mixed_precision == "bf16" else "sdpa"
    model.set_attn_implementation(attention)  # for this run only: not written into the saved config
    log(f"attention: {attention}")
    optimizer, scheduler = make_optimizer_and_schedule(
        model,
        model.config.d_model,
        config.warmup_steps,
        config.lr_factor,
        (config.adam_beta1, config.adam_beta2),
        config.adam_epsilon,
    )
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    pad_id = tokenizer.pad_token_id

    # Batches: bucketed by length, shuffled per epoch, sharded over processes. Not passed to
    # accelerator.prepare: the sampler shards itself, and its order depends only on (seed, epoch).
    sampler = TokenBucketBatchSampler(
        train_split.input_ids.lengths,
        tgt_lengths=train_split.labels.lengths,
        max_tokens=config.max_tokens,
        seed=config.seed,
        num_replicas=accelerator.num_processes,
        rank=accelerator.process_index,
        drop_last=True,
    )
    if len(sampler) < config.gradient_accumulation_steps:
        raise ValueError(
            f"Only {len(sampler)} batches per process per epoch, fewer than gradient_accumulation_steps="
            f"{config.gradient_accumulation_steps}; lower max_tokens or gradient_accumulation_steps."
        )
    steps_per_epoch = len(sampler) // config.gradient_accumulation_steps

    state = {
        "step": 0,
        "epoch": 0,
        "step_in_epoch": 0,
        "target_tokens": 0,
        "loop_seconds": 0.0,
        "elapsed_seconds": 0.0,
        "history": [],
    }
    if config.resume_from_checkpoint:

        def remove_incomplete() -> None:
            for broken in incomplete_checkpoints(checkpoint_dir):
                what = "a deletion" if broken.name.startswith(".tmp-deleting-") else "a save"
                log(f"ignoring incomplete checkpoint {broken.name} ({what} was interrupted); deleting it")
                shutil.rmtree(broken, ignore_errors=True)

        on_main_process(accelerator, "removing incomplete checkpoints", remove_incomplete)
        if resume_from is not None:
            test_delay("resume", accelerator.process_index)
            _check_resume_compatible(resume_from, accelerator.unwrap_model(model))
            accelerator.load_state(str(resume_from))
            state = {"elapsed_seconds": 0.0, **json.loads((resume_from / STATE_FILE).read_text())}
            log(
                f"resumed from {resume_from.name} (step {state['step']}, epoch {state['epoch']}, "
                f"{state['elapsed_seconds'] / 60:.1f} min of the time budget spent)"
            )
        else:
            log("--resume_from_checkpoint: no checkpoint found, starting from scratch")
    if accelerator.is_main_process:
        write_json_atomically(output_dir / "train_config.json", dataclasses.asdict(config))
    if config.report_to:
        accelerator.init_trackers(
            "vanilla_transformer", config={k: str(v) for k, v in dataclasses.asdict(config).items()}
        )

    model.train()
    log(
        f"training from step {state['step']} to step {config.max_steps}"
        + (f" or {config.max_minutes:g} minutes" if config.max_minutes else "")
    )
    # The time budget counts every run of this training: a resumed run goes on from where its checkpoint stopped.
    budget_start = start_time - state["elapsed_seconds"]
    bar = _progress_bar(
        config, state["step"], budget_start, show=not config.disable_tqdm and accelerator.is_local_main_process
    )
    deadline = budget_start + config.max_minutes * 60 if config.max_minutes else None
    # Sums since the last record, kept on the device: a step reads nothing back (it would wait for the device);
    # they are read at logging steps and before each checkpoint.
    window = torch.zeros(3, dtype=torch.float64, device=accelerator.device)  # smoothed-loss sum, NLL sum, tokens
    pending_tokens = torch.zeros((), dtype=torch.float64, device=accelerator.device)  # global tokens, not yet in state
    unchecked_from = state["step"] + 1  # the first step whose loss has not been checked yet
    epoch_batches, batches_epoch = [], None
    stop_reason = "max_steps" if state["step"] >= config.max_steps else None
    loop_start = time.monotonic() - state["loop_seconds"]
    loss_workspace: dict = {}  # the loss keeps its logits here from forward to backward, in memory reused each step
    while stop_reason is None:
        test_delay("step", accelerator.process_index)
        if batches_epoch != state["epoch"]:  # this process's batches of the epoch, in the epoch's order
            sampler.set_epoch(state["epoch"])
            epoch_batches, batches_epoch = list(sampler), state["epoch"]
        k, accumulation = state["step_in_epoch"], config.gradient_accumulation_steps
        micro_indices = epoch_batches[k * accumulation : (k + 1) * accumulation]
        micro = [collate_pairs(train_split.input_ids, train_split.labels, indices, pad_id) for indices in micro_indices]
        # Normalise by the target tokens of the whole global batch (all micro-batches, all processes), so
        # the update does not depend on how the batch is split; DDP averages over processes, hence the
        # factor num_processes. The count stays on the device.
        local = sum(_target_tokens(train_split, indices) for indices in micro_indices)
        global_tokens = sum_over_processes(
            accelerator, torch.full((), float(local), dtype=torch.float64, device=accelerator.device)
        )
        for i, batch in enumerate(micro):
            # non_blocking: a copy to a GPU that does not wait for the GPU's queued work (a no-op on the CPU)
            batch = {key: value.to(accelerator.device, non_blocking=True) for key, value in batch.items()}
            with accelerator.no_sync(model) if i < len(micro) - 1 else nullcontext():
                with accelerator.autocast():
                    smoothed, nll = loss_sums(model, batch, config.label_smoothing_factor, loss_workspace)
                accelerator.backward(smoothed * accelerator.num_processes / global_tokens)
            window[:2] += torch.stack([smoothed.detach(), nll.detach()]).double()
        window[2] += local
        pending_tokens += global_tokens
        if config.max_grad_norm is not None:
            accelerator.clip_grad_norm_(model.parameters(), config.max_grad_norm)
        optimizer.step()
        if config.mixed_precision == "fp16" and accelerator.optimizer_step_was_skipped:  # (reads the loss scale)
            log(f"step {state['step'] + 1}: fp16 loss scaling skipped this update (non-finite gradients)")
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        state["step"] += 1
        state["step_in_epoch"] += 1
        state["loop_seconds"] = time.monotonic() - loop_start
        if state["step_in_epoch"] == steps_per_epoch:
            state["epoch"], state["step_in_epoch"] = state["epoch"] + 1, 0
        state["elapsed_seconds"] = time.monotonic() - budget_start
        _advance(bar, config, state["step"], budget_start)

        if state["step"] >= config.max_steps:
            stop_reason = "max_steps"
        elif deadline is not None and _past_deadline(deadline, accelerator):
            stop_reason = "max_minutes"
        logging_step = state["step"] % config.logging_steps == 0 or bool(stop_reason)
        saving_step = state["step"] % config.save_steps == 0 or bool(stop_reason)
        record = None
        if logging_step or saving_step:  # the only reads from the device between evaluations
            sums = window.tolist()
            state["target_tokens"] += int(pending_tokens.item())
            pending_tokens.zero_()
            # All processes stop together, and before a checkpoint: none holds the updates of a non-finite loss.
            if any_process(accelerator, not math.isfinite(sums[0])):
                newest = (list_checkpoints(checkpoint_dir) or [None])[-1]
                kept = (
                    f"the newest checkpoint, {newest}, is from before it" if newest else "no checkpoint was written yet"
                )
                steps = (
                    f"step {state['step']}"
                    if unchecked_from == state["step"]
                    else f"steps {unchecked_from}-{state['step']}"
                )
                raise FloatingPointError(
                    f"Non-finite training loss in {steps}, found before any checkpoint of it was written; {kept}. "
                    f"Lower lr_factor, raise warmup_steps or set max_grad_norm, "
                    f"then rerun with --resume_from_checkpoint; with fp16, use bf16."
                )
            unchecked_from = state["step"] + 1
        if logging_step:
            tokens = max(sums[2], 1.0)
            record = {
                "step": state["step"],
                "train_loss": sums[0] / tokens,
                "train_nll": sums[1] / tokens,
                "lr": scheduler.get_last_lr()[0],
                "target_tokens_per_s": state["target_tokens"] / max(state["loop_seconds"], 1e-9),
            }
            window.zero_()
            bar.set_postfix(loss=f"{record['train_loss']:.3f}", lr=f"{record['lr']:.2e}")
        if state["step"] % config.eval_steps == 0 or stop_reason:
            test_delay("evaluate", accelerator.process_index)
            record = {
                **(record or {"step": state["step"]}),
                **_validation_loss(model, valid_split, config, accelerator, pad_id),
            }
            record.update(_validation_bleu(model, tokenizer, valid_split, config, accelerator))
            if config.attention_pictures is not None and accelerator.is_main_process:
                _attention_pictures(
                    model,
                    tokenizer,
                    valid_split,
                    config,
                    accelerator,
                    output_dir / "pictures" / f"step-{state['step']}",
                )
            log(" | ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in record.items()))
        if record is not None:
            state["history"].append(record)
            if config.report_to:
                accelerator.log({k: v for k, v in record.items() if isinstance(v, (int, float))}, step=state["step"])
        if state["step"] % config.save_steps == 0 or stop_reason:
            test_delay("save", accelerator.process_index)
            save_checkpoint(accelerator, checkpoint_dir, state, config.save_total_limit)
    bar.close()
    train_seconds = time.monotonic() - start_time
    test_delay("finish", accelerator.process_index)
    summary = _finish(config, accelerator, model, tokenizer, splits, state, checkpoint_dir, output_dir)
    summary.update(stop_reason=stop_reason, train_seconds=train_seconds, dropped=dropped)
    if accelerator.is_main_process:
        write_json_atomically(output_dir / "results.json", summary)
    accelerator.end_training()
    if accelerator.is_main_process and config.push_to_hub:
        log(f"uploading {summary['final_dir']} to the Hub repository {config.hub_model_id}")
        try:
            summary["hub_commit"] = push_folder_to_hub(
                summary["final_dir"], config.hub_model_id, private=config.hub_private_repo
            )
        except Exception as error:
            raise RuntimeError(
                f"Training finished and {summary['final_dir']} is complete, but the upload to {config.hub_model_id} "
                f"failed ({type(error).__name__}: {error}). "
                f"Retry with `hf upload {config.hub_model_id} {summary['final_dir']}`."
            ) from error
        write_json_atomically(output_dir / "results.json", summary)
    return summary


# --------------------------------------------------------------------------------------------
# Sharing on the Hub
# --------------------------------------------------------------------------------------------
def _check_hub_upload_possible(repo_id: str) -> None:
    """Fail before training when an upload at the end cannot work (offline mode, no token)."""
    import huggingface_hub
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        raise ValueError(
            f"push_to_hub={repo_id!r} needs the network, but HF_HUB_OFFLINE is set; unset it or drop the option."
        )
    if huggingface_hub.get_token() is None:
        raise ValueError(
            f"push_to_hub={repo_id!r} needs a Hugging Face token with write access: "
            f"run `hf auth login` or set HF_TOKEN."
        )


def push_folder_to_hub(
    folder: str | os.PathLike, repo_id: str, commit_message: str | None = None, private: bool | None = None
) -> str:
    """Upload every file of ``folder`` to the Hub model repository ``repo_id`` in one commit; return its URL.

    The repository is created if it does not exist: private with ``private=True``, else public unless your
    account's default is private.
    The training command uploads its ``final/`` folder: weights, ``config.json`` (with ``auto_map`` and
    ``custom_pipelines``), ``generation_config.json``, the tokenizer, the model card ``README.md`` and the
    three Hub-portable files (configuration, modeling, pipeline), so that ``AutoModelForSeq2SeqLM``,
    ``AutoTokenizer`` and ``pipeline("vanilla-translation", ...)`` load it with ``trust_remote_code=True``.
    This is the same set of files that ``model.push_to_hub`` + ``tokenizer.push_to_hub`` would send, in one
    commit and with our model card (``model.push_to_hub`` would write a generic ``README.md`` over it).
    Files already in the repository and absent from ``folder`` are left there.
    """
    from huggingface_hub import HfApi

    folder = Path(folder)
    if not (folder / "config.json").is_file():
        raise ValueError(f"{folder} is not a saved model folder (no config.json); nothing was uploaded.")
    api = HfApi()
    repo_id = api.create_repo(repo_id, repo_type="model", exist_ok=True, private=private).repo_id
    commit = api.upload_folder(
        repo_id=repo_id,
        repo_type="model",
        folder_path=str(folder),
        commit_message=commit_message or "Upload vanilla-transformer translation model",
    )
    return str(commit.commit_url)


def cpu_has_bf16_units() -> bool:
    """Whether this CPU computes in bf16 natively (AMX or AVX512-BF16), from torch.cpu's (private) feature
    probes; without them torch emulates bf16, and a bf16 step is many times slower than fp32."""
    units = ("_is_amx_tile_supported", "_is_avx512_bf16_supported")
    return any(getattr(torch.cpu, probe, lambda: False)() for probe in units)


def resolve_mixed_precision(mixed_precision: str, cpu: bool) -> str:
    """``auto`` -> ``bf16`` where the hardware has bf16 units: CUDA GPUs that support bf16, and CPUs with AMX
    or AVX512-BF16 (measured against fp32 by benchmarks/bf16_curve.py); ``no`` elsewhere. Other values are
    returned as given."""
    if mixed_precision != "auto":
        return mixed_precision
    if not cpu:
        return "bf16" if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else "no"
    return "bf16" if cpu_has_bf16_units() else "no"


def emulated_bf16_warning(mixed_precision: str, device: torch.device) -> str | None:
    """The warning for bf16 asked for on a CPU that has no bf16 units, or None."""
    if mixed_precision != "bf16" or device.type != "cpu" or cpu_has_bf16_units():
        return None
    return (
        f"warning: mixed precision bf16 on a CPU without bf16 units ({torch.backends.cpu.get_cpu_capability()}, no AMX "
        f"or AVX512-BF16): torch emulates bf16, and a training step of benchmarks/multi30k.py's model took about 20 "
        f"times as long as in fp32 on such a CPU (docs/benchmarks.md). Use --mixed_precision no, or auto, which "
        f"picks bf16 only where the CPU has the units."
    )


def _refuse_sharding(accelerator) -> None:
    """FSDP is refused by name rather than run half-way (docs/training.md says why).

    On CPUs Accelerate (1.16) turns FSDP on only for accelerator devices and otherwise runs plain DDP, without a
    word; on GPUs the checkpoints this loop saves, averages and resumes are ``save_state``'s unsharded files.
    """
    asked = os.environ.get("ACCELERATE_USE_FSDP", "false").lower() in ("1", "true", "yes")
    if asked or accelerator.distributed_type.value == "FSDP":
        where = (
            "Accelerate runs FSDP only on GPUs and other accelerators; "
            "on CPU processes it would silently fall back to DDP"
            if accelerator.device.type == "cpu"
            else "this training loop does not save, average or resume FSDP's sharded checkpoints yet"
        )
        raise ValueError(
            f"The launcher asks for FSDP, but {where}. Launch with a data-parallel config instead "
            f"(configs/accelerate/8gpu.yaml, or torchrun on CPUs). Sharding buys little at this model's size: the big "
            f"preset's 213M parameters, their gradients and Adam's moments take about 3.4 GB, which DDP keeps whole on "
            f"each GPU."
        )


def _has_accelerator() -> bool:
    backend = getattr(torch, "accelerator", None)  # torch >= 2.6
    return backend.is_available() if backend is not None else torch.cuda.is_available()


def _past_deadline(deadline: float, accelerator) -> bool:
    """Whether the wall-clock budget is spent, decided together: processes whose clocks disagree by a step
    would otherwise stop at different steps, and the one still training would wait forever for the others.
    (The processes agree on the CPU, without waiting for the device: see ``distributed.any_process``.)"""
    return any_process(accelerator, time.monotonic() > deadline)


def _checkpoint_to_resume(resume: str | None, existing: list[Path], checkpoint_dir: Path) -> Path | None:
    """The checkpoint that ``resume_from_checkpoint`` names: the newest of the run for ``"latest"`` (``None`` when the
    run has none yet), or the folder given, which must be one of the run's and its newest (resuming from an older
    one would overwrite the newer ones)."""
    if not resume:
        return None
    if resume == "latest":
        return existing[-1] if existing else None
    given = Path(resume).expanduser()
    mine = {path.resolve(): path for path in existing}
    if given.resolve() not in mine:
        where = f"its checkpoints are {', '.join(p.name for p in existing)}" if existing else "it has none"
        raise ValueError(
            f"--resume_from_checkpoint {resume}: not a complete checkpoint of this run's folder {checkpoint_dir} "
            f"({where}). Give one of them, or 'latest', or set --output_dir to the run that holds {given.name}."
        )
    if given.resolve() != existing[-1].resolve():
        raise ValueError(
            f"--resume_from_checkpoint {resume}: the run has newer checkpoints ({existing[-1].name}), which going on "
            f"from {given.name} would overwrite. Resume from {existing[-1]} (or 'latest'), "
            f"or move the newer ones away first."
        )
    return existing[-1]


def _check_resume_compatible(checkpoint: Path, model) -> None:
    """Refuse to resume into a model of another size (clear message instead of a shape error)."""
    from safetensors import safe_open

    files = sorted(checkpoint.glob("model*.safetensors"))
    if not files:
        raise ValueError(f"{checkpoint} has no model*.safetensors; it is not a complete training checkpoint.")
    expected = {name: tuple(p.shape) for name, p in model.state_dict().items()}
    with safe_open(str(files[0]), framework="pt") as f:
        for name in f.keys():
            shape = tuple(f.get_slice(name).get_shape())
            if name in expected and expected[name] != shape:
                raise ValueError(
                    f"Cannot resume from {checkpoint}: {name} has shape {shape} there but {expected[name]} in the "
                    f"model being trained. Resume with the same model settings, or use a new --output_dir."
                )


def _finish(config, accelerator, model, tokenizer, splits, state, checkpoint_dir, output_dir) -> dict:
    """Average the last checkpoints (§6.1), save the Hub-ready folder, score the test split."""
    summary: dict[str, Any] = {
        key: state[key] for key in ("step", "epoch", "step_in_epoch", "target_tokens", "loop_seconds")
    }
    summary["processes"] = accelerator.num_processes
    unwrapped = accelerator.unwrap_model(model)

    def average_save_and_score() -> None:
        checkpoints = list_checkpoints(checkpoint_dir)[-config.average_last :]
        if len(checkpoints) > 1:
            average_into_model(unwrapped, checkpoints)
        summary["averaged_checkpoints"] = [p.name for p in checkpoints]
        unwrapped.eval()
        final_dir = output_dir / "final"

        def write_final(folder: Path) -> None:
            unwrapped.save_pretrained(folder)
            match_model_max_length(tokenizer, unwrapped.config)
            save_tokenizer(tokenizer, folder)

        save_folder_atomically(final_dir, write_final)  # a rerun with --resume_from_checkpoint rewrites it
        last = next((r for r in reversed(state["history"]) if "valid_loss" in r), {})
        summary.update({k: v for k, v in last.items() if k.startswith("valid_")})
        if config.test_split and config.test_split in splits:
            test = splits[config.test_split]
            result = evaluate_model(
                unwrapped,
                tokenizer,
                test.sources,
                test.targets,
                hypotheses_path=output_dir / f"{config.test_split}.hyp.{config.target_lang}",
                progress=not config.disable_tqdm,
            )
            summary["test"] = {
                k: result[k] for k in ("bleu", "bleu_signature", "chrf", "chrf_signature", "n", "seconds")
            }
        write_model_card(final_dir, config=config, model_config=unwrapped.config, summary=summary)
        summary["final_dir"] = str(final_dir)
        summary["history"] = state["history"]  # the log's records, so that a run's curve outlives its log

    # the other processes wait, and stop with a message if the main process fails
    on_main_process(accelerator, "averaging checkpoints and saving the final model", average_save_and_score)
    return summary
