"""transformers' Seq2SeqTrainer set up as the paper trains (vanilla_transformer/finetuning.py and
examples/finetune_seq2seq_trainer.py): the learning rate is the paper's at every step, a short run
learns and reports sacreBLEU/chrF, gradient accumulation equals one big batch, and the example script
writes a loadable model."""

import importlib.util
import itertools
import json
import math
import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import tiny_model
from transformers import AutoTokenizer, DataCollatorForSeq2Seq, EvalPrediction, Seq2SeqTrainer, TrainerCallback

from vanilla_transformer import VanillaTransformerForConditionalGeneration
from vanilla_transformer.data import collate_batch, load_parallel_corpus
from vanilla_transformer.evaluation import translate
from vanilla_transformer.finetuning import (
    TranslationSeq2SeqTrainer,
    build_model_and_tokenizer,
    build_trainer,
    make_training_arguments,
    prepare_datasets,
    train_with_seq2seq_trainer,
)
from vanilla_transformer.schedule import noam_learning_rate, peak_learning_rate
from vanilla_transformer.tokenization import train_joint_bpe

ROOT = Path(__file__).resolve().parents[1]
# One thread: tiny models gain nothing from a second one, and lose 10-100x when the other core is busy.
OFFLINE_ONE_THREAD = {
    "HF_HUB_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "OMP_NUM_THREADS": "1",
}


