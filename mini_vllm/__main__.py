"""``python -m mini_vllm serve [CHECKPOINT] [--host 127.0.0.1] [--port 8000]``, like ``vllm serve``."""

import sys


def main(argv: list[str]) -> int:
    if not argv or argv[0] != "serve":
        print(
            "usage: python -m mini_vllm serve [CHECKPOINT] [--host HOST] [--port PORT] [--api-key KEY]",
            file=sys.stderr,
        )
        return 2
    from .entrypoints.api_server import main as serve

    return serve(argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
