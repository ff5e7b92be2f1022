"""``python -m mini_vllm serve [CHECKPOINT] ...`` (like ``vllm serve``) and
``python -m mini_vllm generate CHECKPOINT PROMPT... [--max-tokens N]`` (greedy, offline)."""

import sys

USAGE = (
    "usage: python -m mini_vllm serve [CHECKPOINT] [--host HOST] [--port PORT] [--api-key KEY]\n"
    "       python -m mini_vllm generate CHECKPOINT PROMPT [PROMPT ...] [--max-tokens N]"
)


def generate(argv: list[str]) -> int:
    """Greedy continuations of each prompt, batched through one ``LLMEngine``."""
    import argparse

    from . import LLMEngine, SamplingParams

    parser = argparse.ArgumentParser(prog="python -m mini_vllm generate")
    parser.add_argument("checkpoint")
    parser.add_argument("prompts", nargs="+")
    parser.add_argument("--max-tokens", type=int, default=48)
    args = parser.parse_args(argv)
    engine = LLMEngine(model=args.checkpoint)
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0)
    for out in engine.generate(args.prompts, params):
        print(f"{out.prompt} → {out.text}".replace("\n", "⏎"))
    return 0


def main(argv: list[str]) -> int:
    if argv and argv[0] == "generate":
        return generate(argv[1:])
    if not argv or argv[0] != "serve":
        print(USAGE, file=sys.stderr)
        return 2
    from .entrypoints.api_server import main as serve

    return serve(argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