@pytest.fixture(autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def pairs(corpus):
    return load_parallel_corpus(corpus, "en", "de")


@pytest.fixture(scope="module")
def tokenizer(pairs):
    train = pairs["train"].select(range(300))
    return train_joint_bpe(itertools.chain(train["source"], train["target"]), vocab_size=400)


def test_trainer_learning_rate_is_the_papers_formula_at_every_step(tokenizer, tmp_path):
    model = tiny_model(vocab_size=len(tokenizer))
    d_model, warmup, steps = model.config.d_model, 4000, 20_000
    args = make_training_arguments(tmp_path, d_model, warmup_steps=warmup, max_steps=steps)
    assert args.learning_rate == peak_learning_rate(d_model, warmup)
    trainer = build_trainer(model, tokenizer, args)
    trainer.create_optimizer_and_scheduler(num_training_steps=steps)

    for group in trainer.optimizer.param_groups:  # §5.3; AdamW without weight decay is Adam
        assert (group["betas"], group["eps"], group["weight_decay"]) == ((0.9, 0.98), 1e-9, 0.0)
    rates = []
    with warnings.catch_warnings():  # "scheduler.step() before optimizer.step()": we only read the schedule
        warnings.simplefilter("ignore")
        for _ in range(steps + 1):
            rates.append(trainer.lr_scheduler.get_last_lr())  # one entry per parameter group
            trainer.lr_scheduler.step()
    rates = np.array(rates)
    expected = np.array([noam_learning_rate(k, d_model, warmup) for k in range(steps + 1)])
    assert rates.shape[1] >= 1
    for group in rates.T:
        np.testing.assert_allclose(group, expected, rtol=1e-10, atol=0)
    assert rates[:, 0].argmax() == warmup and rates[0, 0] == 0.0


def test_a_fresh_preset_gets_a_joint_bpe_of_its_training_pairs(pairs):
    train = pairs["train"].select(range(300))
    model, tokenizer = build_model_and_tokenizer(
        train,
        "big",
        vocab_size=400,
        attn_implementation="eager",
        d_model=32,
        encoder_layers=1,
        decoder_layers=1,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
    )
    assert model.config.vocab_size == len(tokenizer) <= 400 and model.config._attn_implementation == "eager"
    assert model.config.encoder_attention_heads == 16  # the big preset's, not overridden
    assert tokenizer.tokenize(train["target"][0])  # learned on both languages
    with pytest.raises(ValueError, match="preset must be one of 'base', 'big'"):
        build_model_and_tokenizer(train, "huge", tokenizer=tokenizer)


def test_finetuning_a_saved_model_lowers_eval_loss_and_reports_bleu_and_chrf(corpus, tokenizer, tmp_path):
    start = tmp_path / "start"
    tiny_model(vocab_size=len(tokenizer)).save_pretrained(start)
    tokenizer.save_pretrained(start)

    result = train_with_seq2seq_trainer(
        corpus,
        tmp_path / "out",
        model=start,
        max_train_pairs=300,
        max_eval_pairs=8,
        eval_before=True,
        max_steps=40,
        warmup_steps=10,
        lr_factor=0.5,
        per_device_train_batch_size=16,
        per_device_eval_batch_size=4,
        logging_steps=1,
        disable_tqdm=True,
    )
    before, after = result.eval_before, result.eval_after
    assert after["eval_loss"] < before["eval_loss"] - 1.0, (before["eval_loss"], after["eval_loss"])
    for metrics in (before, after):
        assert math.isfinite(metrics["eval_bleu"]) and 0.0 <= metrics["eval_bleu"] <= 100.0
        assert math.isfinite(metrics["eval_chrf"]) and 0.0 <= metrics["eval_chrf"] <= 100.0
        assert metrics["eval_bleu_signature"].startswith("nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp")
        assert metrics["eval_chrf_signature"].startswith("nrefs:1|case:mixed|eff:yes|nc:6|nw:0")

    # Learning rate actually used by update k is the paper's lrate(k - 1) (the scheduler counts from 0).
    logged = [(h["step"], h["learning_rate"]) for h in result.trainer.state.log_history if "learning_rate" in h]
    assert [s for s, _ in logged] == list(range(1, 41))
    for step, lr in logged:
        assert lr == pytest.approx(noam_learning_rate(step - 1, 32, 10, factor=0.5), rel=1e-9, abs=1e-15)

    # Evaluation left the paper's per-sentence length limit in place (Seq2SeqTrainer would set max_length=20).
    assert result.model.generation_config.max_length is None
    saved = json.loads((tmp_path / "out" / "generation_config.json").read_text())
    assert "max_length" not in saved and saved["source_length_offset"] == 50 and saved["num_beams"] == 4
    assert json.loads((tmp_path / "out" / "finetune_results.json").read_text())["eval_after"]["eval_bleu"] >= 0
    # The saved tokenizer_config.json holds the tokenizer's settings, not how the tokenizer was loaded.
    assert not {"is_local", "local_files_only"} & set(
        json.loads((tmp_path / "out" / "tokenizer_config.json").read_text())
    )

    # compute_metrics decodes and detokenises: the references scored against themselves give 100 / 100.
    _, eval_set, _ = prepare_datasets(None, load_parallel_corpus(corpus, "en", "de", split="validation"), tokenizer)
    labels = collate_batch(list(eval_set.select(range(8))), tokenizer.pad_token_id)["labels"].numpy()
    predictions = np.where(labels == -100, tokenizer.pad_token_id, labels)
    perfect = result.trainer.compute_metrics(EvalPrediction(predictions=predictions, label_ids=labels))
    assert perfect["bleu"] == pytest.approx(100.0) and perfect["chrf"] == pytest.approx(100.0)


def test_evaluate_without_generation_reports_the_loss(pairs, tokenizer, tmp_path):
    """transformers guesses label columns from forward's argument names ("label" in the name): the
    model's only such argument is `labels`, so evaluate() finds the labels and reports eval_loss, also
    with the Trainer's own guess (label_names=None)."""
    _, eval_set, _ = prepare_datasets(None, pairs["validation"].select(range(8)), tokenizer)
    model = tiny_model(vocab_size=len(tokenizer))
    args = make_training_arguments(tmp_path, model.config.d_model, predict_with_generate=False, disable_tqdm=True)
    metrics = build_trainer(model, tokenizer, args, eval_dataset=eval_set).evaluate()
    assert math.isfinite(metrics["eval_loss"]) and "eval_bleu" not in metrics
    guessed = make_training_arguments(
        tmp_path, model.config.d_model, predict_with_generate=False, disable_tqdm=True, label_names=None
    )
    trainer = build_trainer(model, tokenizer, guessed, eval_dataset=eval_set)
    assert trainer.label_names == ["labels"]
    assert trainer.evaluate()["eval_loss"] == pytest.approx(metrics["eval_loss"])


def _padded_batch(pairs, tokenizer, model, n: int = 4) -> dict:
    """``n`` training pairs of different target lengths, as DataCollatorForSeq2Seq pads them (labels -100)."""
    train, _, _ = prepare_datasets(pairs["train"].select(range(60)), None, tokenizer)
    by_length = {}
    for i, labels in enumerate(train["labels"]):
        by_length.setdefault(len(labels), i)
    chosen = sorted(by_length)[:: max(1, len(by_length) // n)][:n]
    batch = DataCollatorForSeq2Seq(tokenizer, model=model)([train[by_length[k]] for k in chosen])
    assert (batch["labels"] == -100).any() and len(set(chosen)) == n  # padding present, lengths differ
    return dict(batch)


@pytest.mark.parametrize("num_items_in_batch", [None, 97])
def test_fused_training_loss_equals_the_label_smoothers_value_and_gradients(
    pairs, tokenizer, tmp_path, num_items_in_batch
):
    """``TranslationSeq2SeqTrainer.compute_loss`` in training asks the model for the smoothed loss
    without logits; transformers' ``Seq2SeqTrainer`` applies ``LabelSmoother`` to the logits. Same
    loss, same gradients, on a padded batch, with and without ``num_items_in_batch`` (97: more tokens
    than the batch has, as under gradient accumulation)."""
    results = {}
    for name, trainer_class in (("label_smoother", Seq2SeqTrainer), ("fused", TranslationSeq2SeqTrainer)):
        model = tiny_model(vocab_size=len(tokenizer)).train()  # same seed: same weights; dropout 0
        args = make_training_arguments(tmp_path / name, model.config.d_model, disable_tqdm=True)
        trainer = trainer_class(model=model, args=args)
        assert trainer.label_smoother is not None and trainer.label_smoother.epsilon == 0.1
        batch = _padded_batch(pairs, tokenizer, model)
        loss, outputs = trainer.compute_loss(model, batch, return_outputs=True, num_items_in_batch=num_items_in_batch)
        loss.backward()
        grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
        results[name] = (loss.detach(), outputs, grads)

    (reference, plain_outputs, expected), (loss, outputs, grads) = results["label_smoother"], results["fused"]
    torch.testing.assert_close(loss, reference, rtol=1e-5, atol=1e-6)
    assert plain_outputs.logits is not None and outputs.logits is None  # the fused path made no logits
    torch.testing.assert_close(outputs.loss, loss)  # return_outputs: the model's outputs, its loss the loss
    assert grads.keys() == expected.keys() and len(grads) > 0
    for name in expected:
        torch.testing.assert_close(grads[name], expected[name], rtol=1e-4, atol=1e-6, msg=name)


def test_trainer_trains_through_the_fused_loss_and_evaluates_with_logits(pairs, tokenizer, tmp_path):
    """In training the model is asked for the label-smoothed loss (``smoothing`` = the Trainer's
    ``label_smoothing_factor``, ``skip_logits=True``, with the Trainer's ``num_items_in_batch``) and
    returns no logits; evaluation still computes logits and reports ``eval_loss``."""
    train, eval_set, _ = prepare_datasets(
        pairs["train"].select(range(40)), pairs["validation"].select(range(8)), tokenizer
    )
    model = tiny_model(vocab_size=len(tokenizer))
    calls = []
    model.register_forward_hook(
        lambda module, args, kwargs, output: calls.append((module.training, kwargs, output)), with_kwargs=True
    )
    args = make_training_arguments(
        tmp_path,
        model.config.d_model,
        warmup_steps=1,
        max_steps=2,
        per_device_train_batch_size=8,
        gradient_accumulation_steps=2,
        predict_with_generate=False,
        disable_tqdm=True,
    )
    trainer = build_trainer(model, tokenizer, args, train_dataset=train, eval_dataset=eval_set)
    trainer.train()
    training = [(kwargs, output) for is_training, kwargs, output in calls if is_training]
    assert len(training) == 4  # 2 updates x 2 micro-batches
    for kwargs, output in training:
        assert kwargs["skip_logits"] is True and kwargs["smoothing"] == 0.1 and "labels" in kwargs
        assert int(kwargs["num_items_in_batch"]) > int((kwargs["labels"] != -100).sum())  # the whole update's count
        assert output.logits is None and torch.isfinite(output.loss)
    assert all(math.isfinite(h["loss"]) for h in trainer.state.log_history if "loss" in h)

    calls.clear()
    metrics = trainer.evaluate()
    assert math.isfinite(metrics["eval_loss"]) and calls
    for is_training, kwargs, output in calls:
        assert not is_training and not kwargs.get("skip_logits") and output.logits is not None


class _GradientsBeforeUpdate(TrainerCallback):
    """Copies every gradient just before the optimizer step (after clipping, which is off here)."""

    def __init__(self):
        self.grads = []

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        self.grads.append({n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None})


def test_gradient_accumulation_gives_the_gradient_of_one_big_batch(pairs, tokenizer, tmp_path):
    """2 micro-batches x 2 pairs == 1 batch x 4 pairs, with label smoothing (the model's fused loss, and
    the Trainer's LabelSmoother on the logits: the same gradient).

    The 4 pairs have target lengths a < b < c < d with a + d != b + c, so every 2 + 2 split has
    micro-batches with different token counts: averaging per-micro-batch means (the Trainer's
    behaviour without `num_items_in_batch`) would give a different gradient, and does (checked below).
    """
    train, _, _ = prepare_datasets(pairs["train"].select(range(300)), None, tokenizer)
    by_length = {}
    for i, labels in enumerate(train["labels"]):
        by_length.setdefault(len(labels), i)
    lengths = sorted(by_length)
    chosen = [lengths[0], lengths[1], lengths[len(lengths) // 2], lengths[-1]]
    assert chosen[0] + chosen[3] != chosen[1] + chosen[2]
    data = train.select([by_length[n] for n in chosen])
    n_tokens = sum(chosen)

    def gradient(batch_size: int, accumulation: int, loss_kwargs: bool = True, fused: bool = True) -> dict:
        model = tiny_model(vocab_size=len(tokenizer)).train()  # same seed: same weights; dropout 0
        seen = []  # num_items_in_batch of each forward call
        model.register_forward_pre_hook(
            lambda _, args, kwargs: seen.append(kwargs.get("num_items_in_batch")), with_kwargs=True
        )
        capture = _GradientsBeforeUpdate()
        args = make_training_arguments(
            tmp_path / f"run{batch_size}x{accumulation}",
            model.config.d_model,
            warmup_steps=1,
            max_steps=1,
            per_device_train_batch_size=batch_size,
            gradient_accumulation_steps=accumulation,
            max_grad_norm=0.0,
            disable_tqdm=True,
        )
        trainer = build_trainer(model, tokenizer, args, train_dataset=data, callbacks=[capture])
        if not fused:  # transformers' own path: logits, then LabelSmoother
            trainer = Seq2SeqTrainer(
                model=model, args=args, data_collator=trainer.data_collator, train_dataset=data, callbacks=[capture]
            )
        assert trainer.model_accepts_loss_kwargs and trainer.label_smoother is not None
        trainer.model_accepts_loss_kwargs = loss_kwargs
        trainer.train()
        if loss_kwargs:  # the Trainer counted the target tokens of the whole update and passed the count
            assert [int(n) for n in seen] == [n_tokens] * accumulation
        (grads,) = capture.grads
        return grads

    # Reference: the token-mean label-smoothed loss of all 4 pairs in one forward pass.
    reference_model = tiny_model(vocab_size=len(tokenizer)).train()
    batch = collate_batch(list(data), tokenizer.pad_token_id)
    reference_model(**batch, smoothing=0.1).loss.backward()
    reference = {n: p.grad for n, p in reference_model.named_parameters() if p.grad is not None}

    one_batch, accumulated = gradient(4, 1), gradient(2, 2)
    smoother_accumulated = gradient(2, 2, fused=False)  # LabelSmoother on the logits, not the fused loss
    assert one_batch.keys() == accumulated.keys() == smoother_accumulated.keys() == reference.keys()
    for name in reference:
        torch.testing.assert_close(one_batch[name], reference[name], rtol=1e-4, atol=1e-6, msg=name)
        torch.testing.assert_close(accumulated[name], reference[name], rtol=1e-4, atol=1e-6, msg=name)
        torch.testing.assert_close(accumulated[name], smoother_accumulated[name], rtol=1e-4, atol=1e-6, msg=name)

    # The check can fail: per-micro-batch means averaged over the 2 steps give another gradient.
    naive = gradient(2, 2, loss_kwargs=False)
    difference = max((naive[n] - reference[n]).abs().max().item() for n in reference)
    scale = max(reference[n].abs().max().item() for n in reference)
    assert difference > 1e-3 * scale


def test_the_example_script_fine_tunes_a_preset_and_writes_a_loadable_model(corpus, tmp_path):
    out = tmp_path / "ft"
    command = [
        sys.executable,
        str(ROOT / "examples" / "finetune_seq2seq_trainer.py"),
        "--dataset_name",
        str(corpus),
        "--preset",
        "base",
        "--d_model",
        "32",
        "--layers",
        "1",
        "--heads",
        "2",
        "--d_ff",
        "64",
        "--vocab_size",
        "400",
        "--max_train_samples",
        "200",
        "--max_eval_samples",
        "4",
        "--max_steps",
        "3",
        "--warmup_steps",
        "2",
        "--per_device_train_batch_size",
        "8",
        "--logging_steps",
        "1",
        "--disable_tqdm",
        "--output_dir",
        str(out),
    ]
    env = {**os.environ, **OFFLINE_ONE_THREAD, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout[done.stdout.index('{\n  "output_dir"') :])  # after the Trainer's log lines
    assert summary["eval"]["eval_bleu_signature"].startswith("nrefs:1") and math.isfinite(summary["eval"]["eval_loss"])

    model = VanillaTransformerForConditionalGeneration.from_pretrained(out)
    tokenizer = AutoTokenizer.from_pretrained(out)
    assert (model.config.d_model, model.config.encoder_layers, model.config.decoder_ffn_dim) == (32, 1, 64)
    assert model.config.vocab_size == len(tokenizer) <= 400
    (translation,) = translate(model, tokenizer, ["Good morning."], num_beams=2, max_new_tokens=5)
    assert isinstance(translation, str)


def test_the_example_script_takes_transformers_option_names_and_still_the_old_spellings(capsys):
    spec = importlib.util.spec_from_file_location("finetune_example", ROOT / "examples" / "finetune_seq2seq_trainer.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)  # parses only: nothing trains

    new = example.parse_args(["--source_lang", "fr", "--max-train-samples", "7", "--label_smoothing_factor", "0.2"])
    assert (new.source_lang, new.max_train_samples, new.label_smoothing_factor) == ("fr", 7, 0.2)
    assert capsys.readouterr().err == ""  # either separator, no notice

    old = example.parse_args(
        ["--src-lang", "fr", "--max-train-pairs", "7", "--label-smoothing", "0.2", "--no-progress"]
    )
    assert (old.source_lang, old.max_train_samples, old.label_smoothing_factor) == ("fr", 7, 0.2) and old.disable_tqdm
    assert old.target_lang == "de" and old.max_eval_samples == 200  # the rest keep their defaults
    err = capsys.readouterr().err
    assert (
        "finetune_seq2seq_trainer.py: --src-lang is an old spelling of --source_lang; it still works, but use "
        "--source_lang."
    ) in err.splitlines()
    assert "--max-train-pairs is an old spelling of --max_train_samples" in err and len(err.splitlines()) == 4
