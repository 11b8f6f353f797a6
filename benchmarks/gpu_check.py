"""The package on one GPU, in one short run (at most ~8 minutes): what cannot be checked on a CPU.

    bash scripts/gpu_check.sh              # on a machine with a CUDA GPU; writes benchmarks/results/gpu-check.json
    bash scripts/gpu_check.sh --dry-run    # every step on the CPU at tiny sizes (the test suite runs this)

Steps, each with its own time limit; a failing step is recorded and the next one runs:

1. ``tests`` – the tests marked ``gpu`` (tests/test_gpu.py): sdpa, SDPA's flash kernel and flex attention
   against eager (outputs and gradients), a bf16 autocast step against fp32, generate()'s tokens on the GPU
   against the CPU's, and no decoding or (non-logging) training step that waits for the GPU
   (``torch.cuda.set_sync_debug_mode("error")``).
2. ``throughput`` – a training step of the base preset (d_model 512, 6+6 layers, 37k vocabulary) in bf16
   autocast, ours and MarianMTModel with the same sizes on the same batches: target tokens/s and MFU, model
   FLOPs (benchmarks/speed.py's count) against the GPU's dense bf16 peak (the datasheet's, and a measured
   8192³ bf16 matmul's).
3. ``main_job`` – the README's main job (configs/tatoeba_en_de_small.yaml) for 3 minutes through
   ``accelerate launch`` on one GPU, with its sacreBLEU on the bundled test split.
4. ``ctranslate2`` – that model exported to CTranslate2 and run on the GPU, against generate() on the GPU:
   the share of identical outputs and the speed of each (beam 4, batches of 32).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
import traceback
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

#: NVIDIA's datasheet figures, dense bf16 tensor-core FLOP/s (without sparsity), by the name torch reports.
DATASHEET_BF16 = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12, "A10": 125e12, "L4": 121e12}


def _step(results: dict, name: str, function, *args) -> None:
    start = time.monotonic()
    try:
        results[name] = {"ok": True, **function(*args)}
    except Exception as error:  # recorded, and the next step runs
        results[name] = {
            "ok": False,
            "error": f"{type(error).__name__}: {error}",
            "traceback": traceback.format_exc()[-3000:],
        }
    results[name]["seconds"] = round(time.monotonic() - start, 1)
    print(
        f"[gpu_check] {name}: {'ok' if results[name]['ok'] else 'FAILED ' + results[name]['error']} "
        f"({results[name]['seconds']} s)",
        flush=True,
    )


def run_tests(dry_run: bool, limit: int) -> dict:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    if dry_run:
        env["VANILLA_TRANSFORMER_GPU_CHECK"] = "cpu"
    command = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "-m",
        "gpu",
        str(ROOT / "tests" / "test_gpu.py"),
        "-rA",
        "--timeout",
        str(limit),
    ]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=limit + 60)
    lines = [line for line in done.stdout.splitlines() if line.startswith(("PASSED", "FAILED", "SKIPPED", "ERROR"))]
    if done.returncode not in (0,):
        raise AssertionError(f"pytest exited with {done.returncode}:\n" + done.stdout[-4000:] + done.stderr[-2000:])
    return {"outcomes": lines, "summary": done.stdout.strip().splitlines()[-1]}


def _timed(device: torch.device, function, warmup: int, repeats: int) -> float:
    for _ in range(warmup):
        function()
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(repeats):
        function()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - start) / repeats


def throughput(dry_run: bool) -> dict:
    import speed  # benchmarks/speed.py: the same two models and FLOP count as the CPU benchmark

    device = torch.device("cpu" if dry_run else "cuda")
    size = speed.SIZES["smoke" if dry_run else "base"]
    n, src_len, tgt_len = (4, 8, 9) if dry_run else (256, 64, 66)
    data = speed.batch(size, n, src_len, tgt_len)
    del data["attention_mask"]  # nothing is padded: no mask for either model (sdpa may use its flash kernel)
    data = {k: v.to(device) for k, v in data.items()}
    rows = {}
    for kind in ("ours", "marian"):
        from transformers.trainer_pt_utils import LabelSmoother

        model = speed.build(kind, size).to(device).train()
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9, fused=True)
        smoother = LabelSmoother(epsilon=0.1)
        workspace = {}  # the loss's logits kept from step to step, as the training loop keeps them

        def step(workspace=workspace, model=model, optimizer=optimizer):
            with torch.autocast(device.type, dtype=torch.bfloat16):
                if kind == "ours":
                    loss = model(**data, smoothing=0.1, skip_logits=True, loss_workspace=workspace).loss
                else:
                    out = model(
                        input_ids=data["input_ids"],
                        decoder_input_ids=model.prepare_decoder_input_ids_from_labels(data["labels"]),
                    )
                    loss = smoother(out, data["labels"], shift_labels=False)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

        seconds = _timed(device, step, warmup=1 if dry_run else 3, repeats=1 if dry_run else 10)
        flops = speed.model_flops(size, n, src_len, tgt_len)
        rows[kind] = {
            "step_ms": seconds * 1e3,
            "target_tokens_per_s": n * tgt_len / seconds,
            "model_tflops_per_s": flops / seconds / 1e12,
        }
        del model, optimizer
    result = {
        "size": size,
        "batch": {"sentences": n, "source_tokens": src_len, "target_tokens": tgt_len},
        "precision": "bf16 autocast",
        "rows": rows,
        "ours_vs_marian": rows["ours"]["target_tokens_per_s"] / rows["marian"]["target_tokens_per_s"],
    }
    if device.type == "cuda":
        name = torch.cuda.get_device_name()
        datasheet = next((v for k, v in DATASHEET_BF16.items() if k in name), None)
        a = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
        matmul = _timed(device, lambda: a @ a, warmup=3, repeats=10)
        result["measured_bf16_matmul_tflops"] = 2 * 8192**3 / matmul / 1e12
        for kind, row in rows.items():
            row["mfu_vs_measured_matmul"] = row["model_tflops_per_s"] / result["measured_bf16_matmul_tflops"]
            if datasheet:
                row["mfu_vs_datasheet"] = row["model_tflops_per_s"] * 1e12 / datasheet
        result["datasheet_bf16_tflops"] = datasheet / 1e12 if datasheet else None
    return result


def main_job(dry_run: bool, workdir: Path, limit: int) -> dict:
    output = workdir / "main-job"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    train = [
        "train",
        "--config",
        str(ROOT / "configs" / "tatoeba_en_de_small.yaml"),
        "--output_dir",
        str(output),
        "--disable_tqdm",
    ]
    if dry_run:  # a few hundred pairs of the bundled corpus, a tiny model, 2 steps
        import gzip

        data = workdir / "corpus"
        data.mkdir(exist_ok=True)
        for split, n in {"train": 300, "valid": 20, "test": 10}.items():
            for lang in ("en", "de"):
                with gzip.open(ROOT / "data" / "tatoeba_en_de" / f"{split}.{lang}.gz", "rt", encoding="utf-8") as f:
                    (data / f"{split}.{lang}").write_text(
                        "".join(line for _, line in zip(range(n), f)), encoding="utf-8"
                    )
        command = [
            sys.executable,
            "-m",
            "vanilla_transformer",
            *train,
            "--use_cpu",
            "--max-steps",
            "2",
            "--max-minutes",
            "1",
            "--dataset_name",
            str(data),
            "--vocab-size",
            "300",
            "--config_overrides",
            json.dumps(
                {
                    "d_model": 32,
                    "encoder_layers": 1,
                    "decoder_layers": 1,
                    "encoder_attention_heads": 2,
                    "decoder_attention_heads": 2,
                    "encoder_ffn_dim": 64,
                    "decoder_ffn_dim": 64,
                }
            ),
            "--eval-bleu-sentences",
            "2",
        ]
    else:
        command = [
            sys.executable,
            "-m",
            "accelerate.commands.launch",
            "--config_file",
            str(ROOT / "configs" / "accelerate" / "1gpu.yaml"),
            "-m",
            "vanilla_transformer",
            *train,
            "--max-minutes",
            "3",
        ]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=limit)
    if done.returncode:
        raise RuntimeError(f"exit {done.returncode}:\n{done.stderr[-4000:]}")
    summary = json.loads((output / "results.json").read_text())
    keep = ("step", "target_tokens", "loop_seconds", "stop_reason", "valid_loss", "valid_bleu", "test")
    return {
        "command": " ".join(["python" if c == sys.executable else c for c in command]),
        **{k: summary.get(k) for k in keep},
        "model": str(output / "final"),
    }


def ctranslate2_check(dry_run: bool, model_dir: str, workdir: Path) -> dict:
    import gzip

    from vanilla_transformer.deployment import CTranslate2Translator, export_ctranslate2
    from vanilla_transformer.evaluation import translate
    from vanilla_transformer.loading import load_model, load_tokenizer

    device = "cpu" if dry_run else "cuda"
    with gzip.open(ROOT / "data" / "tatoeba_en_de" / "test.en.gz", "rt", encoding="utf-8") as f:
        sources = [line.rstrip("\n") for _, line in zip(range(32 if dry_run else 512), f)]
    model, tokenizer = load_model(model_dir, device=device), load_tokenizer(model_dir)
    start = time.perf_counter()
    ours = translate(model, tokenizer, sources, num_beams=4, batch_size=32)
    ours_seconds = time.perf_counter() - start
    exported = workdir / "ct2"
    export_ctranslate2(
        model_dir, exported, quantization="float32"
    )  # the same arithmetic as generate(): tokens comparable
    engine = CTranslate2Translator(exported, device=device)
    engine.translate(sources[:32], num_beams=4)  # warm-up
    start = time.perf_counter()
    theirs = engine.translate(sources, num_beams=4, batch_size=32)
    engine_seconds = time.perf_counter() - start
    same = sum(a == b for a, b in zip(ours, theirs))
    return {
        "sentences": len(sources),
        "identical_outputs": same,
        "generate_seconds": ours_seconds,
        "ctranslate2_seconds": engine_seconds,
        "ctranslate2_vs_generate": ours_seconds / engine_seconds,
        "ctranslate2_compute_type": "float32",
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="every step on the CPU at tiny sizes")
    parser.add_argument("--results-dir", type=Path, default=ROOT / "benchmarks" / "results")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/vanilla-transformer-gpu-check"))
    args = parser.parse_args(argv)
    if not args.dry_run and not torch.cuda.is_available():
        parser.error("no CUDA GPU here; use --dry-run to run every step on the CPU")
    args.workdir.mkdir(parents=True, exist_ok=True)
    import transformers

    results = {
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
        "dry_run": args.dry_run,
        "environment": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() and not args.dry_run else None,
        },
    }
    _step(results, "tests", run_tests, args.dry_run, 150 if not args.dry_run else 300)
    _step(results, "throughput", throughput, args.dry_run)
    _step(results, "main_job", main_job, args.dry_run, args.workdir, 330 if not args.dry_run else 300)
    if results["main_job"]["ok"]:
        _step(results, "ctranslate2", ctranslate2_check, args.dry_run, results["main_job"]["model"], args.workdir)
    args.results_dir.mkdir(parents=True, exist_ok=True)
    path = args.results_dir / ("gpu-check-dry-run.json" if args.dry_run else "gpu-check.json")
    path.write_text(json.dumps(results, indent=2) + "\n")
    print(f"[gpu_check] wrote {path}")
    return results


if __name__ == "__main__":
    outcome = main()
    sys.exit(
        0 if all(step.get("ok", True) for step in outcome.values() if isinstance(step, dict) and "ok" in step) else 1
    )
