"""The front door in numbers: a rendered chat prompt, a load burst and disconnects on mini's server.

Starts mini's OpenAI server on a free loopback port (``mini_vllm.testing.live_server``), then:
renders one chat request through the toy template; sends 64 concurrent streaming completions with
the official ``openai`` client; hangs up on 8 long streams mid-way; prints counts only (no timings:
they vary by machine).
Run: python phase-16-serving-apis-and-parsers/figures/front_door.py
"""

from __future__ import annotations

import asyncio
import json
import socket

import openai

from mini_vllm.testing.live_server import LiveServer

CLIENTS, HANGUPS, MAX_TOKENS = 64, 8, 16


async def burst(base_url: str) -> tuple[list[str], int]:
    client = openai.AsyncOpenAI(base_url=base_url + "/v1", api_key="-", timeout=60, max_retries=0)

    async def one(i: int) -> tuple[str, int]:
        s = await client.completions.create(model="mini-toy", prompt=f"user {i}: hello", max_tokens=MAX_TOKENS,
                                            stream=True, seed=i, extra_body={"ignore_eos": True},
                                            stream_options={"include_usage": True})
        chunks = [c async for c in s]
        finish = next(c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason)
        return finish, chunks[-1].usage.completion_tokens

    try:
        results = await asyncio.gather(*(one(i) for i in range(CLIENTS)))
    finally:
        await client.close()
    return [f for f, _ in results], sum(n for _, n in results)


def hang_up(port: int) -> None:
    body = json.dumps({"prompt": "long", "max_tokens": 2000, "stream": True, "ignore_eos": True}).encode()
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        got = b""
        while got.count(b"data: ") < 3:
            got += sock.recv(4096)


def main() -> None:
    server = LiveServer(num_gpu_blocks=256, block_size=16, max_num_seqs=64)
    try:
        prompt = server.model.render_chat([{"role": "user", "content": "Weather in Paris? 𝄞"}], None)
        print(f"chat template: {prompt!r}")
        print(f"  {len(prompt)} characters -> {len(server.model.encode(prompt))} byte tokens (𝄞 is 4)")
        free = server.num_free_blocks()
        finishes, tokens = asyncio.run(burst(server.base_url))
        idle = server.wait_idle()
        print(f"\n{CLIENTS} concurrent streaming clients, max_tokens={MAX_TOKENS}:")
        print(f"  finished {len(finishes)}, finish_reason {sorted(set(finishes))}, completion tokens {tokens}")
        print(f"  engine idle afterwards: {idle}; free blocks {server.num_free_blocks()} (before: {free})")
        for _ in range(HANGUPS):
            hang_up(server.port)
        idle = server.wait_idle()
        print(f"\n{HANGUPS} clients hang up after 3 events of a 2000-token stream:")
        print(f"  engine idle afterwards: {idle}; free blocks {server.num_free_blocks()} (before: {free})")
    finally:
        server.stop()


if __name__ == "__main__":
    main()
