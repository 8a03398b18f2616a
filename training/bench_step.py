"""Times one training step of the bundled model's recipe, by variant (needs CUDA for the numbers).

    python -m training.bench_step --data .train-data --model-dir models/docqa-tiny --out bench-step/

Batches are drawn beforehand by the training's own sampler (last curriculum stage) and moved to
the GPU, so the timing is the step alone: forward, backward, clipping, AdamW. Variants: the layer
halves eager or compiled (engine.model.compiled_layers), each with SDPA free to pick its kernel or held
to one (`efficient`, `cudnn`, `flash`, `math`). Prints and writes `bench_step.json` (median, mean
and worst ms a step, training tokens/s at the median) and, per variant, a kernel table of one
profiled step (`<variant>.txt`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import statistics
import time
from pathlib import Path

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.profiler import ProfilerActivity, profile

from engine.model.transformer import DiffusionLM
from engine.model.weights import load_model, read_model_config
from training.tasks import NIAH_VARIANT_WEIGHTS, TASK_WEIGHTS, collate
from training.train import (
    CHUNK_SIZE,
    CURRICULUM,
    SamplerOptions,
    diffusion_loss,
    make_layout,
    task_sampler,
    training_runner,
)

KERNELS = {"efficient": SDPBackend.EFFICIENT_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
           "flash": SDPBackend.FLASH_ATTENTION, "math": SDPBackend.MATH}


def draw_batches(data: Path, model_dir: Path, cfg, n: int, batch_size: int, seed: int) -> list[dict]:
    """n batches of the last curriculum stage, as the training's workers make them."""
    layout = make_layout(model_dir, cfg)
    sampler = task_sampler(data / "corpus.pt", model_dir, layout, seed,
                           SamplerOptions(task_weights=dict(TASK_WEIGHTS),
                                          niah_variant_weights=dict(NIAH_VARIANT_WEIGHTS)))
    rng = random.Random(seed)
    ks = CURRICULUM[-1][1]
    return [collate([sampler.sample(rng.choice(ks)) for _ in range(batch_size)], layout, CHUNK_SIZE,
                    question_loss_share=0.3, rng=rng) for _ in range(n)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", type=Path, default=Path(".train-data"))
    ap.add_argument("--model-dir", type=Path, default=Path("models/docqa-tiny"))
    ap.add_argument("--batch-size", type=int, default=96)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=8)
    ap.add_argument("--variants", nargs="+", default=["eager", "compiled", "compiled+efficient", "compiled+cudnn"],
                    help="eager|compiled, optionally +efficient|+cudnn|+flash|+math (the SDPA kernel)")
    ap.add_argument("--out", type=Path, default=Path("bench-step"))
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    cfg = read_model_config(args.model_dir)
    start = load_model(args.model_dir, device=device, dtype=torch.float32).state_dict()
    t = time.perf_counter()
    batches = [{k: v.to(device) for k, v in b.items()}
               for b in draw_batches(args.data, args.model_dir, cfg, args.warmup + args.steps, args.batch_size, 0)]
    print(f"{len(batches)} batches drawn in {time.perf_counter() - t:.1f} s; tokens a batch "
          f"{batches[0]['ids'].numel()}", flush=True)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    results = {}
    for variant in args.variants:
        layers, _, kernel = variant.partition("+")
        model = DiffusionLM(cfg).to(device)
        model.load_state_dict(start)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=device.type == "cuda")
        runner = training_runner(model, compile_layers=layers == "compiled")
        gen = torch.Generator(device=device).manual_seed(0)

        def step(batch, model=model, opt=opt, runner=runner, gen=gen):
            loss, _ = diffusion_loss(runner, batch, gen)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            return loss

        try:
            with sdpa_kernel(KERNELS[kernel]) if kernel else contextlib.nullcontext():
                t = time.perf_counter()
                for batch in batches[:args.warmup]:
                    step(batch)
                sync()
                warm_s = time.perf_counter() - t
                # Each step timed on its own: a late recompilation (a new shape) shows as an
                # outlier, which the median leaves out and the mean does not.
                times = []
                for batch in batches[args.warmup:]:
                    t = time.perf_counter()
                    loss = step(batch)
                    sync()
                    times.append(1000 * (time.perf_counter() - t))
                ms = statistics.median(times)
                with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                    step(batches[-1])
                    sync()
        except Exception as e:  # a kernel that does not support this mask or shape: report, go on
            results[variant] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"}
            print(variant, results[variant], flush=True)
            continue
        tokens = sum(b["ids"].numel() for b in batches[args.warmup:]) / args.steps
        results[variant] = {"ms_per_step": ms, "ms_per_step_mean": statistics.mean(times),
                            "ms_per_step_max": max(times), "tokens_per_s": tokens / ms * 1000, "warmup_s": warm_s,
                            "final_loss": loss.item()}
        print(variant, results[variant], flush=True)
        (args.out / f"{variant.replace('+', '_')}.txt").write_text(
            prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=30))
    (args.out / "bench_step.json").write_text(json.dumps(
        {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu", "torch": torch.__version__,
         "batch_size": args.batch_size, "steps": args.steps, "results": results}, indent=1))


if __name__ == "__main__":
    main()
