"""Lab 13-03 on a GPU box: a real vision-language model in vLLM 0.22.1, and the numbers behind it.

Three requests share one prompt: two carry the same 448 x 336 image (a seeded gradient, so no
download beyond the model), the third the same image with one pixel changed. The script prints:

* the placeholder count: image-pad tokens in each request's expanded prompt (Qwen2-VL turns a
  448 x 336 image into 16 x 12 = 192 tokens: 14-pixel patches, merged 2 x 2, so 28 pixels each);
* the mm encoder budget the engine derived (``compute_mm_encoder_budget``): per-step encoder
  compute, in embeddings, and the encoder cache's size;
* encoder cache usage after the run: entries, their sizes, free and freeable slots, against this
  lab's prediction (``same_hash`` on the three arrays: two distinct images, so two entries);
* the generated text.

Needs a CUDA GPU, ``pip install vllm==0.22.1`` and the weights: ``hf download Qwen/Qwen2-VL-2B-Instruct``.

    python phase-13-multimodal-models/labs/lab-03-run-a-vlm/run.py
    python phase-13-multimodal-models/labs/lab-03-run-a-vlm/run.py --impl starter   # your predictions
"""

from __future__ import annotations

import argparse
import os

PROMPT = ("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"
          "<|vision_start|><|image_pad|><|vision_end|>Describe this image in one sentence.<|im_end|>\n"
          "<|im_start|>assistant\n")


def gradient_image(width: int, height: int):
    import numpy as np

    y, x = np.mgrid[0:height, 0:width]
    rgb = np.stack([x * 255 // max(width - 1, 1), y * 255 // max(height - 1, 1), (x + y) % 256], axis=-1)
    return rgb.astype(np.uint8)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="Qwen/Qwen2-VL-2B-Instruct")
    ap.add_argument("--impl", default=None, help="solution (default) or starter: whose predictions to print")
    ap.add_argument("--width", type=int, default=448)
    ap.add_argument("--height", type=int, default=336)
    ap.add_argument("--max-model-len", type=int, default=4096)
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.6)
    args = ap.parse_args()

    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")   # engine core in this process: its scheduler is readable
    import torch
    from PIL import Image
    from vllm import LLM, SamplingParams

    from course.runtime.bench import this_lab

    if not torch.cuda.is_available():
        raise SystemExit("run.py needs a CUDA GPU; the CPU path of this lab is solution.py / test_lab.py")
    lab = this_lab(__file__, args.impl)

    pixels = gradient_image(args.width, args.height)
    changed = pixels.copy()
    changed[0, 0, 0] ^= 1
    arrays = [pixels, pixels.copy(), changed]
    distinct: list = []
    for a in arrays:
        if not any(lab.same_hash(a, d) for d in distinct):
            distinct.append(a)

    llm = LLM(model=args.model, max_model_len=args.max_model_len, gpu_memory_utilization=args.gpu_memory_utilization,
              limit_mm_per_prompt={"image": 1}, seed=0)
    core = llm.llm_engine.engine_core.engine_core
    sched = core.scheduler
    print(f"model: {args.model}; image {args.width} x {args.height}")
    print(f"mm encoder budget: {sched.max_num_encoder_input_tokens} embeddings per step; "
          f"encoder cache size: {sched.encoder_cache_manager.cache_size} embeddings "
          f"(max_num_batched_tokens {sched.scheduler_config.max_num_batched_tokens})")

    requests = [{"prompt": PROMPT, "multi_modal_data": {"image": Image.fromarray(a)}} for a in arrays]
    outputs = llm.generate(requests, SamplingParams(max_tokens=24, temperature=0.0), use_tqdm=False)

    pad_id = llm.get_tokenizer().convert_tokens_to_ids("<|image_pad|>")
    print("\nper request: prompt tokens, image placeholders, output")
    for name, out in zip(["image", "same image", "one pixel changed"], outputs):
        ids = out.prompt_token_ids
        print(f"  {name:<18} {len(ids):5d} tokens, {sum(1 for t in ids if t == pad_id):4d} placeholders: "
              f"{out.outputs[0].text!r}")
    print(f"  placeholders expected for a size that is a multiple of 28 within max_pixels: "
          f"(H / 28) x (W / 28) = {(args.height // 28) * (args.width // 28)}")

    enc = sched.encoder_cache_manager
    sizes = {h: n for h, n in enc.freeable.items()}
    print(f"\nencoder cache after the run: {len(enc.cached)} entries (predicted: {len(distinct)} distinct images)")
    for h in enc.cached:
        print(f"  {h[:16]}…  {sizes.get(h, '?')} embeddings, referenced by {len(enc.cached[h])} running requests")
    print(f"  free slots {enc.num_free_slots} of {enc.cache_size}; freeable {enc.num_freeable_slots} "
          "(finished requests leave entries cached until space is needed)")


if __name__ == "__main__":
    main()
